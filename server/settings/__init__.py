"""What a server process is configured with: the settings (one typed model on pydantic-settings:
flags > the config file > the environment > defaults, read in one place, :mod:`.config` and its
:mod:`.sources`; the table of its variables rendered by :mod:`.reference`), the store they name, the
provider backend's and the agents' settings, logging to stderr and the opt-in trace export."""

from __future__ import annotations

__all__ = [
    "agents",
    "config",
    "logs",
    "providers",
    "reference",
    "sources",
    "storage",
    "telemetry",
]

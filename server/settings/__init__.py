"""What a server process is configured with: the settings (one typed model on pydantic-settings:
flags > the config file > the environment > defaults, read in one place, :mod:`.config` and its
:mod:`.sources`; its reference page is rendered by docs/gen_config_reference.py), the store they name, the
provider backend's and the agents' settings, the ``[auth]`` issuer (:mod:`.oauth`), logging to
stderr and the opt-in trace export; and
:mod:`.early`, what stdio's early answers need of them before they are loaded."""

from __future__ import annotations

__all__ = [
    "agents",
    "config",
    "early",
    "logs",
    "oauth",
    "providers",
    "sources",
    "storage",
    "telemetry",
]

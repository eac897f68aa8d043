"""What a server process is configured with: the settings (flags > the config file > the
environment > defaults), the store they name, the provider backend's and the agents' settings, logging
to stderr and the opt-in trace export."""

from __future__ import annotations

__all__ = [
    "agents",
    "config",
    "logs",
    "providers",
    "storage",
    "telemetry",
]

"""The MCP edge and the composition root (:mod:`server.app`): everything that turns the domain
(:mod:`orchestration`) into a server a host talks to; its subpackages are listed in docs/development.md.
"""

from __future__ import annotations

__all__ = [
    "app",
    "cli",
    "identity",
    "mcp",
    "sdk",
    "settings",
    "transports",
    "views",
    "web",
    "wiring",
]

"""The ``construct-mcp`` command line: ``serve``, ``runs ...`` (mirroring the tools), ``migrate``
and ``demo``."""

from __future__ import annotations

__all__ = [
    "budget_flags",
    "demo",
    "fork",
    "live",
    "main",
    "retention_commands",
    "subcommands",
    "usage",
]

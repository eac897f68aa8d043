"""The ``construct-mcp`` command line: ``serve``, ``runs ...`` (mirroring the tools), ``migrate``
and ``demo``."""

from __future__ import annotations

__all__ = [
    "costs",
    "demo",
    "fork",
    "live",
    "main",
    "retention",
]

"""Pages for a person with a browser: ``/runs`` and ``/runs/{run_id}``, and the run panel shown as
an MCP Apps resource."""

from __future__ import annotations

__all__ = [
    "pages",
    "panel",
]

"""``construct-mcp`` with one extra tool, ``bench_echo``, for bench/boundaries.py only (not a test
and not part of the server): the same process, transports and tools as ``construct-mcp serve``,
plus a bare tool that returns 1 KB of text, so that the bench can set ``run_status`` against the
cost of the MCP round trip itself on the same server.

    python bench/_echo_server.py serve [--transport streamable-http --port N]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcp.server.mcpserver.tools import Tool

import server.app as app_module
from orchestration.core import Limits
from server.cli.main import run
from server.mcp.publishing import build_tools

_LIMITS = Limits()
ECHO = ("0123456789abcdef" * 64)[:1024]  # 1 KB


async def bench_echo(run_id: str) -> str:
    """Return 1 KB of text (bench only)."""
    return ECHO


def _tools_with_echo(limits: Limits = _LIMITS) -> list[Tool]:
    return [*build_tools(limits), Tool.from_function(bench_echo, title="Echo (bench only)")]


if __name__ == "__main__":
    app_module.build_tools = _tools_with_echo  # type: ignore[attr-defined]
    raise SystemExit(run(sys.argv[1:]))

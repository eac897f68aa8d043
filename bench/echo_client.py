"""How a bench talks to ``bench/_echo_server.py`` (``construct-mcp`` with the bare ``bench_echo``
tool): the command that starts it, the environment it gets, and an MCP client over stdio."""

from __future__ import annotations

import os
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: the echo server, run by this interpreter from this checkout
COMMAND = [sys.executable, str(REPO / "bench" / "_echo_server.py"), "serve"]


def server_env(home: Path, **settings: str) -> dict[str, str]:
    """The server's environment: this one, a fresh ``CONSTRUCT_HOME``, warnings only, this
    checkout's code, and ``settings`` (``CONSTRUCT_...`` variables) on top."""
    return {
        **os.environ,
        "CONSTRUCT_HOME": str(home),
        "CONSTRUCT_LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(REPO),
        **settings,
    }


async def stdio_client(stack: AsyncExitStack, home: Path, env: dict[str, str]) -> Any:
    """An initialized MCP client of an echo server started over stdio with ``env``, its stderr in
    ``home/server.log``; both closed with ``stack``."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client as over_stdio

    errlog = stack.enter_context((home / "server.log").open("w"))
    params = StdioServerParameters(command=COMMAND[0], args=COMMAND[1:], env=env, cwd=str(REPO))
    return await stack.enter_async_context(Client(over_stdio(params, errlog=errlog)))

"""Real server processes and the official MCP client, for the acceptance tests.

Servers run as ``python -m server serve`` subprocesses with their own ``CONSTRUCT_HOME`` (the
filesystem store) and their stderr in a log file next to it, so a failing test can show the
server's log. :class:`SharedClient` lets a whole module share one server process: the client lives
in a background task that owns its cancel scopes (pytest-asyncio runs a fixture's setup and teardown
in different tasks, which anyio scopes do not allow), and the tests call it from their own tasks.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, TextContent

REPO = Path(__file__).resolve().parents[2]

#: Start a real server: the same entry point as ``construct-mcp``.
SERVER_COMMAND = [sys.executable, "-m", "server"]


def server_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a server process: its home, its pid file, fast polling, plus ``extra``."""
    env = {
        "CONSTRUCT_HOME": str(home),
        "CONSTRUCT_PID_FILE": str(home / "server.pid"),
        "CONSTRUCT_POLL_SECONDS": "0.2",
        "CONSTRUCT_LOG_LEVEL": "INFO",
        # The child must import this checkout, whatever the working directory.
        "PYTHONPATH": str(REPO),
    }
    env.update(extra)
    return env


def stdio_params(env: Mapping[str, str], *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=SERVER_COMMAND[0], args=[*SERVER_COMMAND[1:], "serve", *args], env=dict(env), cwd=str(REPO)
    )


@asynccontextmanager
async def stdio_client_for(
    env: Mapping[str, str], log_path: Path, *, mode: str = "auto", **client_kwargs: Any
) -> AsyncIterator[Client]:
    """A server subprocess over stdio and the official client connected to it."""
    params = stdio_params(env)
    with log_path.open("a", encoding="utf-8") as errlog:
        async with Client(
            stdio_client(params, errlog=errlog), mode=mode, read_timeout_seconds=60, **client_kwargs
        ) as client:
            yield client


@dataclass
class SharedClient:
    """A client whose connection is owned by a background task (see the module docstring)."""

    env: dict[str, str]
    log_path: Path
    client: Client | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> Client:
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()

        async def own() -> None:
            try:
                async with stdio_client_for(self.env, self.log_path) as client:
                    ready.set_result(client)
                    await self._stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                raise

        self._task = asyncio.create_task(own())
        self.client = await asyncio.wait_for(ready, 60)
        return self.client

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, 30)


class ToolCaller(Protocol):
    """What :func:`call` needs of a client: ``mcp.Client``, or a bench's thin client."""

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> CallToolResult: ...


def text_of(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent), block
    return block.text


async def call(client: ToolCaller, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool that must succeed; return its structured content."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, f"{tool} failed: {text_of(result)}"
    assert result.structured_content is not None
    # The text content is a JSON copy of the structured content (for hosts that read only text).
    assert json.loads(text_of(result)) == result.structured_content
    return dict(result.structured_content)


async def full_view(client: Client, run_id: str) -> dict[str, Any]:
    """The run's whole record: ``run_status`` with ``detail="full"``. Tool answers are compact
    (server/views/compact.py); the chain, contract, attempts, telemetry, timestamps, ``version``,
    ``started_by`` and each task's ``executor`` are only here."""
    return await call(client, "run_status", run_id=run_id, detail="full")


async def call_error(client: Client, tool: str, **arguments: Any) -> str:
    """Call a tool that must fail; return the error text."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, f"{tool} unexpectedly succeeded: {result.structured_content}"
    return text_of(result)


async def play_host(client: Client, view: dict[str, Any], output_for: Any = None) -> dict[str, Any]:
    """Answer host tasks (with ``[test host output] <task>``) until the run needs something else."""
    while view["next_action"]["kind"] == "run_host_task":
        task_id = view["next_action"]["task_id"]
        output = output_for(task_id) if output_for else f"[test host output] {task_id}"
        view = await call(client, "orchestrate_resume", run_id=view["run_id"], task_id=task_id, output=output)
    return view


async def gated_chain_to_end(client: Client, request: str) -> tuple[dict[str, Any], str]:
    """Run the default chain with a gate before the engineer to its end as a host does (host
    tasks answered, the gate approved); the run's full record and the gate's id."""
    view = await call(client, "orchestrate_start", request=request, approve_before=["engineer"])
    view = await play_host(client, view)
    gate = str(view["next_action"]["gate_id"])
    view = await call(client, "orchestrate_approve", run_id=view["run_id"], decision="approve", gate_id=gate)
    view = await play_host(client, view)
    assert view["status"] == "completed", view
    return await full_view(client, view["run_id"]), gate


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def read_log(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except FileNotFoundError:
        return ""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

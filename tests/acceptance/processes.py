"""Server processes for the reliability tests that need more control than a stdio client gives:
Streamable HTTP servers (several may share one store), and waiting for a process to be gone."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from anyio.abc import Process

from tests.acceptance.harness import SERVER_COMMAND, free_port, pid_alive, read_log


@asynccontextmanager
async def http_server(
    env: dict[str, str], log_path: Path, port: int | None = None
) -> AsyncIterator[tuple[Process, int]]:
    """``construct-mcp serve --transport streamable-http`` on ``port`` (default: a free loopback
    port); yields the process and the port once it accepts connections; kills it on exit if it is
    still running."""
    port = port or free_port()
    with log_path.open("ab") as errlog:
        process = await anyio.open_process(
            [*SERVER_COMMAND, "serve", "--transport", "streamable-http", "--port", str(port)],
            env={**env, "PATH": os.environ.get("PATH", "")},
            stdout=errlog,
            stderr=errlog,
        )
        try:
            with anyio.fail_after(30):
                while True:
                    assert process.returncode is None, read_log(log_path)
                    try:
                        stream = await anyio.connect_tcp("127.0.0.1", port)
                    except OSError:
                        await anyio.sleep(0.05)
                        continue
                    await stream.aclose()
                    break
            yield process, port
        finally:
            if process.returncode is None:
                process.kill()
            await process.aclose()


async def until_gone(pid: int, bound: float = 30.0) -> float:
    """Seconds until process ``pid`` is gone (and reaped)."""
    started = anyio.current_time()
    with anyio.fail_after(bound):
        # Nothing signals another process's exit to us but polling.
        while pid_alive(pid):  # noqa: ASYNC110
            await anyio.sleep(0.02)
    return anyio.current_time() - started

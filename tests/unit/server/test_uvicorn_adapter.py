"""What server/transports/uvicorn_adapter.py relies on in uvicorn: ``serve`` enters the overridable
``capture_signals``, whose handler is ``handle_exit(sig, frame)``, and a SIGTERM then ends ``serve``
without killing the process (uvicorn's own would re-raise it). Fails when an upgrade changes one."""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import uvicorn

from server.transports.uvicorn_adapter import HANDLED_SIGNALS, GracefulServer


def test_serve_enters_the_overridable_signal_capture() -> None:
    assert "with self.capture_signals():" in inspect.getsource(uvicorn.Server.serve)
    handle_exit: Callable[..., Any] | None = uvicorn.Server.handle_exit
    if handle_exit.__module__ != "uvicorn.server":
        # sse_starlette (behind the SDK's SSE transport) wraps it when imported, and calls uvicorn's.
        from sse_starlette.sse import AppStatus

        handle_exit = AppStatus.original_handler
    assert handle_exit is not None and handle_exit.__module__ == "uvicorn.server"
    assert list(inspect.signature(handle_exit).parameters) == ["self", "sig", "frame"]
    server = uvicorn.Server(uvicorn.Config(app="server.app:nothing", log_config=None))
    assert server.should_exit is False
    assert set(HANDLED_SIGNALS) <= set(uvicorn.server.HANDLED_SIGNALS)
    assert GracefulServer.capture_signals is not uvicorn.Server.capture_signals


SCRIPT = textwrap.dedent(
    """
    import asyncio, os, signal
    import uvicorn
    from server.transports.uvicorn_adapter import GracefulServer

    async def app(scope, receive, send):
        pass

    called = []

    async def main():
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="off")
        server = GracefulServer(config, on_exit=lambda: called.append("on_exit"))
        async def stop():
            while not server.started:
                await asyncio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)
        stopping = asyncio.create_task(stop())
        await server.serve()
        await stopping

    asyncio.run(main())
    print(called, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "survived")
    """
)


def test_a_sigterm_ends_serve_and_the_process_exits_normally() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["['on_exit']", "True", "survived"], done.stdout
    assert done.returncode != -signal.SIGTERM

"""The stdio transport, with SIGTERM handled as the end of stdin.

An MCP host stops a stdio server by closing its stdin, and sends SIGTERM when the server does not
exit. Both must lead to the same orderly shutdown: the SDK's transport ends at the end of its input,
then the server's lifespan stops the dispatcher, lets the runs being driven reach their next step
boundary (the write in progress completes), releases their leases, closes the store and removes the
pid file (see :mod:`server.app`).

Cancelling the transport on SIGTERM would not do that: the SDK reads stdin in a worker thread that
cannot be interrupted, so the cancellation would wait for the next line of input, which may never
come. Instead the transport never reads the real stdin: :class:`StdinRelay` puts a pipe in front of
it (fd 0 becomes the pipe's read end) and copies the real input into the pipe from a daemon thread.
SIGTERM closes the pipe: the transport reads what was already copied, then sees the end of its
input. The daemon thread may stay blocked on the real stdin; it does not keep the process alive.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
from typing import Any

import anyio
from mcp.server import MCPServer

log = logging.getLogger("construct.server")

_CHUNK = 65536


class StdinRelay:
    """Copies the process's stdin into a pipe that replaces it as fd 0, until :meth:`end`."""

    def __init__(self, fd: int = 0) -> None:
        # The real input, on a descriptor of its own. Never closed: the copying thread may be
        # blocked reading it, and a closed number could be reused by a file the server opens.
        self._source = os.dup(fd)
        read_end, self._sink = os.pipe()
        # Non-blocking, so that a full pipe never holds the lock that end() needs.
        os.set_blocking(self._sink, False)
        os.dup2(read_end, fd)
        os.close(read_end)
        self._lock = threading.Lock()
        self._ended = False
        self._thread = threading.Thread(target=self._copy, name="construct-stdin-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def ended(self) -> bool:
        return self._ended

    def end(self) -> None:
        """End the transport's input: it still reads what was copied, then end of file.
        Idempotent; safe from any thread."""
        with self._lock:
            if not self._ended:
                self._ended = True
                os.close(self._sink)

    def _copy(self) -> None:
        try:
            while chunk := os.read(self._source, _CHUNK):
                if not self._send(chunk):
                    return
        except OSError as exc:
            log.warning("cannot read stdin: %s", exc, extra={"action": "stdin_failed"})
        finally:
            # The host closed stdin (or it failed): the transport sees the end of its input.
            self.end()

    def _send(self, data: bytes) -> bool:
        view = memoryview(data)
        while view:
            with self._lock:
                # Checked under the lock: after end() the descriptor number may belong to another file.
                if self._ended:
                    return False
                try:
                    written = os.write(self._sink, view)
                except BlockingIOError:
                    written = 0
                    # The pipe is full until the transport reads; end() waits at most this long.
                    select.select([], [self._sink], [], 0.05)
            view = view[written:]
        return True


async def serve_stdio(server: MCPServer[Any]) -> None:
    """Serve ``server`` over stdio until the end of stdin or SIGTERM, whichever comes first; both
    end the same way (see the module docstring)."""
    try:
        relay = StdinRelay()
    except OSError as exc:
        # No usable stdin descriptor: serve as the SDK does; SIGTERM then just ends the process.
        log.warning(
            "stdin cannot be relayed (%s); SIGTERM will not stop the server in order",
            exc,
            extra={"action": "stdin_relay_unavailable"},
        )
        await server.run_stdio_async()
        return
    relay.start()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_end_input_on_sigterm, relay)
            await server.run_stdio_async()
            tg.cancel_scope.cancel()
    finally:
        relay.end()


async def _end_input_on_sigterm(relay: StdinRelay) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            # Handled for as long as the transport runs (the lifespan's shutdown included): a
            # repeated SIGTERM changes nothing, the shutdown is already bounded.
            log.info(
                "SIGTERM: ending the input; the server stops after the work in progress",
                extra={"action": "shutdown_requested"},
            )
            relay.end()

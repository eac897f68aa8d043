"""The stdio transport, with SIGTERM handled as the end of stdin, and each message bounded.

The SDK reads stdin in a thread that cannot be interrupted, with no bound on a line. So the
transport never reads the real stdin: :class:`StdinRelay` copies it into a pipe the SDK reads.
SIGTERM closes the pipe, so the server shuts down as at the end of its input; a line longer than
``max_line_bytes`` is cut, and a request among it answered ``too_large``, so the server holds at
most one bound's worth of a message. The relay first passes on what the early handshake read.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import signal
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp_types as types
from mcp.server import MCPServer
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from server import sdk
from server.sdk import set_request_handler
from server.transports.handshake import EarlyInput, take_early_input
from server.transports.invalid_messages import CUT_MARK, CheckedLines

log = logging.getLogger("construct.server")

_CHUNK = 65536
#: How much of a line's start is kept: to find its request id if the line turns out too long, and
#: the protocol era of the connection in its first request.
_HEAD_BYTES = 8192
#: The method of the stand-in request that answers an over-long message with ``too_large``.
TOO_LARGE_METHOD = "construct/message_too_large"
# The first "id" member, if it comes before "params" (the SDK's clients write jsonrpc, id, method,
# params in that order); a string (escapes allowed) or an integer.
_ID = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.){0,200}"|-?\d{1,19})(?=\s*[,}])')


# A 2026-07-28 request's protocol version, from its ``_meta`` envelope (the stand-in must carry one).
_VERSION = re.compile(rb'"io\.modelcontextprotocol/protocolVersion"\s*:\s*"([0-9A-Za-z.-]{1,40})"')
_INITIALIZE = re.compile(rb'"method"\s*:\s*"initialize"')


def request_id_in(head: bytes) -> str | int | None:
    """The JSON-RPC id named near the start of a message, if one is found before ``params``."""
    match = _ID.search(head)
    if match is None:
        return None
    params = head.find(b'"params"')
    if params != -1 and params < match.start():
        return None
    try:
        value = json.loads(match.group(1))
    except ValueError:
        return None
    return value if isinstance(value, str | int) else None


class StdinRelay:
    """Copies the process's stdin into a pipe that replaces it as fd 0, until :meth:`end`; first
    what ``early`` read from it, if stdin was read before the relay started."""

    def __init__(
        self, fd: int = 0, max_line_bytes: int | None = None, early: EarlyInput | None = None
    ) -> None:
        self._max_line_bytes = max_line_bytes
        self._early = early
        self._line_bytes = 0  # bytes of the current line copied so far
        self._head = b""  # the current line's first bytes
        self._skipping = False  # dropping the rest of an over-long line
        # The connection's era is decided by its first request (see mcp.server.runner); a stand-in
        # request on a 2026-07-28 connection must carry the envelope with this version.
        self._era_known = False
        self._modern_version: str | None = None
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
            if self._early is not None:
                # Read on from where the early reader stopped, once it has stopped.
                read = self._early.wait()
                if read and not self._relay(read):
                    return
            while chunk := os.read(self._source, _CHUNK):
                if not self._relay(chunk):
                    return
        except OSError as exc:
            log.warning("cannot read stdin: %s", exc, extra={"action": "stdin_failed"})
        finally:
            # The host closed stdin (or it failed): the transport sees the end of its input.
            self.end()

    def _relay(self, chunk: bytes) -> bool:
        """Copy ``chunk``, cutting lines over the bound: the part of such a line already copied is
        ended with :data:`~server.transports.invalid_messages.CUT_MARK` and a newline (dropped
        unanswered), the rest is read and dropped unkept, and when the line's start named a request
        id, a stand-in request with that id is passed on, which the server answers ``too_large``."""
        limit = self._max_line_bytes
        if limit is None:
            return self._send(chunk)
        pos = 0
        while pos < len(chunk):
            newline = chunk.find(b"\n", pos)
            end = len(chunk) if newline == -1 else newline
            piece = chunk[pos:end]
            if not self._skipping:
                if len(self._head) < _HEAD_BYTES:
                    self._head += piece[: _HEAD_BYTES - len(self._head)]
                if self._line_bytes + len(piece) > limit:
                    self._skipping = True
                    if not self._send(CUT_MARK.encode() + b"\n" + self._refusal(limit)):
                        return False
                else:
                    self._line_bytes += len(piece)
                    if not self._send(piece + b"\n" if newline != -1 else piece):
                        return False
            if newline == -1:
                break
            if not self._era_known and not self._skipping and self._line_bytes <= _HEAD_BYTES:
                self._learn_era()  # from a whole line only: the envelope may come last
            self._line_bytes, self._head, self._skipping = 0, b"", False
            pos = newline + 1
        return True

    def _learn_era(self) -> None:
        """At the end of a line: if it is the first request, note the connection's protocol era."""
        if request_id_in(self._head) is None:
            return  # not a request (or not all of it is in the head): the era is still open
        self._era_known = True
        version = _VERSION.search(self._head)
        if version is not None and _INITIALIZE.search(self._head) is None:
            self._modern_version = version.group(1).decode()

    def _refusal(self, limit: int) -> bytes:
        """The stand-in for an over-long line: a request with its id, or nothing if it has none."""
        request_id = request_id_in(self._head)
        log.warning(
            "refused a message over %d bytes on stdin (request id %s)",
            limit,
            "none" if request_id is None else "found",
            extra={"action": "message_too_large"},
        )
        if request_id is None:
            return b""
        params: dict[str, Any] = {"limit": limit}
        if self._modern_version is not None:
            # A 2026-07-28 connection answers only requests that carry the envelope.
            params["_meta"] = {
                "io.modelcontextprotocol/protocolVersion": self._modern_version,
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        message = {"jsonrpc": "2.0", "id": request_id, "method": TOO_LARGE_METHOD, "params": params}
        return json.dumps(message).encode() + b"\n"

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


class _TooLargeParams(types.RequestParams):
    limit: int = 0


async def _too_large(ctx: ServerRequestContext[Any, Any], params: _TooLargeParams) -> types.EmptyResult:
    raise MCPError(
        code=types.INVALID_REQUEST,
        message=(
            f"too_large: the message is over {params.limit} bytes, the most a message within this "
            "server's size limits can take (CONSTRUCT_MAX_OUTPUT_CHARS, CONSTRUCT_MAX_REQUEST_CHARS); "
            "it was not read"
        ),
    )


async def serve_stdio(server: MCPServer[Any], max_line_bytes: int | None = None) -> None:
    """Serve ``server`` over stdio until the end of stdin or SIGTERM, whichever comes first; both
    end the same way (see the module docstring). A line over ``max_line_bytes`` is refused."""
    set_request_handler(server, TOO_LARGE_METHOD, _TooLargeParams, _too_large)
    early = take_early_input()
    answered = (lambda: tuple(early.answered)) if early is not None else None
    try:
        relay = StdinRelay(max_line_bytes=max_line_bytes, early=early)
    except OSError as exc:
        # No usable stdin descriptor: serve as the SDK does; SIGTERM then just ends the process.
        log.warning(
            "stdin cannot be relayed (%s); SIGTERM will not stop the server in order, and no line "
            "length bound applies",
            exc,
            extra={"action": "stdin_relay_unavailable"},
        )
        if early is None:
            await server.run_stdio_async()
        else:
            await sdk.run_stdio(server, _after_early(early), lambda _write: None, answered)
        return
    relay.start()
    # An open descriptor (a pipe): nothing here blocks; its lines are read in a worker thread.
    with open(_take_input(), encoding="utf-8", errors="replace") as relayed:  # noqa: ASYNC230
        lines = CheckedLines(anyio.wrap_file(relayed))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_end_input_on_sigterm, relay)
                await sdk.run_stdio(server, lines, lines.answer_on, answered)
                tg.cancel_scope.cancel()
        finally:
            relay.end()


async def _after_early(early: EarlyInput) -> AsyncIterator[str]:
    """The lines ``early`` read, then the rest of stdin (without a relay: unbounded, unchecked)."""
    pending = await anyio.to_thread.run_sync(early.wait)
    with open(os.dup(0), "rb") as rest:  # noqa: ASYNC230
        source = anyio.wrap_file(rest)
        while True:
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield (line + b"\n").decode("utf-8", errors="replace")
            more = await source.readline()
            if not more:
                break
            pending += more
    if pending:
        yield pending.decode("utf-8", errors="replace")


def _take_input(fd: int = 0) -> int:
    """A private descriptor for the relay's output (fd ``fd``), which then reads the null device,
    as the SDK's transport leaves it while it serves: a child process inherits no MCP input."""
    private = os.dup(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return private


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

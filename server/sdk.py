"""The MCP SDK's internals this server relies on, in one place (mcp 2.3); everywhere else it uses the
public API. None of these has a public form in mcp 2.3:

* **Request handlers**: the low-level server's ``add_request_handler``, to add or replace a request
  method (:func:`set_request_handler`).
* **The Streamable HTTP session table**: the session manager's private table and each transport's
  requests in flight, to evict the session idle the longest when full
  (:class:`EvictingSessionManager`, put in the app by :func:`streamable_http_app`).
* **Serving stdio from checked lines**: the SDK's stdio transport fed checked lines
  (:func:`run_stdio`), less its answers to requests answered before it was imported
  (:class:`DropsEarlyAnswers`).
* **The connection behind a session**: the private per-client ``Connection`` behind each
  ``ServerSession`` (:func:`connection_of`, :func:`on_connection_closed`).
* **Arguments validated once**: ``Tool.run`` validates the dict it is given; it is handed what
  :class:`~server.mcp.arguments.StrictTool` validated instead (:func:`validated_once`,
  :func:`validated_before`).

``tests/unit/server/test_sdk_reliance.py`` pins each, and ``pyproject.toml`` bounds ``mcp`` to the
minor version those tests passed with.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

from mcp.server import MCPServer
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.lowlevel.server import RequestHandler
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCResponse, RequestParams
from starlette.applications import Starlette
from starlette.routing import Route

log = logging.getLogger("construct.server")

P = TypeVar("P", bound=RequestParams)


#: the arguments of the tool call in progress that were validated already (that very dict), and
#: what validating them gave (see :func:`validated_once`)
_VALIDATED: ContextVar[tuple[dict[str, Any], dict[str, Any]] | None] = ContextVar(
    "construct_validated_arguments", default=None
)


@contextmanager
def validated_once(arguments: dict[str, Any], validated: dict[str, Any]) -> Iterator[None]:
    """While the block runs (``Tool.run``): ``arguments`` (that very dict) are validated, giving
    ``validated`` (:func:`validated_before` hands it out)."""
    token = _VALIDATED.set((arguments, validated))
    try:
        yield
    finally:
        _VALIDATED.reset(token)


def validated_before(arguments: dict[str, Any]) -> dict[str, Any] | None:
    """What validating ``arguments`` gave, when this very dict was validated already
    (:func:`validated_once`), as a new dict; else None."""
    validated = _VALIDATED.get()
    if validated is None or validated[0] is not arguments:
        return None
    return dict(validated[1])


def set_request_handler(
    server: MCPServer[Any], method: str, params_type: type[P], handler: RequestHandler[Any, P]
) -> None:
    """Answer ``method`` with ``handler`` (its params validated as ``params_type``), replacing the
    SDK's own handler for it if it has one."""
    server._lowlevel_server.add_request_handler(method, params_type, handler)


class EvictingSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager (its cap and idle timeout), except that a new session over the cap
    closes the session idle the longest instead of being refused, when one is idle."""

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
            self._evict_idlest()
        return super()._admit_session(requestor)

    def _evict_idlest(self) -> None:
        idle: list[tuple[float, str, StreamableHTTPServerTransport]] = []
        for session_id, transport in self._server_instances.items():
            scope = transport.idle_scope
            in_flight: int = getattr(transport, "_requests_in_flight", 1)
            if scope is not None and in_flight == 0 and not scope.cancel_called:
                idle.append((scope.deadline, session_id, transport))
        if not idle:
            return
        _, session_id, transport = min(idle)
        # Forgotten now (its id answers 404 from here on); its server task ends when the idle
        # scope is cancelled, and the SDK then terminates the transport.
        self._server_instances.pop(session_id, None)
        self._session_owners.pop(session_id, None)
        assert transport.idle_scope is not None
        transport.idle_scope.cancel()
        log.info(
            "session limit reached: closed the session idle the longest",
            extra={"action": "http_session_evicted"},
        )


def streamable_http_app(
    server: MCPServer[Any],
    *,
    path: str,
    security_settings: TransportSecuritySettings | None,
    max_request_body_size: int,
    session_idle_timeout: float,
    max_sessions: int,
) -> Starlette:
    """``server``'s Streamable HTTP app at ``path`` (and its custom routes), sessions managed by
    :class:`EvictingSessionManager`; without the SDK's auth hooks (the server has its own)."""
    manager = EvictingSessionManager(
        app=server._lowlevel_server,
        security_settings=security_settings,
        max_request_body_size=max_request_body_size,
        session_idle_timeout=session_idle_timeout,
        max_sessions=max_sessions,
    )
    routes = [Route(path, endpoint=StreamableHTTPASGIApp(manager)), *server._custom_starlette_routes]
    return Starlette(routes=routes, lifespan=lambda _app: manager.run())


async def run_stdio(
    server: MCPServer[Any],
    lines: AsyncIterable[str],
    answer_on: Callable[[SendsMessages], None],
    answered: Callable[[], Sequence[AnsweredRequest]] | None = None,
) -> None:
    """Serve ``server`` over stdio as ``run_stdio_async`` does (fd 1 diverted to stderr while it
    serves), reading ``lines`` instead of stdin; ``answer_on`` gets the stream the transport writes
    to stdout from, before the first line is read. ``answered`` says which requests were answered
    before the server started (asked when the first answer is written, by then it is known): the
    server's answers to them are not written."""
    stdin: Any = lines  # the transport only iterates over it
    async with stdio_server(stdin=stdin) as (read_stream, write_stream):
        answer_on(write_stream)
        lowlevel = server._lowlevel_server
        out: Any = write_stream if answered is None else DropsEarlyAnswers(write_stream, answered)
        await lowlevel.run(read_stream, out, lowlevel.create_initialization_options())


class AnsweredRequest(Protocol):
    """A request answered before the server started: its id and the answer's line (no newline)."""

    @property
    def request_id(self) -> str | int: ...

    @property
    def line(self) -> str: ...


class DropsEarlyAnswers:
    """The transport's write stream, less the server's first answer to each request ``answered``
    lists (the client has its answers already). An answer that differs from the one written is
    logged as an error: the early answers (:mod:`server.transports.handshake`) are meant to be the
    same, byte for byte."""

    def __init__(self, inner: Any, answered: Callable[[], Sequence[AnsweredRequest]]) -> None:
        self._inner = inner
        self._answered = answered
        self._pending: dict[str | int, str] | None = None  # request id -> the line written early

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        if isinstance(message, JSONRPCResponse | JSONRPCError):
            if self._pending is None:
                self._pending = {early.request_id: early.line for early in self._answered()}
            early = self._pending.pop(message.id, None) if message.id is not None else None
            if early is not None:
                line = message.model_dump_json(by_alias=True, exclude_unset=True)
                if line != early:
                    log.error(
                        "an early answer differs from the server's: %s instead of %s",
                        early,
                        line,
                        extra={"action": "early_initialize_differs"},
                    )
                return
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> DropsEarlyAnswers:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> bool | None:
        result: bool | None = await self._inner.__aexit__(*exc_info)
        return result


class SendsMessages(Protocol):
    """The transport's write stream: each message sent is written to the client."""

    async def send(self, item: SessionMessage, /) -> None: ...


def connection_of(session: ServerSession) -> object:
    """The SDK's per-client ``Connection`` behind a (per-request) ``ServerSession``: the same object
    for every request of one client. Falls back to the session object itself."""
    connection: object | None = getattr(session, "_connection", None)
    return connection if connection is not None else session


def on_connection_closed(session: ServerSession, callback: Callable[[], None]) -> bool:
    """Call ``callback`` when the client behind ``session`` is gone (the connection's exit stack);
    False when the SDK gives no way to know."""
    exit_stack = getattr(getattr(session, "_connection", None), "exit_stack", None)
    if exit_stack is None:
        return False
    exit_stack.callback(callback)
    return True

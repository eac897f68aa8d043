"""The MCP SDK's internals this server relies on, in one place (mcp 2.3).

Everywhere else the server uses the SDK's public API. What is here has no public form in mcp 2.3:

* **Request handlers.** :class:`~mcp.server.MCPServer` has no way to add a request method or to
  replace one of its own (an :class:`~mcp.server.extension.Extension`'s methods may only add, and
  the extension is advertised to clients); its low-level server has (``add_request_handler``).
  :func:`set_request_handler` reaches it: the handshake-era ``resources/subscribe``, a
  ``resources/list`` that lists the runs, the ``subscriptions/listen`` that knows which runs a stream
  covers, the stdio transport's stand-in for an over-long message.
* **The Streamable HTTP session table.** The SDK's session manager refuses a new session when it
  is full; :class:`EvictingSessionManager` closes the session idle the longest instead, from the
  manager's private table and each transport's count of requests in flight.
  :func:`streamable_http_app` builds the app around it as ``MCPServer.streamable_http_app`` does
  (the server's low-level server, its custom routes), which has no parameter for the manager.
* **Serving stdio from checked lines.** ``MCPServer.run_stdio_async`` is the SDK's stdio
  transport around the low-level server's ``run``; :func:`run_stdio` is the same with the lines the
  transport reads given (:mod:`server.transports.invalid_messages` checks each first) and its write
  stream handed out (to answer a line that never reaches the server); and, when requests were
  answered before the SDK was imported (:mod:`server.transports.handshake`), the SDK's own answers
  to them dropped on their way to stdout (:class:`DropsEarlyAnswers`), as the stdio transport
  writes them (``model_dump_json(by_alias=True, exclude_unset=True)``, to compare).
* **The connection behind a session.** ``ServerRequestContext`` gives handlers a per-request
  ``ServerSession``; the per-client ``Connection`` behind it (to know that two requests come from
  the same client, and to hook the end of that client) is private: :func:`connection_of`,
  :func:`on_connection_closed`.

* **Arguments validated once.** ``Tool.run`` validates the very dict it is given
  (``self.fn_metadata.validate_arguments(arguments)``), with no way to hand it arguments validated
  already. :class:`~server.mcp.arguments.StrictTool` checks a call's arguments before that (its own
  validation, with coded refusals); :func:`validated_once` keeps what it gave for that dict while
  ``Tool.run`` runs, and :func:`validated_before` hands it to the metadata's ``validate_arguments``
  instead of validating the same dict a second time.

``tests/unit/server/test_sdk_reliance.py`` pins each of these (the private names exist with the expected
types, and behave as relied on), so an SDK upgrade that changes one fails there; ``pyproject.toml``
bounds ``mcp`` to the minor version those tests passed with.
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

"""The HTTP transports' ASGI apps, with the limits that keep one client from hurting the others: a
request body bounded while it streams in (:func:`max_message_bytes`: any output within the size
limits fits, whatever its characters; over it, 413 with ``too_large``), at most
``http_max_sessions`` Streamable HTTP sessions (the longest idle one makes room), and DNS-rebinding
protection on every loopback bind. What clients see: docs/hosts.md (Transport limits).
"""

from __future__ import annotations

import logging
from typing import Any

from mcp.server import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import INVALID_REQUEST
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestration.core import Limits
from server import sdk
from server.transports.auth import is_loopback, send_json
from server.transports.invalid_messages import InvalidMessageRefusal

log = logging.getLogger("construct.server")

#: Bytes one character may take in a JSON body (``\\ud83d\\ude00`` for a character outside the BMP).
ESCAPED_BYTES_PER_CHAR = 12
#: Room for the JSON-RPC envelope and the small arguments around the big ones.
MESSAGE_SLACK_BYTES = 1 << 20
#: The path of the Streamable HTTP endpoint.
STREAMABLE_HTTP_PATH = "/mcp"


def max_message_bytes(limits: Limits) -> int:
    """The largest message (HTTP body, stdio line) the size limits can require, JSON-escaped."""
    chars = limits.max_output_chars + limits.max_request_chars + limits.max_comment_chars
    return chars * ESCAPED_BYTES_PER_CHAR + MESSAGE_SLACK_BYTES


def bind_host(host: str) -> str:
    """``host`` as a socket can bind it: an IPv6 address without its URL brackets."""
    host = host.strip()
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def security_settings(host: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection for a loopback ``host`` (IPv4 or IPv6); None beyond loopback."""
    if not is_loopback(host):
        return None
    bound = bind_host(host)
    names = {"127.0.0.1", "localhost", "[::1]", f"[{bound}]" if ":" in bound else bound}
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=sorted(f"{name}:*" for name in names),
        allowed_origins=sorted(f"http://{name}:*" for name in names),
    )


class BodyLimitMiddleware:
    """Refuses an HTTP request whose body is over ``max_bytes``: 413 with a JSON-RPC error whose
    message starts with ``too_large``. Reads the body as it streams in, keeping never more than the
    bound, then hands the app what it read.

    The rest of a body over the bound is read and dropped before the answer, up to ``max_bytes``
    more, so that a client still sending its body can read the error (answering mid-upload closes
    the connection under it); a body larger still is answered at once."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self._app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if await self._refused_as_declared(scope, receive, send):
            return
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self._app(scope, receive, send)
            return
        body = bytearray()
        trailing: list[Message] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                trailing.append(message)
                break
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                if message.get("more_body", False):
                    await self._drain(receive, 2 * self.max_bytes - len(body))
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break
        replay: list[Message] = [{"type": "http.request", "body": bytes(body), "more_body": False}, *trailing]

        async def replayed() -> Message:
            return replay.pop(0) if replay else await receive()

        await self._app(scope, replayed, send)

    async def _refused_as_declared(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Refuse the request if its declared length is over the bound (without reading it when
        that length is over twice the bound); whether it was refused."""
        declared = Headers(scope=scope).get("content-length")
        if declared is None or not declared.isdigit() or int(declared) <= self.max_bytes:
            return False
        if int(declared) <= 2 * self.max_bytes:
            await self._drain(receive, 2 * self.max_bytes)
        await self._refuse(send)
        return True

    async def _drain(self, receive: Receive, budget: int) -> None:
        """Read and drop the rest of the body, while no more than ``budget`` bytes were read."""
        while budget >= 0:
            message = await receive()
            if message["type"] != "http.request":
                return
            budget -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    async def _refuse(self, send: Send) -> None:
        log.warning(
            "refused a request body over %d bytes", self.max_bytes, extra={"action": "body_too_large"}
        )
        await send_json(
            send,
            413,
            {
                "jsonrpc": "2.0",
                "id": None,
                "error": {
                    "code": INVALID_REQUEST,
                    "message": (
                        f"too_large: the request body is over {self.max_bytes} bytes, the most a message "
                        "within this server's size limits can take (CONSTRUCT_MAX_OUTPUT_CHARS, "
                        "CONSTRUCT_MAX_REQUEST_CHARS); send a shorter output or request"
                    ),
                },
            },
            (b"connection", b"close"),
        )


class TypedBodyLimit(BodyLimitMiddleware):
    """The same refusal, in front of an app that bounds its request bodies itself at ``max_bytes``
    and answers a body over it with a bare 413 (the SDK's transports, ``max_request_body_size``).
    The body is not held here, only counted as it reaches the app; the app's 413 for a body over the
    bound is replaced by the typed answer (after reading and dropping the rest, as above). Any other
    answer of the app passes unchanged."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if await self._refused_as_declared(scope, receive, send):
            return
        received = 0
        more = True
        refused = False

        async def counted() -> Message:
            nonlocal received, more
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                more = message.get("more_body", False)
            return message

        async def answered(message: Message) -> None:
            nonlocal refused
            if message["type"] == "http.response.start" and message["status"] == 413:
                refused = received > self.max_bytes  # the app's bound, not another 413 of its own
            if not refused:
                await send(message)

        await self._app(scope, counted, answered)
        if refused:
            if more:
                await self._drain(receive, 2 * self.max_bytes - received)
            await self._refuse(send)


def streamable_http_app(
    server: MCPServer[Any],
    *,
    host: str,
    max_body_bytes: int,
    max_sessions: int,
    idle_seconds: float,
) -> ASGIApp:
    """The Streamable HTTP app at ``/mcp`` (plus the server's custom routes), behind the typed body
    limit. Its sessions are managed by :class:`server.sdk.EvictingSessionManager`; the SDK's own
    auth hooks are not used (see :mod:`server.transports.auth`)."""
    app = sdk.streamable_http_app(
        server,
        path=STREAMABLE_HTTP_PATH,
        security_settings=security_settings(host),
        max_request_body_size=max_body_bytes,
        session_idle_timeout=idle_seconds,
        max_sessions=max_sessions,
    )
    # A message that is no JSON-RPC request is answered before the SDK reads it as a notification.
    return TypedBodyLimit(InvalidMessageRefusal(app, max_body_bytes), max_body_bytes)


def sse_app(server: MCPServer[Any], *, host: str, max_body_bytes: int) -> ASGIApp:
    """The SSE app (``/sse`` and ``/messages/``), behind the typed body limit."""
    app = server.sse_app(
        host=bind_host(host), max_request_body_size=max_body_bytes, transport_security=security_settings(host)
    )
    return TypedBodyLimit(InvalidMessageRefusal(app, max_body_bytes), max_body_bytes)

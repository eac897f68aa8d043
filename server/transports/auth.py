"""Bearer-token protection of the HTTP transports (SSE and Streamable HTTP); stdio needs none.

Every HTTP request carries a configured token or gets ``401`` and reaches no tool; tokens are
compared in constant time and never logged (the access log drops query strings:
:class:`RedactQueryStrings`). Binding beyond loopback without a token is a startup error. These are
shared secrets, not OAuth: the SDK's resource-server support needs an authorization server to point
clients at, which configured tokens do not have.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
from collections.abc import Sequence

from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestration.errors import ConfigError
from server.identity import AUTH_TOKEN_IDENTITY, SCOPE_KEY, Caller, NamedToken, caller_for

#: The smallest token accepted: a shorter one could be guessed.
MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 possibly in brackets) is this machine only."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | Sequence[NamedToken] | None) -> None:
    """Refuse to serve HTTP beyond this machine without a token (a ``ConfigError`` naming the fix).
    ``token``: the configured token, or the configured named tokens."""
    if not token and not is_loopback(host):
        raise ConfigError(
            "command line",
            "--host",
            f"{host} would serve runs to the network without authentication; set CONSTRUCT_AUTH_TOKEN "
            f"(or auth_token in the config file) to a secret of at least {MIN_TOKEN_CHARS} characters "
            "that clients send as 'Authorization: Bearer <token>', or bind 127.0.0.1",
        )


class BearerTokenMiddleware:
    """An ASGI middleware letting through only HTTP requests that carry one of the configured bearer
    tokens. Lifespan events pass untouched.

    ``tokens`` is one token (the identity :data:`~server.identity.AUTH_TOKEN_IDENTITY`, every role)
    or several :class:`~server.identity.NamedToken`. The middleware keeps only the SHA-256 digest of
    each token; a presented token is hashed and compared with *every* digest in constant time
    (:func:`hmac.compare_digest`), so neither the match nor its position shows in the timing. The
    request then carries its verified :class:`~server.identity.Caller` in the ASGI scope
    (:data:`~server.identity.SCOPE_KEY`), for the tools, and as the scope's ``user`` (and
    :func:`mcp.server.auth.middleware.auth_context.get_access_token`'s context) for the MCP SDK,
    which binds each Streamable HTTP session to the identity that opened it."""

    def __init__(self, app: ASGIApp, tokens: str | Sequence[NamedToken]) -> None:
        named = [NamedToken(AUTH_TOKEN_IDENTITY, tokens)] if isinstance(tokens, str) else list(tokens)
        if not named:
            raise ValueError("at least one token is needed")
        self._app = app
        self._digests: list[tuple[bytes, Caller, AuthenticatedUser]] = []
        for entry in named:
            token = entry.token.strip()
            if len(token) < MIN_TOKEN_CHARS:
                raise ValueError(f"the auth token must have at least {MIN_TOKEN_CHARS} characters")
            caller = caller_for(entry)
            # The SDK's user: its access token carries the identity, never the secret.
            user = AuthenticatedUser(
                AccessToken(token="(withheld)", client_id=entry.identity, scopes=sorted(entry.roles))
            )
            self._digests.append((hashlib.sha256(token.encode()).digest(), caller, user))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        found = self._identify(scope)
        if found is None:
            await _unauthorized(send)
            return
        caller, user = found
        scope[SCOPE_KEY], scope["user"] = caller, user
        # Also where the SDK's get_access_token() looks (the SDK carries it to the handlers).
        reset = auth_context_var.set(user)
        try:
            await self._app(scope, receive, send)
        finally:
            auth_context_var.reset(reset)

    def _identify(self, scope: Scope) -> tuple[Caller, AuthenticatedUser] | None:
        values = [value for name, value in scope.get("headers", ()) if name.lower() == b"authorization"]
        if len(values) != 1:
            return None
        # "Bearer" SP token; the scheme is case-insensitive (RFC 9110, 11.1).
        scheme, _, credentials = values[0].strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        presented = hashlib.sha256(credentials.strip()).digest()
        found: tuple[Caller, AuthenticatedUser] | None = None
        for digest, caller, user in self._digests:
            # Every digest is compared, matched or not: the time taken does not depend on which.
            if hmac.compare_digest(presented, digest):
                found = (caller, user)
        return found


class RedactQueryStrings(logging.Filter):
    """Drops the query string from uvicorn's access log lines (``GET /mcp?token=... HTTP/1.1``).

    uvicorn logs ``client, method, path with query, http version, status``; a client may carry a
    token in the query (some hosts cannot set headers), and a log line must never show it. Attached
    to the ``uvicorn.access`` logger by :mod:`server.app`."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?[redacted]", *args[3:])
        return True


async def send_json(send: Send, status: int, payload: object, *headers: tuple[bytes, bytes]) -> None:
    """Answer an ASGI HTTP request with ``payload`` as JSON (used for refusals made before the MCP
    app sees the request: a missing token here, an oversized body in :mod:`server.transports.http`)."""
    body = json.dumps(payload).encode()
    start_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": start_headers})
    await send({"type": "http.response.body", "body": body})


async def _unauthorized(send: Send) -> None:
    await send_json(
        send,
        401,
        {
            "error": "unauthorized",
            "message": (
                "send 'Authorization: Bearer <token>' with the server's CONSTRUCT_AUTH_TOKEN, or the "
                "token of an identity of its [tokens] table"
            ),
        },
        (b"www-authenticate", b'Bearer realm="construct-mcp"'),
    )

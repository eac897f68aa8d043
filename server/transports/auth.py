"""Bearer-token protection of the HTTP transports (SSE and Streamable HTTP); stdio needs none.

Every HTTP request carries a configured token, or an access token of the ``[auth]`` issuer, or gets
``401`` and reaches no tool; configured tokens are compared in constant time, and no token is ever
logged (the access log drops query strings: :class:`RedactQueryStrings`). Binding beyond loopback
without a way to authenticate is a startup error. A configured (static) token is looked for first;
a token that is none of them goes to the issuer's verifier (:mod:`server.transports.resource_server`),
when there is one. The refusals of an issuer's token follow RFC 6750: 401 ``invalid_token``, 403
``insufficient_scope`` for a token that gives no role, each with a ``WWW-Authenticate`` challenge that
names the protected-resource metadata; 503 when the issuer's keys cannot be fetched.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
from collections.abc import Sequence
from typing import Protocol

from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestration.errors import ConfigError
from server.identity import AUTH_TOKEN_IDENTITY, SCOPE_KEY, Caller, NamedToken, caller_for
from server.transports.jwt_adapter import IssuerUnreachable, TokenRefused

log = logging.getLogger("construct.auth")

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


def check_exposure(host: str, token: str | Sequence[NamedToken] | None, *, issuer: bool = False) -> None:
    """Refuse to serve HTTP beyond this machine without a token (a ``ConfigError`` naming the fix).
    ``token``: the configured token, or the configured named tokens; ``issuer``: whether an
    ``[auth]`` issuer's tokens are accepted (then none need be configured)."""
    if not token and not issuer and not is_loopback(host):
        raise ConfigError(
            "command line",
            "--host",
            f"{host} would serve runs to the network without authentication; set CONSTRUCT_AUTH_TOKEN "
            f"(or auth_token in the config file) to a secret of at least {MIN_TOKEN_CHARS} characters "
            "that clients send as 'Authorization: Bearer <token>', or set [auth] issuer (your identity "
            "provider), or bind 127.0.0.1",
        )


class InsufficientScope(Exception):
    """A valid access token that gives none of this server's roles."""


class TokenAuthority(Protocol):
    """Who checks a bearer token that is none of the configured ones: the ``[auth]`` issuer's
    resource server (:class:`server.transports.resource_server.OAuthResource`)."""

    async def identify(self, token: str) -> tuple[Caller, AuthenticatedUser]:
        """The caller; raises TokenRefused, InsufficientScope or IssuerUnreachable."""
        ...

    def challenge(self, error: str | None = None, description: str | None = None) -> bytes:
        """The ``WWW-Authenticate`` value of a refusal."""
        ...


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

    def __init__(
        self, app: ASGIApp, tokens: str | Sequence[NamedToken], authority: TokenAuthority | None = None
    ) -> None:
        named = [NamedToken(AUTH_TOKEN_IDENTITY, tokens)] if isinstance(tokens, str) else list(tokens)
        if not named and authority is None:
            raise ValueError("at least one token, or an issuer, is needed")
        self._app = app
        self._authority = authority
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
        credentials = _credentials(scope)
        found = None if credentials is None else self._identify(credentials)
        if found is None and credentials is not None and self._authority is not None:
            found = await self._ask_authority(self._authority, credentials, send)
            if found is None:
                return  # refused, answered
        if found is None:
            await self._unauthorized(send)
            return
        caller, user = found
        scope[SCOPE_KEY], scope["user"] = caller, user
        # Also where the SDK's get_access_token() looks (the SDK carries it to the handlers).
        reset = auth_context_var.set(user)
        try:
            await self._app(scope, receive, send)
        finally:
            auth_context_var.reset(reset)

    def _identify(self, credentials: bytes) -> tuple[Caller, AuthenticatedUser] | None:
        presented = hashlib.sha256(credentials).digest()
        found: tuple[Caller, AuthenticatedUser] | None = None
        for digest, caller, user in self._digests:
            # Every digest is compared, matched or not: the time taken does not depend on which.
            if hmac.compare_digest(presented, digest):
                found = (caller, user)
        return found

    async def _ask_authority(
        self, authority: TokenAuthority, credentials: bytes, send: Send
    ) -> tuple[Caller, AuthenticatedUser] | None:
        """The issuer's caller for ``credentials``, or None after answering its refusal."""
        try:
            return await authority.identify(credentials.decode("ascii"))
        except (UnicodeDecodeError, TokenRefused) as exc:
            reason = exc.reason if isinstance(exc, TokenRefused) else "not ASCII"
            log.warning("refused an access token: %s", reason, extra={"action": "token_refused"})
            description = "The access token is not valid for this server"
            challenge = authority.challenge("invalid_token", description)
            await _refuse(send, 401, "invalid_token", description, challenge)
        except InsufficientScope:
            log.warning("refused an access token that gives no role", extra={"action": "token_no_role"})
            description = "The access token gives no role on this server"
            challenge = authority.challenge("insufficient_scope", description)
            await _refuse(send, 403, "insufficient_scope", description, challenge)
        except IssuerUnreachable as exc:
            log.error("cannot check access tokens: %s", exc, extra={"action": "issuer_unreachable"})
            description = "The identity provider's keys cannot be fetched now; try again shortly"
            await _refuse(send, 503, "temporarily_unavailable", description, (b"retry-after", b"5"))
        return None

    async def _unauthorized(self, send: Send) -> None:
        if self._authority is None:
            await _unauthorized(send)
            return
        await _refuse(
            send,
            401,
            "unauthorized",
            "Send 'Authorization: Bearer <access token>' with a token of this server's identity provider "
            "(its protected-resource metadata names it)",
            self._authority.challenge(),
        )


def _credentials(scope: Scope) -> bytes | None:
    """The token of the request's one ``Authorization: Bearer`` header, or None."""
    values: list[bytes] = [v for name, v in scope.get("headers", ()) if name.lower() == b"authorization"]
    if len(values) != 1:
        return None
    # "Bearer" SP token; the scheme is case-insensitive (RFC 9110, 11.1).
    scheme, _, credentials = values[0].strip().partition(b" ")
    if scheme.lower() != b"bearer" or not credentials.strip():
        return None
    return credentials.strip()


async def _refuse(
    send: Send, status: int, error: str, description: str, header: bytes | tuple[bytes, bytes]
) -> None:
    """An RFC 6750 refusal: ``{"error", "error_description"}`` and the challenge (a
    ``WWW-Authenticate`` value) or another header."""
    extra = header if isinstance(header, tuple) else (b"www-authenticate", header)
    await send_json(send, status, {"error": error, "error_description": description}, extra)


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

"""Opaque access tokens of the ``[auth]`` issuer, checked by asking it (RFC 7662 introspection).

A token that is not a JWT (some providers issue opaque ones, or do for some clients) is sent to the
``introspection_endpoint`` of the issuer's metadata, as the client ``introspection_client_id`` (with
its secret, HTTP Basic, when ``introspection_client_secret_env`` names one). It is taken when the
answer says ``active: true``, its ``aud`` names this server's audience (an answer without ``aud``
is refused: a token for another resource must not pass), its ``iss`` (when given) is the issuer,
and ``exp`` (required) and ``nbf`` hold within the leeway; its claims then give the identity and
the roles as a JWT's do. An answer is kept for ``introspection_cache_seconds`` (never past the
token's ``exp``), keyed by the token's SHA-256, so a busy host does not ask the issuer at every
request; a token revoked at the issuer is refused at most that long after. An issuer that cannot
be asked is :class:`~server.transports.jwt_adapter.IssuerUnreachable` (the request gets 503);
every refusal a :class:`~server.transports.jwt_adapter.TokenRefused` whose reason never holds the
token.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from cachetools import LRUCache

from orchestration.workers import TokenEndpointError, introspect
from server.settings.oauth import AuthTable
from server.transports.jwt_adapter import IssuerKeys, IssuerUnreachable, TokenRefused


class Asker(Protocol):
    """How the issuer is asked (:func:`orchestration.workers.introspect`)."""

    async def __call__(
        self, endpoint: str, token: str, /, *, client_id: str, client_secret: str | None
    ) -> dict[str, Any]: ...


#: How many introspected tokens are kept at most.
MAX_KEPT = 4096


def looks_like_jwt(token: str) -> bool:
    """Whether ``token`` has a JWS's shape (three dot-separated parts): checked as a JWT, else
    introspected."""
    return token.count(".") == 2


class Introspection:
    """Asks the issuer about opaque tokens (see the module docstring)."""

    def __init__(
        self,
        table: AuthTable,
        keys: IssuerKeys,
        client_secret: str | None,
        *,
        clock: Callable[[], float] = time.time,
        ask: Asker = introspect,
    ) -> None:
        assert table.introspection_client_id is not None and table.audience is not None
        self._table = table
        self._keys = keys
        self._client_id = table.introspection_client_id
        self._secret = client_secret
        self._clock = clock
        self._ask = ask
        self._kept: LRUCache[str, tuple[float, dict[str, Any]]] = LRUCache(maxsize=MAX_KEPT)

    async def claims(self, token: str) -> dict[str, Any]:
        """The claims the issuer gives ``token``; TokenRefused or IssuerUnreachable."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        kept = self._kept.get(digest)
        if kept is not None and kept[0] > now:
            return kept[1]
        endpoint = (await self._keys.metadata()).get("introspection_endpoint")
        if not isinstance(endpoint, str) or not endpoint.startswith(("https://", "http://")):
            raise TokenRefused(
                "the token is not a JWT and the issuer's metadata names no introspection_endpoint"
            )
        try:
            answer = await self._ask(endpoint, token, client_id=self._client_id, client_secret=self._secret)
        except TokenEndpointError as exc:
            raise IssuerUnreachable(str(exc)) from exc
        claims = self._checked(answer, now)
        until = min(now + self._table.introspection_cache_seconds, float(claims["exp"]))
        if until > now:
            self._kept[digest] = (until, claims)
        return claims

    def _checked(self, answer: dict[str, Any], now: float) -> dict[str, Any]:
        if answer.get("active") is not True:
            raise TokenRefused("the issuer says the token is not active")
        issuer = answer.get("iss")
        if issuer is not None and issuer != self._table.issuer:
            raise TokenRefused("the token's issuer (iss) is not this server's issuer")
        audience = answer.get("aud")
        audiences = (
            [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
        )
        if self._table.audience not in audiences:
            raise TokenRefused("the token was not issued for this server (aud)")
        leeway = self._table.leeway_seconds
        expires = answer.get("exp")
        if not isinstance(expires, int | float) or isinstance(expires, bool):
            raise TokenRefused("the issuer gives the token no expiry (exp)")
        if expires + leeway < now:
            raise TokenRefused("the token has expired")
        not_before = answer.get("nbf")
        if (
            isinstance(not_before, int | float)
            and not isinstance(not_before, bool)
            and not_before - leeway > now
        ):
            raise TokenRefused("the token is not valid yet (nbf)")
        return answer

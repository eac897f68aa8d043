"""JWT access tokens of one issuer, checked with PyJWT: the one module that uses the JOSE library.

:class:`IssuerKeys` finds the issuer's key set (JWKS) from its metadata — OpenID Connect discovery
(``/.well-known/openid-configuration``), else RFC 8414 (``/.well-known/oauth-authorization-server``)
— fetched once per process and kept, its ``issuer`` checked against the configured one. The key set
itself is PyJWT's :class:`jwt.PyJWKClient`: cached for ``cache_seconds``; a token whose ``kid`` is not
in it fetches it again (a rotated-in key) once ``cooldown_seconds`` have passed since the last fetch;
a key that left the set is refused from the next fetch on. PyJWT fetches with ``urllib`` (no
redirects, http(s) only), so every fetch runs in a worker thread (:func:`anyio.to_thread.run_sync`),
never on the event loop; the metadata document is fetched the same way, and kept
(:meth:`IssuerKeys.metadata`: the run pages' sign-in reads its ``authorization_endpoint`` and
``token_endpoint`` there).

:class:`JwtVerifier` checks a token: an asymmetric algorithm only (``none`` and the HMAC ones are
refused before any key is looked up: a public key used as an HMAC secret proves nothing), the
signature with the issuer's key of the token's ``kid`` (the key's own algorithm, not the one the
header claims), ``iss``, ``aud``, and ``exp`` / ``nbf`` / ``iat`` within ``leeway`` seconds. It is
also the MCP SDK's :class:`~mcp.server.auth.provider.TokenVerifier` (``verify_token``).

A refusal is a :class:`TokenRefused` whose ``reason`` is safe to log (it never holds the token, nor
more than a few characters of what the token claims); an issuer that cannot be reached is
:class:`IssuerUnreachable`.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import jwt
from mcp.server.auth.provider import AccessToken

log = logging.getLogger("construct.auth")

#: The signature algorithms accepted: asymmetric only.
ACCEPTED_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
#: How long one fetch of the metadata or the key set may take.
FETCH_TIMEOUT_SECONDS = 10.0
#: After a failed discovery, how long requests are refused before the metadata is fetched again.
DISCOVERY_RETRY_SECONDS = 5.0


class TokenRefused(Exception):
    """The token is not one this server accepts; ``reason`` says why, for the log only."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class IssuerUnreachable(Exception):
    """The issuer's metadata or key set could not be fetched (or is unusable): no token can be
    checked now."""


def metadata_urls(issuer: str) -> list[str]:
    """Where the issuer's metadata may be: OpenID Connect discovery (the issuer, then
    ``/.well-known/openid-configuration``), then RFC 8414 (``/.well-known/oauth-authorization-server``
    inserted before the issuer's path)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    base = f"{parts.scheme}://{parts.netloc}"
    return [
        f"{base}{path}/.well-known/openid-configuration",
        f"{base}/.well-known/oauth-authorization-server{path}",
    ]


def _fetch_json(url: str) -> Any:
    """GET ``url``'s JSON object (blocking: run in a thread). PyJWT's fetcher: no redirects, http(s)
    only, a JSON object or :class:`jwt.PyJWKClientError`."""
    return jwt.PyJWKClient(url, cache_jwk_set=False, timeout=FETCH_TIMEOUT_SECONDS).fetch_data()


def _short(value: object) -> str:
    """A claimed value as a log may show it: a few characters, quoted."""
    return repr(str(value)[:40])


class IssuerKeys:
    """The signing keys of ``issuer``, found from its metadata (see the module docstring)."""

    def __init__(self, issuer: str, *, cache_seconds: float, cooldown_seconds: float) -> None:
        self.issuer = issuer
        self._cache_seconds = cache_seconds
        self._cooldown_seconds = cooldown_seconds
        self._client: jwt.PyJWKClient | None = None
        self._metadata: dict[str, Any] = {}
        self._failed_at: float | None = None
        self._lock = anyio.Lock()

    async def signing_key(self, kid: str) -> jwt.PyJWK:
        """The issuer's key ``kid``: TokenRefused when the key set has none such (after one fetch,
        cooldown permitting), IssuerUnreachable when it cannot be fetched."""
        client = await self._jwks_client()
        try:
            return await anyio.to_thread.run_sync(client.get_signing_key, kid)
        except jwt.PyJWKClientConnectionError as exc:
            raise IssuerUnreachable(f"the key set at {client.uri} cannot be fetched: {exc}") from exc
        except jwt.PyJWKSetError as exc:
            raise IssuerUnreachable(f"the key set at {client.uri} has no usable key: {exc}") from exc
        except jwt.PyJWKClientError as exc:
            raise TokenRefused(f"no key of the issuer has the key id {_short(kid)}") from exc

    async def metadata(self) -> dict[str, Any]:
        """The issuer's metadata document (found once, as for the keys); IssuerUnreachable."""
        await self._jwks_client()
        return self._metadata

    async def _jwks_client(self) -> jwt.PyJWKClient:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                failed_at = self._failed_at
                if failed_at is not None and time.monotonic() - failed_at < DISCOVERY_RETRY_SECONDS:
                    raise IssuerUnreachable(f"the metadata of {self.issuer} could not be fetched just now")
                try:
                    jwks_uri = await anyio.to_thread.run_sync(self._discover)
                except IssuerUnreachable:
                    self._failed_at = time.monotonic()
                    raise
                self._client = jwt.PyJWKClient(
                    jwks_uri,
                    cache_jwk_set=True,
                    lifespan=self._cache_seconds,
                    cooldown_duration=self._cooldown_seconds,
                    timeout=FETCH_TIMEOUT_SECONDS,
                )
                log.info("issuer keys at %s", jwks_uri, extra={"action": "issuer_discovered"})
            return self._client

    def _discover(self) -> str:
        """The issuer's ``jwks_uri``, from the first metadata document found (blocking)."""
        problems = []
        for url in metadata_urls(self.issuer):
            try:
                metadata = _fetch_json(url)
            except jwt.PyJWKClientError as exc:
                problems.append(f"{url}: {exc}")
                continue
            if metadata.get("issuer") != self.issuer:
                raise IssuerUnreachable(
                    f"{url} names the issuer {_short(metadata.get('issuer'))}, not {self.issuer!r} "
                    "(the configured issuer must be exactly the provider's)"
                )
            jwks_uri = metadata.get("jwks_uri")
            if not isinstance(jwks_uri, str) or urlsplit(jwks_uri).scheme not in ("http", "https"):
                raise IssuerUnreachable(f"{url} has no http(s) jwks_uri")
            self._metadata = dict(metadata)
            return jwks_uri
        raise IssuerUnreachable(f"no metadata of {self.issuer}: " + "; ".join(problems))


class JwtVerifier:
    """Checks JWT access tokens of one issuer for one audience (see the module docstring)."""

    def __init__(self, keys: IssuerKeys, *, audience: str, leeway_seconds: float) -> None:
        self.keys = keys
        self.issuer = keys.issuer
        self.audience = audience
        self._leeway = leeway_seconds

    async def claims(self, token: str) -> dict[str, Any]:
        """The verified claims of ``token``; TokenRefused or IssuerUnreachable."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise TokenRefused("not a JWT") from exc
        alg = header.get("alg")
        if alg not in ACCEPTED_ALGORITHMS:
            raise TokenRefused(f"the algorithm {_short(alg)} is not accepted (asymmetric ones only)")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise TokenRefused("the token names no key id (kid)")
        key = await self.keys.signing_key(kid)
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self._leeway,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.InvalidTokenError as exc:
            raise TokenRefused(_refusal(exc)) from exc
        return claims

    async def verify_token(self, token: str) -> AccessToken | None:
        """The MCP SDK's verifier interface: the token's :class:`AccessToken` (its scopes, expiry,
        subject and claims), or None when it is refused or cannot be checked now."""
        try:
            claims = await self.claims(token)
        except (TokenRefused, IssuerUnreachable):
            return None
        return access_token(claims, client_id=str(claims.get("client_id", claims.get("azp", ""))))


def scopes_of(claims: dict[str, Any]) -> list[str]:
    """The token's scopes: ``scope`` (a space-separated string, RFC 9068), else ``scp`` (as some
    providers write them; either may also be a list of strings)."""
    for name in ("scope", "scp"):
        value = claims.get(name)
        if isinstance(value, str):
            return value.split()
        if isinstance(value, list):
            return [s for s in value if isinstance(s, str)]
    return []


def access_token(claims: dict[str, Any], *, client_id: str, scopes: list[str] | None = None) -> AccessToken:
    """The SDK's record of a verified token, the token itself withheld: ``client_id`` (who the SDK
    binds a session to, with ``iss`` and ``sub``), ``scopes`` (default: the token's)."""
    audience = claims.get("aud")
    exp = claims.get("exp")
    return AccessToken(
        token="(withheld)",
        client_id=client_id,
        scopes=scopes_of(claims) if scopes is None else scopes,
        expires_at=int(exp) if isinstance(exp, int | float) else None,
        resource=audience if isinstance(audience, str) else None,
        subject=str(claims["sub"]) if "sub" in claims else None,
        claims={"iss": claims.get("iss")},
    )


_REASONS: list[tuple[type[jwt.InvalidTokenError], str]] = [
    (jwt.ExpiredSignatureError, "the token has expired"),
    (jwt.ImmatureSignatureError, "the token is not valid yet (nbf or iat in the future)"),
    (jwt.InvalidAudienceError, "the token is for another audience"),
    (jwt.InvalidIssuerError, "the token is from another issuer"),
    (jwt.InvalidSignatureError, "the signature does not match the issuer's key"),
    (jwt.InvalidAlgorithmError, "the algorithm is not the key's"),
    (jwt.MissingRequiredClaimError, "the token lacks a required claim (exp, iss, aud)"),
]


def _refusal(exc: jwt.InvalidTokenError) -> str:
    return next((reason for kind, reason in _REASONS if isinstance(exc, kind)), "the token is not valid")


__all__ = [
    "ACCEPTED_ALGORITHMS",
    "IssuerKeys",
    "IssuerUnreachable",
    "JwtVerifier",
    "TokenRefused",
    "access_token",
    "metadata_urls",
    "scopes_of",
]

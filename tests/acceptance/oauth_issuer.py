"""A small, real authorization-server stand-in for the tests: an HTTP server on 127.0.0.1 (uvicorn in
a thread) that serves its OpenID Connect discovery document and its key set (JWKS) and mints access
tokens with PyJWT, signed by RSA keys that ``cryptography`` generates. It can rotate its key (the old
one leaves the key set) and count what was fetched.

It also runs the authorization-code grant with PKCE (S256) for one pre-registered client (public,
or confidential with ``client_secret``, sent with HTTP Basic), consent given at once:
``/authorize`` redirects with a code, ``/token`` exchanges it (checking the
verifier, the redirect URI and the client) for an access token whose ``aud`` is the ``resource``
the client asked for (RFC 8707) and whose ``scope`` is what it asked for, with an ID token (for the
client, carrying the request's ``nonce``) when the scope has ``openid``. That is enough for the MCP
SDK's OAuth client to sign in as a remote host does; it is no certified provider (no consent page,
no refresh tokens, no client registration), which a test against ``oidc-provider`` would bring.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import jwt
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.acceptance.harness import free_port


@dataclass
class SigningKey:
    kid: str
    private: rsa.RSAPrivateKey

    @classmethod
    def new(cls) -> SigningKey:
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return cls(f"key-{uuid.uuid4().hex[:12]}", private)

    def jwk(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key()))
        return {**public, "kid": self.kid, "use": "sig", "alg": "RS256"}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


@dataclass
class Issuer:
    """The stand-in's state: its URL, its current key and the keys it publishes, what was fetched."""

    url: str
    key: SigningKey = field(default_factory=SigningKey.new)
    fetches: dict[str, int] = field(default_factory=dict)
    #: the one registered client (public: no secret) and its redirect URI
    client_id: str = "test-host"
    redirect_uri: str = "http://127.0.0.1:1/callback"
    #: the subject a sign-in is for (the "person" who consents)
    signs_in: dict[str, Any] = field(default_factory=lambda: {"sub": "user-9", "email": "erin@example.com"})
    #: codes issued and not yet exchanged: code -> the authorization request
    codes: dict[str, dict[str, str]] = field(default_factory=dict)
    #: the registered client's secret (None: a public client)
    client_secret: str | None = None
    #: how long the access tokens of a sign-in last
    token_seconds: int = 300
    #: the nonce ID tokens carry instead of the request's (a replayed ID token), when set
    id_token_nonce: str | None = None
    #: the authorization requests received (their query parameters)
    authorizations: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.published = [self.key]

    def rotate(self) -> SigningKey:
        """A new signing key replaces the current one, which leaves the key set; the old key is
        returned (a test may still sign with it)."""
        old, self.key = self.key, SigningKey.new()
        self.published = [self.key]
        return old

    def claims(self, audience: str, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        base: dict[str, Any] = {
            "iss": self.url,
            "aud": audience,
            "sub": "user-1",
            "email": "alice@example.com",
            "scope": "construct:read construct:operate construct:approve",
            "iat": now,
            "exp": now + 300,
            "client_id": "a-host",
        }
        base.update(overrides)
        return {k: v for k, v in base.items() if v is not None}

    def token(self, audience: str, *, key: SigningKey | None = None, **overrides: Any) -> str:
        """An RS256 access token for ``audience`` signed by ``key`` (default: the current one);
        ``overrides`` replace claims (None removes one)."""
        key = key or self.key
        return jwt.encode(self.claims(audience, **overrides), key.private, "RS256", headers={"kid": key.kid})

    def unsigned(self, audience: str) -> str:
        """The same claims with ``alg: none`` and no signature."""
        header = {"alg": "none", "typ": "JWT", "kid": self.key.kid}
        return _compact(header, self.claims(audience), lambda _: b"")

    def hs256_with_public_key(self, audience: str) -> str:
        """HS256 with the issuer's public key (PEM) as the HMAC secret: the key-confusion attack."""
        secret = self.key.public_pem()
        header = {"alg": "HS256", "typ": "JWT", "kid": self.key.kid}
        return _compact(
            header, self.claims(audience), lambda data: hmac.new(secret, data, hashlib.sha256).digest()
        )

    def forged(self, audience: str) -> str:
        """Signed by a key the issuer never published, under the current key's id."""
        stranger = SigningKey.new()
        return jwt.encode(self.claims(audience), stranger.private, "RS256", headers={"kid": self.key.kid})

    def metadata(self) -> dict[str, Any]:
        return {
            "issuer": self.url,
            "jwks_uri": f"{self.url}/jwks",
            "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_basic"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "subject_types_supported": ["public"],
        }

    def app(self) -> Starlette:
        async def discovery(request: Request) -> JSONResponse:
            self._count(request.url.path.rsplit("/", 1)[-1])
            return JSONResponse(self.metadata())

        async def jwks(_request: Request) -> JSONResponse:
            self._count("jwks")
            return JSONResponse({"keys": [k.jwk() for k in self.published]})

        return Starlette(
            routes=[
                Route("/.well-known/openid-configuration", discovery),
                Route("/.well-known/oauth-authorization-server", discovery),
                Route("/jwks", jwks),
                Route("/authorize", self._authorize),
                Route("/token", self._token, methods=["POST"]),
            ]
        )

    async def _authorize(self, request: Request) -> Response:
        """Consent at once: redirect to the client with a code (or an error)."""
        self._count("authorize")
        asked = dict(request.query_params)
        self.authorizations.append(asked)
        if asked.get("client_id") != self.client_id or asked.get("redirect_uri") != self.redirect_uri:
            return JSONResponse({"error": "invalid_request"}, status_code=400)
        if asked.get("response_type") != "code" or asked.get("code_challenge_method") != "S256":
            return JSONResponse({"error": "invalid_request"}, status_code=400)
        code = uuid.uuid4().hex
        self.codes[code] = asked
        return RedirectResponse(
            f"{self.redirect_uri}?code={code}&state={asked.get('state', '')}", status_code=302
        )

    async def _token(self, request: Request) -> JSONResponse:
        """The code for an access token, after the PKCE, client and redirect checks."""
        self._count("token")
        form = dict(await request.form())
        asked = self.codes.pop(str(form.get("code", "")), None)
        if asked is None or form.get("grant_type") != "authorization_code":
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        verifier = str(form.get("code_verifier", "")).encode()
        challenge = _b64(hashlib.sha256(verifier).digest())
        if challenge != asked["code_challenge"]:
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        if self._client_of(request, form) != self.client_id:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        if form.get("redirect_uri") != self.redirect_uri or "resource" not in asked:
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        scope = asked.get("scope", "")
        exp = int(time.time()) + self.token_seconds
        token = self.token(asked["resource"], scope=scope, client_id=self.client_id, exp=exp, **self.signs_in)
        answer = {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": self.token_seconds,
            "scope": scope,
        }
        if "openid" in scope.split():
            answer["id_token"] = self.token(
                self.client_id,
                scope=None,
                client_id=None,
                exp=exp,
                nonce=self.id_token_nonce or asked.get("nonce"),
                **self.signs_in,
            )
        return JSONResponse(answer)

    def _client_of(self, request: Request, form: dict[str, Any]) -> str | None:
        """The authenticated client: HTTP Basic with the secret (confidential), else the form's
        ``client_id`` (public)."""
        if self.client_secret is None:
            return str(form.get("client_id", "")) if "authorization" not in request.headers else None
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic" or "client_secret" in form:
            return None
        client, _, secret = base64.b64decode(encoded).decode().partition(":")
        if not hmac.compare_digest(unquote(secret), self.client_secret):
            return None
        return unquote(client)

    def _count(self, what: str) -> None:
        self.fetches[what] = self.fetches.get(what, 0) + 1


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _compact(header: dict[str, Any], claims: dict[str, Any], sign: Any) -> str:
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{_b64(sign(signing_input.encode()))}"


@contextmanager
def running_issuer() -> Iterator[Issuer]:
    """An :class:`Issuer` served on a free port of 127.0.0.1 for the duration of the block."""
    port = free_port()
    issuer = Issuer(f"http://127.0.0.1:{port}")
    server = uvicorn.Server(uvicorn.Config(issuer.app(), host="127.0.0.1", port=port, log_level="warning"))
    # In a thread that is not the main one, uvicorn leaves the signal handlers alone.
    thread = threading.Thread(target=server.run, name="oauth-issuer", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the issuer stand-in did not start")
        time.sleep(0.02)
    try:
        yield issuer
    finally:
        server.should_exit = True
        thread.join(10)

"""The ``[auth]`` table, and the resource server on raw ASGI: identity and roles from a token's
claims, the order static token → issuer, the RFC 6750 refusals and the metadata document. Tokens are
checked by a stand-in verifier here; tests/acceptance/test_oauth_tokens.py checks real ones against a
real issuer."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from starlette.types import Message

from orchestration.errors import ConfigError
from server.identity import NamedToken
from server.settings.config import load_settings
from server.settings.oauth import AuthTable
from server.transports.auth import BearerTokenMiddleware, check_exposure
from server.transports.jwt_adapter import (
    IssuerKeys,
    IssuerUnreachable,
    JwtVerifier,
    TokenRefused,
    metadata_urls,
)
from server.transports.resource_server import OAuthResource, WithResourceMetadata
from tests.unit.server.test_auth import Recorder, receive

ISSUER = "https://idp.example"
AUDIENCE = "https://construct.example/mcp"
STATIC = "a-static-token-of-24-chars"
METADATA = "https://construct.example/.well-known/oauth-protected-resource/mcp"


def table(**keys: Any) -> AuthTable:
    return AuthTable.model_validate({"issuer": ISSUER, "audience": AUDIENCE, **keys})


class Claims(JwtVerifier):
    """Answers each token with the claims it was given (or the exception), never fetching."""

    def __init__(self, answers: dict[str, dict[str, Any] | Exception]) -> None:
        super().__init__(
            IssuerKeys(ISSUER, cache_seconds=1, cooldown_seconds=0), audience=AUDIENCE, leeway_seconds=0
        )
        self.answers = answers
        self.asked: list[str] = []

    async def claims(self, token: str) -> dict[str, Any]:
        self.asked.append(token)
        answer = self.answers.get(token, TokenRefused("unknown"))
        if isinstance(answer, Exception):
            raise answer
        return answer


def load(tmp_path: Path, text: str) -> AuthTable:
    (tmp_path / "c.toml").write_text(text)
    return load_settings(env={}, config_file=tmp_path / "c.toml").auth


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (f'issuer = "{ISSUER}"', "audience is required when issuer is set: this server's public /mcp URL"),
        ('issuer = "http://idp.example"\naudience = "https://a.example/mcp"', "issuer must use https"),
        (f'issuer = "{ISSUER}"\naudience = "https://a.example/mcp#x"', "must not carry credentials"),
        ('identity_claim = "email"', "set issuer"),
        (
            f'issuer = "{ISSUER}"\naudience = "{AUDIENCE}"\nclaim_roles = {{ a = ["read"] }}',
            "set roles_claim",
        ),
        (
            f'issuer = "{ISSUER}"\naudience = "{AUDIENCE}"\nissuerr = 1',
            "unknown setting (did you mean 'issuer'?)",
        ),
    ],
)
def test_a_bad_auth_table_is_a_config_error(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f"[auth]\n{text}\n")
    assert caught.value.code == "config_error"
    assert caught.value.field.startswith("auth")
    assert problem in caught.value.problem


def test_a_good_auth_table(tmp_path: Path) -> None:
    auth = load(
        tmp_path,
        f'[auth]\nissuer = "{ISSUER}"\naudience = "{AUDIENCE}"\nidentity_claim = "email"\n'
        'roles_claim = "groups"\n[auth.claim_roles]\nleads = ["read", "approve"]\n',
    )
    assert (
        auth.enabled and auth.identity_claim == "email" and auth.claim_roles == {"leads": ["read", "approve"]}
    )
    assert not load(tmp_path, "").enabled
    # A local provider may be plain http on loopback; with an issuer, no static token is needed.
    assert table(issuer="http://127.0.0.1:9000").issuer == "http://127.0.0.1:9000"
    check_exposure("0.0.0.0", (), issuer=True)
    with pytest.raises(ConfigError, match=r"or set \[auth\] issuer"):
        check_exposure("0.0.0.0", ())


def test_where_the_metadata_is_looked_for() -> None:
    assert metadata_urls("https://idp.example") == [
        "https://idp.example/.well-known/openid-configuration",
        "https://idp.example/.well-known/oauth-authorization-server",
    ]
    assert metadata_urls("https://idp.example/realms/team/") == [
        "https://idp.example/realms/team/.well-known/openid-configuration",
        "https://idp.example/.well-known/oauth-authorization-server/realms/team",
    ]


@pytest.mark.parametrize(
    ("keys", "claims", "roles"),
    [
        ({}, {"scope": "openid construct:read construct:approve"}, {"read", "approve"}),
        ({}, {"scp": ["construct:operate", "other"]}, {"operate"}),
        ({}, {"scope": ["construct:read"], "scp": "construct:approve"}, {"read"}),
        ({}, {"scope": "read operate", "groups": ["approve"]}, set()),
        ({"roles_claim": "roles"}, {"roles": ["approve", "construct:read", "admin"]}, {"approve", "read"}),
        ({"roles_claim": "groups", "claim_roles": {"leads": ["operate"]}}, {"groups": "leads"}, {"operate"}),
        (
            {"roles_claim": "groups", "claim_roles": {"leads": ["operate"]}},
            {"groups": ["approve"], "scope": "construct:read"},
            {"read"},
        ),
    ],
)
def test_roles_come_from_scopes_and_the_roles_claim(
    keys: dict[str, Any], claims: dict[str, Any], roles: set[str]
) -> None:
    assert OAuthResource(table(**keys), Claims({})).roles(claims) == roles


async def test_the_identity_is_the_configured_claim() -> None:
    good = {"sub": "u-1", "email": "alice@example.com", "scope": "construct:read"}
    resource = OAuthResource(
        table(identity_claim="email", own_runs_only=True),
        Claims(
            {
                "good": good,
                "no-email": {"sub": "u-2", "scope": "construct:read"},
                "agent": good | {"email": "Agent"},
            }
        ),
    )
    caller, user = await resource.identify("good")
    assert (caller.identity, set(caller.roles), caller.verified, caller.own_runs_only) == (
        "alice@example.com",
        {"read"},
        True,
        True,
    )
    assert (user.access_token.client_id, user.access_token.subject, user.access_token.token) == (
        "alice@example.com",
        "u-1",
        "(withheld)",
    )
    for token in ("no-email", "agent"):
        with pytest.raises(TokenRefused):
            await resource.identify(token)


async def asgi(app: Any, token: str | None, path: str = "/mcp") -> Recorder:
    recorder = Recorder()
    headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
    await app({"type": "http", "path": path, "method": "GET", "headers": headers}, receive, recorder.send)
    return recorder


def header(message: Message, name: bytes) -> str:
    value: bytes = next(v for k, v in message["headers"] if k == name)
    return value.decode()


async def test_a_static_token_first_then_the_issuer_and_the_refusals() -> None:
    verifier = Claims(
        {
            "jwt": {"sub": "bob", "scope": "construct:read"},
            "no-role": {"sub": "carol", "scope": "openid"},
            "down": IssuerUnreachable("no keys"),
        }
    )
    recorder = Recorder()
    guarded = BearerTokenMiddleware(
        recorder.app, [NamedToken("ci", STATIC)], OAuthResource(table(), verifier)
    )
    for token in (STATIC, "jwt"):
        ok = await asgi(guarded, token)
        assert ok.sent == []
    assert recorder.calls == ["http", "http"]
    assert verifier.asked == ["jwt"]  # the static token never reached the issuer's verifier

    missing = await asgi(guarded, None)
    assert missing.sent[0]["status"] == 401
    assert header(missing.sent[0], b"www-authenticate") == f'Bearer resource_metadata="{METADATA}"'

    bad = await asgi(guarded, "forged")
    assert bad.sent[0]["status"] == 401
    challenge = header(bad.sent[0], b"www-authenticate")
    assert challenge.startswith(f'Bearer resource_metadata="{METADATA}", error="invalid_token"')
    assert json.loads(bad.sent[1]["body"])["error"] == "invalid_token"

    no_role = await asgi(guarded, "no-role")
    assert no_role.sent[0]["status"] == 403
    challenge = header(no_role.sent[0], b"www-authenticate")
    assert 'error="insufficient_scope"' in challenge
    assert 'scope="construct:approve construct:operate construct:read"' in challenge

    down = await asgi(guarded, "down")
    assert down.sent[0]["status"] == 503
    assert header(down.sent[0], b"retry-after") == "5"
    assert recorder.calls == ["http", "http"]


async def test_the_protected_resource_metadata() -> None:
    app = WithResourceMetadata(Recorder().app, OAuthResource(table(), Claims({})))
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        answer = await asgi(app, None, path)
        assert answer.sent[0]["status"] == 200, path
        document = json.loads(answer.sent[1]["body"])
        assert document["resource"] == AUDIENCE
        assert document["authorization_servers"] == [ISSUER]  # exactly as configured, no slash added
        assert document["scopes_supported"] == ["construct:approve", "construct:operate", "construct:read"]


class OneKey(IssuerKeys):
    """The issuer's key set, held in memory: one RSA key, under ``kid``."""

    def __init__(self, private: rsa.RSAPrivateKey, kid: str = "k1") -> None:
        super().__init__(ISSUER, cache_seconds=1, cooldown_seconds=0)
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
        self.key = jwt.PyJWK({**public, "kid": kid, "alg": "RS256"})
        self.kid = kid

    async def signing_key(self, kid: str) -> jwt.PyJWK:
        if kid != self.kid:
            raise TokenRefused("unknown kid")
        return self.key


def _compact(header: dict[str, Any], claims: dict[str, Any], secret: bytes | None = None) -> str:
    """A JWT made by hand: unsigned, or HMAC-SHA256 signed with ``secret``."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    signature = b"" if secret is None else hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


async def test_the_verifier_checks_algorithm_signature_and_claims() -> None:
    """The verifier's refusals, each with the reason the log shows (no network: the key set is
    held in memory; the acceptance tests fetch it from a real issuer)."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    verifier = JwtVerifier(OneKey(private), audience=AUDIENCE, leeway_seconds=30)
    now = int(time.time())
    good = {"iss": ISSUER, "aud": AUDIENCE, "sub": "u", "exp": now + 60, "iat": now}

    def signed(claims: dict[str, Any], key: Any = private, kid: str = "k1") -> str:
        return jwt.encode(claims, key, "RS256", headers={"kid": kid})

    assert (await verifier.claims(signed(good)))["sub"] == "u"
    # Within the leeway: expired 10 s ago, valid from 10 s on.
    assert await verifier.claims(signed(good | {"exp": now - 10, "nbf": now + 10}))
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    refused = {
        "the token has expired": signed(good | {"exp": now - 60}),
        "the token is not valid yet": signed(good | {"nbf": now + 120}),
        "the token is for another audience": signed(good | {"aud": "https://other.example/mcp"}),
        "the token is from another issuer": signed(good | {"iss": "https://evil.example"}),
        "the signature does not match": signed(good, key=stranger),
        "the algorithm 'none' is not accepted": _compact({"alg": "none", "kid": "k1"}, good),
        "the algorithm 'HS256' is not accepted": _compact({"alg": "HS256", "kid": "k1"}, good, pem),
        "the token names no key id": jwt.encode(good, private, "RS256"),
        "unknown kid": signed(good, kid="k2"),
        "lacks a required claim": signed({k: v for k, v in good.items() if k != "exp"}),
        "not a JWT": "not.a-jwt",
    }
    for reason, token in refused.items():
        with pytest.raises(TokenRefused) as caught:
            await verifier.claims(token)
        assert caught.value.reason.startswith(reason) or reason in caught.value.reason, (reason, caught.value)
        assert await verifier.verify_token(token) is None  # the SDK's interface: refused is None
    access = await verifier.verify_token(signed(good | {"scope": "construct:read", "client_id": "host"}))
    assert access is not None
    assert (access.client_id, access.scopes, access.subject) == ("host", ["construct:read"], "u")

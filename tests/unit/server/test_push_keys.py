"""The key of A2A push notifications: a signature any JOSE library checks with the published key
set (PyJWT here, as a webhook would), secrets sealed for one place only, webhook URLs checked, and
the backoff's bounds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from orchestration.errors import ConfigError, InvalidArgument, TooLarge
from server.a2a.push_keys import PushKeyError, PushKeys, SealBroken, seal_context
from server.a2a.push_notifier import MAX_RETRY_SECONDS, backoff_delay
from server.a2a.webhook_configs import check_url
from server.settings.config import load_settings


def pem_of(key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_keys() -> PushKeys:
    return PushKeys(pem_of(ec.generate_private_key(ec.SECP256R1())))


def test_a_signature_checks_with_the_published_key_set() -> None:
    keys = new_keys()
    audience = "https://hooks.example/a2a"
    claims: dict[str, object] = {"task_id": "run_1", "aud": audience, "iat": 1, "exp": 2**40, "jti": "x"}
    token = keys.sign(claims)
    assert jwt.get_unverified_header(token) == {"alg": "ES256", "typ": "JWT", "kid": keys.kid}
    key_set = jwt.PyJWKSet.from_dict(json.loads(json.dumps(keys.jwks())))
    [key] = key_set.keys
    assert key.key_id == keys.kid
    checked = jwt.decode(token, key.key, algorithms=["ES256"], audience=audience)
    assert checked == claims
    other = new_keys()
    assert other.kid != keys.kid
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(
            token,
            jwt.PyJWKSet.from_dict(other.jwks()).keys[0].key,
            algorithms=["ES256"],
            audience=audience,
        )


def test_a_secret_opens_only_where_it_was_sealed_and_with_its_key() -> None:
    keys = new_keys()
    here = seal_context("run_1", "hook", "token")
    sealed = keys.seal("client-token-secret", here)
    assert "client-token-secret" not in sealed and sealed.startswith("v1.")
    assert keys.seal("client-token-secret", here) != sealed  # a nonce of its own each time
    assert keys.open(sealed, here) == "client-token-secret"
    with pytest.raises(SealBroken):
        keys.open(sealed, seal_context("run_2", "hook", "token"))
    with pytest.raises(SealBroken):
        new_keys().open(sealed, here)
    with pytest.raises(SealBroken):
        keys.open(sealed[:-2] + ("A" if sealed[-2] != "A" else "B") + sealed[-1], here)


def test_only_a_p256_key_is_taken_and_never_quoted() -> None:
    with pytest.raises(PushKeyError, match="EC P-256"):
        PushKeys(pem_of(ed25519.Ed25519PrivateKey.generate()))
    with pytest.raises(PushKeyError) as refused:
        PushKeys(b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1tYXRlcmlhbA==\n-----END PRIVATE KEY-----\n")
    assert "c2VjcmV0" not in str(refused.value)


def test_webhook_urls() -> None:
    check_url("https://hooks.example/a2a?x=1", private_allowed=False)
    check_url("http://127.0.0.1:9/hook", private_allowed=True)
    for url in ("ftp://hooks.example/", "https:///nohost", "https://user:pw@hooks.example/"):
        with pytest.raises(InvalidArgument):
            check_url(url, private_allowed=False)
    for url in (
        "http://localhost:8080/",
        "http://127.0.0.1/",
        "http://10.1.2.3/",
        "http://[::1]/",
        "http://169.254.169.254/",
    ):
        with pytest.raises(InvalidArgument, match="push_private_urls"):
            check_url(url, private_allowed=False)
    with pytest.raises(TooLarge):
        check_url("https://hooks.example/" + "a" * 2000, private_allowed=False)


def test_the_backoff_doubles_to_its_cap_with_jitter_or_takes_retry_after() -> None:
    rng = random.Random(7)
    for attempt in range(1, 12):
        delay = backoff_delay(attempt, rng, None)
        assert 0 <= delay <= min(MAX_RETRY_SECONDS, 2 ** (attempt - 1))
    assert backoff_delay(3, rng, 12.0) == 12.0


def test_the_key_comes_from_a_file_or_a_variable_and_is_never_shown(tmp_path: Path) -> None:
    pem = pem_of(ec.generate_private_key(ec.SECP256R1()))
    (tmp_path / "key.pem").write_bytes(pem)
    config = tmp_path / "construct.toml"

    config.write_text(f'[a2a]\npush_signing_key_file = "{tmp_path / "key.pem"}"\n')
    assert load_settings(env={}, home=tmp_path).push_signing_key() == pem

    config.write_text('[a2a]\npush_signing_key_env = "PUSH_KEY"\n')
    settings = load_settings(env={"PUSH_KEY": pem.decode()}, home=tmp_path)
    assert settings.push_signing_key() == pem
    assert pem.decode() not in repr(settings)
    unset = load_settings(env={}, home=tmp_path)  # only a server that offers push needs it
    with pytest.raises(ConfigError, match="PUSH_KEY is not set"):
        unset.push_signing_key()

    config.write_text("")
    assert load_settings(env={}, home=tmp_path).push_signing_key() is None
    config.write_text(f'[a2a]\npush_signing_key_env = "PUSH_KEY"\npush_signing_key_file = "{tmp_path}/k"\n')
    with pytest.raises(ConfigError, match="not both"):
        load_settings(env={}, home=tmp_path)

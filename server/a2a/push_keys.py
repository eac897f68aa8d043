"""The key of push notifications: it signs each notification and seals the secrets of the configs
in the store (``cryptography`` directly: a JWS of one algorithm needs no JOSE library).

- **Signing.** A notification carries a compact JWS (:meth:`PushKeys.sign`): ES256 (ECDSA P-256,
  SHA-256), header ``{"alg": "ES256", "typ": "JWT", "kid": ...}``; ``kid`` is the RFC 7638
  thumbprint of the public key, so a rotated key has a new one. The public key is published as a
  JWKS (:meth:`PushKeys.jwks`) at :data:`~server.a2a.sdk_face.PUSH_JWKS_PATH`; any JOSE library
  checks the signature with it (PyJWT: ``jwt.PyJWKClient``).
- **Sealing.** A config's ``token`` and ``authentication.credentials`` are stored only sealed
  (:meth:`PushKeys.seal`): AES-256-GCM under a key derived from the signing key (HKDF-SHA256 over
  its private scalar, its own ``info``), a random 96-bit nonce per value, and the run, the config
  and the field as associated data, so a sealed value opens only where it was written. Sealed text
  is ``v1.`` + base64url(nonce + ciphertext). Another key (a rotated one) cannot open it: the
  config's notifications then go without the token, and the log says so.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: the JWS algorithm of notifications
ALGORITHM = "ES256"
_SEAL_INFO = b"construct-mcp a2a push config seal v1"
_SEAL_PREFIX = "v1."
_NONCE_BYTES = 12


class PushKeyError(ValueError):
    """The configured key is not a P-256 private key in PEM (the message never quotes it)."""


class SealBroken(ValueError):
    """A sealed value does not open with this key (another key sealed it, or it was altered)."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _coordinate(value: int) -> str:
    return b64url(value.to_bytes(32, "big"))


class PushKeys:
    """One server's push notification key (from its PEM text)."""

    def __init__(self, pem: bytes) -> None:
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise PushKeyError("the push signing key is not a PEM private key without a password") from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
            raise PushKeyError("the push signing key must be an EC P-256 (ES256) private key")
        self._key = key
        numbers = key.public_key().public_numbers()
        self._public = {"crv": "P-256", "kty": "EC", "x": _coordinate(numbers.x), "y": _coordinate(numbers.y)}
        thumbprint = json.dumps(self._public, separators=(",", ":"), sort_keys=True).encode()
        #: the key's id in the JWKS and in every signature's header (RFC 7638 thumbprint)
        self.kid = b64url(hashlib.sha256(thumbprint).digest())
        scalar = key.private_numbers().private_value.to_bytes(32, "big")
        self._aead = AESGCM(HKDF(hashes.SHA256(), length=32, salt=None, info=_SEAL_INFO).derive(scalar))

    def jwks(self) -> dict[str, Any]:
        """The public key set a webhook checks signatures with."""
        return {"keys": [{**self._public, "kid": self.kid, "use": "sig", "alg": ALGORITHM}]}

    def sign(self, claims: dict[str, Any]) -> str:
        """``claims`` as a compact JWS (ES256, this key's ``kid``)."""
        header = {"alg": ALGORITHM, "typ": "JWT", "kid": self.kid}
        signing_input = ".".join(
            b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
        )
        der = self._key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return f"{signing_input}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def seal(self, secret: str, context: str) -> str:
        """``secret`` sealed for the place ``context`` names (run, config, field)."""
        nonce = os.urandom(_NONCE_BYTES)
        return _SEAL_PREFIX + b64url(nonce + self._aead.encrypt(nonce, secret.encode(), context.encode()))

    def open(self, sealed: str, context: str) -> str:
        """What :meth:`seal` sealed for ``context``; :class:`SealBroken` otherwise."""
        if not sealed.startswith(_SEAL_PREFIX):
            raise SealBroken("not a sealed value of this server")
        try:
            raw = _unb64url(sealed.removeprefix(_SEAL_PREFIX))
            plain = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], context.encode())
        except (InvalidTag, ValueError) as exc:
            raise SealBroken("the sealed value does not open with this server's push key") from exc
        return plain.decode()


def seal_context(run_id: str, config_id: str, field: str) -> str:
    """The associated data a config's secret is sealed under."""
    return f"{run_id}\x00{config_id}\x00{field}"

"""The ``[auth]`` table of the config file: the identity provider whose access tokens the HTTP
transports accept (docs/deployment.md, Signing in with your identity provider).

With ``issuer`` set, a bearer token that is none of the static tokens is read as a JWT access token
of that issuer, for ``audience`` (this server's public ``/mcp`` URL, which the settings cannot infer:
the server does not know the name it is reached by behind a proxy). The identity is the
``identity_claim`` of the token; roles come from its scopes (:data:`SCOPE_ROLES`) and, when
``roles_claim`` is set, from that claim's values (mapped by ``claim_roles``, else taken as role or
scope names). Without ``issuer`` the table must be empty.
"""

from __future__ import annotations

from typing import Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from server.identity import ROLES, Role
from server.transports.auth import is_loopback

#: The OAuth scope that grants each role.
SCOPE_ROLES: dict[str, Role] = {f"construct:{role}": role for role in sorted(ROLES)}


def _url(value: str, what: str) -> str:
    """``value`` if it is an ``https`` URL (``http`` on a loopback host, for a local provider)
    without credentials, query or fragment; else ValueError naming ``what``."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an https URL, such as https://idp.example")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError(f"{what} must use https (http only for a loopback host such as 127.0.0.1)")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(f"{what} must not carry credentials, a query or a fragment")
    return value


class AuthTable(BaseModel):
    """The ``[auth]`` table: the identity provider (an OAuth 2.1 / OpenID Connect issuer) whose JWT
    access tokens the HTTP transports accept beside the static tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="the identity provider's issuer URL (`iss` of its tokens); its keys are found from "
        "`/.well-known/openid-configuration` (or `oauth-authorization-server`) under it",
    )
    audience: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="required with `issuer`: this server's public `/mcp` URL (such as "
        "`https://construct.example/mcp`), which a token's `aud` must name and which the "
        "protected-resource metadata publishes",
    )
    identity_claim: str = Field(
        default="sub",
        min_length=1,
        max_length=100,
        description="the claim that names the identity (runs started, approvals recorded): `sub`, or "
        "`email`, `preferred_username`, ...",
    )
    roles_claim: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description="a claim (a list or a string, such as `groups` or `roles`) whose values give roles "
        "too, besides the scopes `construct:read`, `construct:operate`, `construct:approve`",
    )
    claim_roles: dict[str, list[Role]] | None = Field(
        default=None,
        description="with `roles_claim`: a value of that claim -> the roles it gives (without it, a "
        "value that is a role or a `construct:` scope gives that role)",
    )
    own_runs_only: bool = Field(
        default=False, description="true: every identity signed in this way sees and acts on only its runs"
    )
    leeway_seconds: float = Field(
        default=30.0, ge=0, le=300, description="clock skew allowed on a token's `exp`, `nbf` and `iat`"
    )
    keys_cache_seconds: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        description="how long the provider's key set (JWKS) is kept before it is fetched again; a token "
        "with an unknown key id fetches it sooner (see `keys_refresh_cooldown_seconds`)",
    )
    keys_refresh_cooldown_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="a token with a key id the key set lacks fetches the set again once this long has "
        "passed since the last fetch (a rotated-in key is picked up then); 0: at once",
    )

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str | None) -> str | None:
        return None if value is None else _url(value, "issuer")

    @field_validator("audience")
    @classmethod
    def _audience(cls, value: str | None) -> str | None:
        return None if value is None else _url(value, "audience")

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.issuer is None:
            if self.model_fields_set - {"issuer"}:
                raise ValueError("set issuer (the identity provider's URL) for the other keys of [auth]")
            return self
        if self.audience is None:
            raise ValueError(
                "audience is required when issuer is set: this server's public /mcp URL (such as "
                "https://construct.example/mcp), which the tokens it accepts must name in aud; the "
                "server cannot tell the name it is reached by"
            )
        if self.claim_roles is not None and self.roles_claim is None:
            raise ValueError("claim_roles maps the values of roles_claim: set roles_claim too")
        return self

    @property
    def enabled(self) -> bool:
        return self.issuer is not None


__all__ = ["SCOPE_ROLES", "AuthTable"]

"""The ``[auth]`` table of the config file: the identity provider whose access tokens the HTTP
transports accept (docs/deployment.md, Signing in with your identity provider).

With ``issuer`` set, a bearer token that is none of the static tokens is read as a JWT access token
of that issuer, for ``audience`` (this server's public ``/mcp`` URL, which the settings cannot infer:
the server does not know the name it is reached by behind a proxy). The identity is the
``identity_claim`` of the token; roles come from its scopes (:data:`SCOPE_ROLES`) and, when
``roles_claim`` is set, from that claim's values (mapped by ``claim_roles``, else taken as role or
scope names). Without ``issuer`` the table must be empty.

With ``page_client_id`` set too, the run pages sign a person in through the same issuer
(authorization code with PKCE; :mod:`server.web.sign_in`): the client is public, or confidential
when ``page_client_secret_env`` names the environment variable that holds its secret (the secret
itself is never in the file). The pages' redirect URI is the audience's origin followed by
``page_redirect_path``; a session lasts ``page_session_seconds`` at most, and never longer than the
access token it was made from.
"""

from __future__ import annotations

import re
from typing import Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from server.identity import ROLES, Role
from server.transports.auth import is_loopback

#: The OAuth scope that grants each role.
SCOPE_ROLES: dict[str, Role] = {f"construct:{role}": role for role in sorted(ROLES)}
#: A redirect path the run pages can answer: under ``/runs/``, plain segments, not the API's.
REDIRECT_PATH = re.compile(r"^/runs/(?!api(/|$)|sign-in$|sign-out$)[A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*$")
#: An environment variable's name.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: A scope as RFC 6749 §3.3 spells one.
SCOPE_TOKEN = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]{1,200}$")


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

    page_client_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="the OAuth client the run pages sign a person in as (authorization code with PKCE, "
        "registered at the issuer with the redirect URI `<audience's origin><page_redirect_path>`); "
        "unset: the pages ask for a token as before",
    )
    page_client_secret_env: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="with `page_client_id`, for a confidential client: the environment variable that "
        "holds its secret (sent to the token endpoint with HTTP Basic; never in this file, a log or "
        "an error); unset: a public client",
    )
    page_redirect_path: str = Field(
        default="/runs/callback",
        min_length=1,
        max_length=200,
        description="the path under `/runs/` the issuer sends the person back to after signing in",
    )
    page_session_seconds: int = Field(
        default=900,
        ge=60,
        le=28800,
        description="how long a sign-in on the run pages lasts (its cookie and its server-side session); "
        "never longer than the access token it was made from",
    )
    page_scopes: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=20,
        description="the scopes the run pages ask for (default: `openid` and the three `construct:` "
        "scopes); with `roles_claim`, the ones your provider needs to put that claim in the token",
    )

    introspection_client_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="the OAuth client this server asks the issuer's `introspection_endpoint` (RFC 7662) "
        "as, for access tokens that are not JWTs (opaque ones); unset: JWT access tokens only",
    )
    introspection_client_secret_env: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="with `introspection_client_id`: the environment variable that holds that client's "
        "secret (HTTP Basic; never in this file, a log or an error); unset: a public client",
    )
    introspection_cache_seconds: float = Field(
        default=30.0,
        ge=0,
        le=300,
        description="how long the issuer's answer for an opaque token is kept (never past the token's "
        "`exp`): a token revoked at the issuer is refused at most this long after; 0: asked at every "
        "request",
    )

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str | None) -> str | None:
        return None if value is None else _url(value, "issuer")

    @field_validator("audience")
    @classmethod
    def _audience(cls, value: str | None) -> str | None:
        return None if value is None else _url(value, "audience")

    @field_validator("page_redirect_path")
    @classmethod
    def _redirect_path(cls, value: str) -> str:
        if not REDIRECT_PATH.match(value):
            raise ValueError(
                "page_redirect_path must be a path under /runs/ (such as /runs/callback) of letters, "
                "digits and ._~-, other than /runs/api, /runs/sign-in and /runs/sign-out"
            )
        return value

    @field_validator("page_client_secret_env", "introspection_client_secret_env")
    @classmethod
    def _secret_env(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not ENV_NAME.match(value):
            raise ValueError(f"{info.field_name} must name an environment variable, such as PAGE_SECRET")
        return value

    @field_validator("page_scopes")
    @classmethod
    def _scopes(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not all(SCOPE_TOKEN.match(scope) for scope in value):
            raise ValueError("page_scopes must be scopes without spaces, quotes or backslashes")
        return value

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
        page_keys = {"page_client_secret_env", "page_redirect_path", "page_session_seconds", "page_scopes"}
        if self.page_client_id is None and self.model_fields_set & page_keys:
            raise ValueError("set page_client_id (the run pages' client) for the other page_ keys of [auth]")
        introspection_keys = {"introspection_client_secret_env", "introspection_cache_seconds"}
        if self.introspection_client_id is None and self.model_fields_set & introspection_keys:
            raise ValueError(
                "set introspection_client_id (the client this server introspects tokens as) for the other "
                "introspection_ keys of [auth]"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.issuer is not None

    @property
    def page_sign_in(self) -> bool:
        """Whether the run pages sign a person in through the issuer."""
        return self.issuer is not None and self.page_client_id is not None

    @property
    def origin(self) -> str:
        """This server's public origin: the audience's scheme, host and port."""
        assert self.audience is not None, "an [auth] table with an audience"
        parts = urlsplit(self.audience)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def redirect_uri(self) -> str:
        """The run pages' redirect URI, to register at the issuer."""
        return self.origin + self.page_redirect_path

    def scopes_asked(self) -> list[str]:
        """The scopes the run pages ask for."""
        return list(self.page_scopes) if self.page_scopes is not None else ["openid", *SCOPE_ROLES]


__all__ = ["SCOPE_ROLES", "AuthTable"]

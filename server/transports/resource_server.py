"""This server as an OAuth 2.1 resource server (the MCP authorization spec): access tokens of the
``[auth]`` issuer, the identity and roles they carry, the protected-resource metadata (RFC 9728) and
the ``WWW-Authenticate`` challenges of a refusal (RFC 6750).

:class:`OAuthResource` turns a verified token (:mod:`server.transports.jwt_adapter`) into a
:class:`~server.identity.Caller`: the identity is the ``identity_claim``; the roles are those of the
token's scopes (``construct:read``, ``construct:operate``, ``construct:approve``) and, with
``roles_claim``, of that claim's values. From there an identity of the issuer is like one of a static
token: the same per-tool role checks (``forbidden``), ``own_runs_only``, decisions recorded as
verified. A token that gives no role at all is refused at the door (403 ``insufficient_scope``);
one that gives some roles is checked tool by tool.

The metadata document is served, without a token, at ``/.well-known/oauth-protected-resource``
and at its path form for the audience (``/.well-known/oauth-protected-resource/mcp``), by the MCP
SDK's handler; every 401 names it in ``resource_metadata``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from mcp.server.auth.handlers.metadata import ProtectedResourceMetadataHandler
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.routes import build_resource_metadata_url, cors_middleware
from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestration.core import AGENT_APPROVER
from server.identity import ROLES, Caller, Role
from server.settings.oauth import SCOPE_ROLES, AuthTable
from server.transports.auth import InsufficientScope
from server.transports.introspection import Introspection, looks_like_jwt
from server.transports.jwt_adapter import (
    IssuerKeys,
    JwtVerifier,
    TokenRefused,
    access_token,
    scopes_of,
)

#: The root form of the metadata's path (the path form appends the audience's path).
METADATA_PATH = "/.well-known/oauth-protected-resource"
#: An identity taken from a token: no whitespace or control characters, as long as an approver may be.
CLAIMED_IDENTITY = re.compile(r"^[^\s\x00-\x1f\x7f]{1,200}$")


class OAuthResource:
    """The ``[auth]`` table put to work: verify, identify, describe, challenge."""

    def __init__(self, table: AuthTable, verifier: JwtVerifier | None = None) -> None:
        assert table.issuer is not None and table.audience is not None, "an [auth] table with an issuer"
        self.table = table
        self.issuer = table.issuer
        self.audience = table.audience
        self.verifier = verifier or JwtVerifier(
            IssuerKeys(
                table.issuer,
                cache_seconds=table.keys_cache_seconds,
                cooldown_seconds=table.keys_refresh_cooldown_seconds,
            ),
            audience=table.audience,
            leeway_seconds=table.leeway_seconds,
        )
        self.metadata_url = str(build_resource_metadata_url(AnyHttpUrl(self.audience)))
        #: opaque tokens' check, once :meth:`introspect_with` is called (``introspection_client_id``)
        self.introspection: Introspection | None = None

    def introspect_with(self, client_secret: str | None) -> None:
        """Check opaque (non-JWT) tokens by introspection at the issuer, as the configured client
        (:mod:`server.transports.introspection`); called by the HTTP transports, which read the
        secret's variable."""
        self.introspection = Introspection(self.table, self.verifier.keys, client_secret)

    async def identify(self, token: str) -> tuple[Caller, AuthenticatedUser]:
        """The caller ``token`` stands for, and the SDK's user; TokenRefused,
        :class:`~server.transports.auth.InsufficientScope` or
        :class:`~server.transports.jwt_adapter.IssuerUnreachable`. A JWT is verified with the
        issuer's keys; another token is introspected when that is configured."""
        if self.introspection is not None and not looks_like_jwt(token):
            claims = await self.introspection.claims(token)
        else:
            claims = await self.verifier.claims(token)
        identity = claims.get(self.table.identity_claim)
        if not isinstance(identity, str) or not CLAIMED_IDENTITY.match(identity):
            raise TokenRefused(f"the claim {self.table.identity_claim!r} is missing or not a usable name")
        if identity.casefold() == AGENT_APPROVER:
            raise TokenRefused(f"the identity {AGENT_APPROVER!r} is reserved for the calling agent")
        roles = self.roles(claims)
        if not roles:
            raise InsufficientScope(identity)
        caller = Caller(
            identity=identity,
            roles=roles,
            own_runs_only=self.table.own_runs_only,
            channel="http",
            verified=True,
        )
        user = AuthenticatedUser(access_token(claims, client_id=identity, scopes=sorted(roles)))
        return caller, user

    def roles(self, claims: dict[str, Any]) -> frozenset[Role]:
        """The roles ``claims`` give: by their scopes, and by the values of ``roles_claim``."""
        roles = {SCOPE_ROLES[s] for s in scopes_of(claims) if s in SCOPE_ROLES}
        if self.table.roles_claim is not None:
            values = claims.get(self.table.roles_claim)
            listed = [values] if isinstance(values, str) else values if isinstance(values, list) else []
            for value in (v for v in listed if isinstance(v, str)):
                roles |= self._roles_of_value(value)
        return frozenset(roles)

    def _roles_of_value(self, value: str) -> set[Role]:
        if self.table.claim_roles is not None:
            return set(self.table.claim_roles.get(value, ()))
        if value in SCOPE_ROLES:
            return {SCOPE_ROLES[value]}
        return {role for role in ROLES if role == value}

    # -- what clients see ----------------------------------------------------------------------

    def challenge(self, error: str | None = None, description: str | None = None) -> bytes:
        """A ``WWW-Authenticate`` value: ``Bearer`` with ``resource_metadata`` (where a client
        finds the issuer), ``error`` and its description when the token was bad (RFC 6750 §3: a
        request without a token gets no error code), and the scopes with ``insufficient_scope``."""
        parts = [f'resource_metadata="{self.metadata_url}"']
        if error is not None:
            parts.append(f'error="{error}"')
        if description is not None:
            parts.append(f'error_description="{description}"')
        if error == "insufficient_scope":
            parts.append(f'scope="{" ".join(SCOPE_ROLES)}"')
        return ("Bearer " + ", ".join(parts)).encode()

    def metadata_app(self) -> Starlette:
        """The protected-resource metadata at its path form and at its root path, answered by the
        SDK's handler. The document is validated from the configured strings, so that the issuer
        keeps its exact spelling (no slash added: clients compare issuers as strings)."""
        metadata = ProtectedResourceMetadata.model_validate(
            {
                "resource": self.audience,
                "authorization_servers": [self.issuer],
                "scopes_supported": list(SCOPE_ROLES),
                "resource_name": "construct-mcp",
            }
        )
        endpoint = cors_middleware(ProtectedResourceMetadataHandler(metadata).handle, ["GET", "OPTIONS"])
        paths = dict.fromkeys([urlsplit(self.metadata_url).path, METADATA_PATH])
        return Starlette(routes=[Route(path, endpoint, methods=["GET", "OPTIONS"]) for path in paths])


class WithResourceMetadata:
    """Sends the metadata paths to ``resource``'s document (no token needed), everything else to
    ``app``."""

    def __init__(self, app: ASGIApp, resource: OAuthResource) -> None:
        self._app = app
        self._metadata = resource.metadata_app()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == METADATA_PATH or path.startswith(METADATA_PATH + "/")):
            await self._metadata(scope, receive, send)
            return
        await self._app(scope, receive, send)


__all__ = ["METADATA_PATH", "OAuthResource", "WithResourceMetadata"]

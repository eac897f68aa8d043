"""An OAuth authorization server's endpoints, as a client: one authorization-code exchange at the
token endpoint (RFC 6749 §4.1.3, with the PKCE verifier of RFC 7636 and the resource indicator of
RFC 8707), and one token's introspection (RFC 7662). The run pages' sign-in
(:mod:`server.web.sign_in`) and the resource server's check of opaque access tokens
(:mod:`server.transports.introspection`) use them; they live here because all of the project's
HTTP client code does.

A confidential client authenticates with HTTP Basic (``client_secret_basic``, its id and secret
form-encoded first, RFC 6749 §2.3.1); a public one sends its ``client_id`` in the form. Every failure
is a :class:`TokenEndpointError` whose message holds neither the code, the verifier, the secret nor
a token: at most the endpoint's own ``error`` code, a few characters long.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx2

from orchestration.workers.model_calls import make_http_client

#: How long one exchange may take.
EXCHANGE_TIMEOUT_SECONDS = 10.0
#: The largest answer read from a token endpoint.
MAX_ANSWER_BYTES = 64 * 1024


class TokenEndpointError(Exception):
    """The token endpoint refused the exchange or could not be reached; the message is safe to log."""


async def exchange_code(
    token_endpoint: str,
    form: Mapping[str, str],
    *,
    client_id: str,
    client_secret: str | None,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """POST ``form`` (``grant_type``, ``code``, ``redirect_uri``, ``code_verifier``, ``resource``)
    to ``token_endpoint`` as ``client_id`` and return the JSON answer, which has an ``access_token``;
    :class:`TokenEndpointError` otherwise. Redirects are not followed (a redirect would carry the
    code and the secret elsewhere)."""
    answer = await _post(token_endpoint, form, client_id, client_secret, transport, "token endpoint")
    data = _json_of(answer, "token endpoint")
    if answer.status_code != 200:
        raise TokenEndpointError(f"the token endpoint refused the code: {answer.status_code} {_code(data)!r}")
    if not isinstance(data.get("access_token"), str) or not data["access_token"]:
        raise TokenEndpointError("the token endpoint's answer has no access_token")
    return data


async def introspect(
    introspection_endpoint: str,
    token: str,
    *,
    client_id: str,
    client_secret: str | None,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """What the authorization server says of ``token`` (RFC 7662): its JSON answer, whose
    ``active`` is true for a token it stands behind; :class:`TokenEndpointError` when it cannot be
    asked or answers otherwise than 200 with a JSON object. The token is never in the error."""
    form = {"token": token, "token_type_hint": "access_token"}
    answer = await _post(
        introspection_endpoint, form, client_id, client_secret, transport, "introspection endpoint"
    )
    data = _json_of(answer, "introspection endpoint")
    if answer.status_code != 200:
        raise TokenEndpointError(
            f"the introspection endpoint refused this server: {answer.status_code} {_code(data)!r}"
        )
    return data


async def _post(
    endpoint: str,
    form: Mapping[str, str],
    client_id: str,
    client_secret: str | None,
    transport: httpx2.AsyncBaseTransport | None,
    what: str,
) -> httpx2.Response:
    """POST ``form`` to ``endpoint`` as ``client_id`` (HTTP Basic with a secret, else in the form)."""
    body = dict(form)
    auth: tuple[str, str] | None = None
    if client_secret is None:
        body["client_id"] = client_id
    else:
        auth = (quote(client_id, safe=""), quote(client_secret, safe=""))
    http = make_http_client(
        transport, read_timeout=EXCHANGE_TIMEOUT_SECONDS, max_connections=2, trust_env=True
    )
    try:
        async with http:
            return await http.post(
                endpoint,
                data=body,
                auth=auth if auth is not None else httpx2.USE_CLIENT_DEFAULT,
                headers={"Accept": "application/json"},
                timeout=EXCHANGE_TIMEOUT_SECONDS,
            )
    except httpx2.HTTPError as exc:
        raise TokenEndpointError(f"the {what} cannot be reached ({type(exc).__name__})") from exc


def _json_of(answer: httpx2.Response, what: str) -> dict[str, Any]:
    if len(answer.content) > MAX_ANSWER_BYTES:
        raise TokenEndpointError(f"the {what} answered {len(answer.content)} bytes, too many")
    try:
        data = answer.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise TokenEndpointError(f"the {what} answered {answer.status_code} without a JSON object")
    return data


def _code(data: Mapping[str, Any]) -> str:
    """The ``error`` code of an answer, if it is a short printable one (never more of the answer)."""
    error = data.get("error")
    return error[:40] if isinstance(error, str) and error.isprintable() else "no error code"


__all__ = ["EXCHANGE_TIMEOUT_SECONDS", "TokenEndpointError", "exchange_code", "introspect"]

"""An OAuth token endpoint, as a client: one authorization-code exchange (RFC 6749 §4.1.3, with the
PKCE verifier of RFC 7636 and the resource indicator of RFC 8707). The run pages' sign-in
(:mod:`server.web.sign_in`) uses it; it lives here because all of the project's HTTP client code
does.

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
            answer = await http.post(
                token_endpoint,
                data=body,
                auth=auth if auth is not None else httpx2.USE_CLIENT_DEFAULT,
                headers={"Accept": "application/json"},
                timeout=EXCHANGE_TIMEOUT_SECONDS,
            )
    except httpx2.HTTPError as exc:
        raise TokenEndpointError(f"the token endpoint cannot be reached ({type(exc).__name__})") from exc
    return _answer(answer)


def _answer(answer: httpx2.Response) -> dict[str, Any]:
    if len(answer.content) > MAX_ANSWER_BYTES:
        raise TokenEndpointError(f"the token endpoint answered {len(answer.content)} bytes, too many")
    try:
        data = answer.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise TokenEndpointError(f"the token endpoint answered {answer.status_code} without a JSON object")
    if answer.status_code != 200:
        error = data.get("error")
        code = error[:40] if isinstance(error, str) and error.isprintable() else "no error code"
        raise TokenEndpointError(f"the token endpoint refused the code: {answer.status_code} {code!r}")
    if not isinstance(data.get("access_token"), str) or not data["access_token"]:
        raise TokenEndpointError("the token endpoint's answer has no access_token")
    return data


__all__ = ["EXCHANGE_TIMEOUT_SECONDS", "TokenEndpointError", "exchange_code"]

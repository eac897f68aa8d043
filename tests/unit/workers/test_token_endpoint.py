"""The token endpoint's client (the run pages' code exchange) against ``httpx2.MockTransport``: how a
public and a confidential client authenticate, and refusals whose messages carry no secret, code or
token."""

from __future__ import annotations

import base64
from urllib.parse import parse_qs

import httpx2
import pytest

from orchestration.workers import TokenEndpointError, exchange_code

ENDPOINT = "https://idp.example/token"
SECRET = "s3cret/with:chars+" + "0a9b"
CODE = "the-code-" + "5c2e"
FORM = {
    "grant_type": "authorization_code",
    "code": CODE,
    "redirect_uri": "https://c.example/runs/callback",
    "code_verifier": "v" * 43,
    "resource": "https://c.example/mcp",
}


def recording(status: int, body: object, seen: list[httpx2.Request]) -> httpx2.MockTransport:
    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(status, json=body)

    return httpx2.MockTransport(answer)


async def test_a_public_client_sends_its_id_in_the_form() -> None:
    seen: list[httpx2.Request] = []
    transport = recording(200, {"access_token": "at", "token_type": "Bearer"}, seen)
    answer = await exchange_code(ENDPOINT, FORM, client_id="pages", client_secret=None, transport=transport)
    assert answer["access_token"] == "at"
    (request,) = seen
    form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
    assert form == {**FORM, "client_id": "pages"}
    assert "authorization" not in request.headers


async def test_a_confidential_client_uses_http_basic() -> None:
    seen: list[httpx2.Request] = []
    transport = recording(200, {"access_token": "at"}, seen)
    await exchange_code(ENDPOINT, FORM, client_id="pages", client_secret=SECRET, transport=transport)
    (request,) = seen
    scheme, _, encoded = request.headers["authorization"].partition(" ")
    # RFC 6749 §2.3.1: id and secret form-encoded, then Basic.
    assert scheme == "Basic"
    assert base64.b64decode(encoded).decode() == "pages:s3cret%2Fwith%3Achars%2B0a9b"
    assert "client_id" not in parse_qs(request.content.decode()) and SECRET not in request.content.decode()


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (400, {"error": "invalid_grant", "error_description": f"bad code {CODE}"}, "400 'invalid_grant'"),
        (401, {"error": "invalid_client"}, "401 'invalid_client'"),
        (200, {"token_type": "Bearer"}, "no access_token"),
        (502, ["not", "an", "object"], "502 without a JSON object"),
    ],
)
async def test_a_refusal_says_why_and_nothing_secret(status: int, body: object, said: str) -> None:
    transport = recording(status, body, [])
    with pytest.raises(TokenEndpointError) as caught:
        await exchange_code(ENDPOINT, FORM, client_id="pages", client_secret=SECRET, transport=transport)
    assert said in str(caught.value)
    assert SECRET not in str(caught.value) and CODE not in str(caught.value)


async def test_an_unreachable_endpoint() -> None:
    def fail(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused", request=request)

    with pytest.raises(TokenEndpointError, match="cannot be reached"):
        await exchange_code(
            ENDPOINT, FORM, client_id="p", client_secret=None, transport=httpx2.MockTransport(fail)
        )

"""The server as an OAuth resource server: a real server subprocess over Streamable HTTP with an
``[auth]`` issuer — the stand-in of tests/acceptance/oauth_issuer.py, a real HTTP server on 127.0.0.1
serving its discovery document and key set — and a static token beside it. The refusal table (each
a 401 or 403 with the RFC 6750 challenge, leaking no run content), rotated keys, the
protected-resource metadata, and an issuer's identity doing what a static token's identity does
(own runs only, decisions recorded as verified)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import jwt
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from pydantic import AnyUrl

from tests.acceptance.harness import (
    call,
    call_error,
    free_port,
    full_view,
    gated_chain_to_end,
    play_host,
    read_log,
)
from tests.acceptance.oauth_issuer import Issuer, running_issuer
from tests.acceptance.test_cli import cli
from tests.acceptance.test_mcp_http import http_server_on

pytestmark = pytest.mark.slow

STATIC = "ci-token-" + "7d2f9a0c4e6b1835"
REQUEST = "Secret plans: " + "the run content no refusal may show."
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "refusals", "version": "1"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    with running_issuer() as running:
        yield running


def config(issuer: Issuer, port: int, *, own_runs_only: bool = False, static: bool = True) -> str:
    tokens = f"""
[tokens.ci]
token = "{STATIC}"
roles = ["read", "operate", "approve"]
"""
    return f"""{tokens if static else ""}
[auth]
issuer = "{issuer.url}"
audience = "http://127.0.0.1:{port}/mcp"
identity_claim = "email"
own_runs_only = {str(own_runs_only).lower()}
keys_refresh_cooldown_seconds = 0
"""


@asynccontextmanager
async def oauth_server(
    home: Path, issuer: Issuer, transport: str = "streamable-http", **options: Any
) -> AsyncIterator[str]:
    """The server on a free port with ``[auth]`` naming ``issuer``; yields its ``/mcp`` URL."""
    port = free_port()
    (home / "construct.toml").write_text(config(issuer, port, **options))
    async with http_server_on(port, home, transport):
        yield f"http://127.0.0.1:{port}/mcp"


@asynccontextmanager
async def as_bearer(url: str, token: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as authed,
        Client(streamable_http_client(url, http_client=authed)) as client,
    ):
        yield client


async def post_initialize(url: str, token: str | None) -> httpx2.Response:
    headers = dict(MCP_HEADERS) | ({} if token is None else {"Authorization": f"Bearer {token}"})
    async with httpx2.AsyncClient() as http:
        return await http.post(url, json=INITIALIZE, headers=headers)


def challenge(response: httpx2.Response) -> str:
    value = response.headers.get("www-authenticate")
    assert value is not None and value.startswith("Bearer "), response.headers
    return value


async def test_the_refusal_table_rotation_and_metadata(tmp_path: Path, issuer: Issuer) -> None:
    async with oauth_server(tmp_path, issuer) as url:
        audience = url
        metadata_url = url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")

        # The protected-resource metadata, at its path form and at the root, without a token.
        async with httpx2.AsyncClient() as http:
            documents = [(await http.get(u)) for u in (metadata_url, metadata_url.removesuffix("/mcp"))]
        for answer in documents:
            assert answer.status_code == 200, answer.text
            document = answer.json()
            assert document["resource"] == audience
            assert document["authorization_servers"] == [issuer.url]
            scopes = ["construct:approve", "construct:operate", "construct:read"]
            assert document["scopes_supported"] == scopes
            assert document["bearer_methods_supported"] == ["header"]

        # A valid token: a tool call works, and the run is the identity claim's.
        async with as_bearer(url, issuer.token(audience)) as alice:
            view = await call(alice, "orchestrate_start", request=REQUEST, approve_before=["engineer"])
            run_id = view["run_id"]
            assert (await full_view(alice, run_id))["started_by"] == "alice@example.com"
        assert issuer.fetches == {"openid-configuration": 1, "jwks": 1}

        # No token: 401 naming the metadata, no error code (RFC 6750 §3.1).
        missing = await post_initialize(url, None)
        assert missing.status_code == 401
        assert challenge(missing) == f'Bearer resource_metadata="{metadata_url}"'

        refusals = {
            "expired": issuer.token(audience, iat=1_000_000, exp=1_000_300),
            "not yet valid": issuer.token(audience, nbf=4_000_000_000),
            "wrong audience": issuer.token("http://127.0.0.1:1/mcp"),
            "wrong issuer": issuer.token(audience, iss="http://127.0.0.1:1"),
            "bad signature": issuer.forged(audience),
            "alg none": issuer.unsigned(audience),
            "HS256 with the public key": issuer.hs256_with_public_key(audience),
            "not a JWT": "x" * 40,
        }
        for name, token in refusals.items():
            answer = await post_initialize(url, token)
            assert answer.status_code == 401, (name, answer.status_code, answer.text)
            value = challenge(answer)
            assert f'resource_metadata="{metadata_url}"' in value, name
            assert 'error="invalid_token"' in value, name
            assert answer.json()["error"] == "invalid_token", name
            assert run_id not in answer.text and "Secret plans" not in answer.text, name

        # A token that gives no role: 403 insufficient_scope, naming the scopes.
        answer = await post_initialize(url, issuer.token(audience, scope="openid profile"))
        assert answer.status_code == 403
        value = challenge(answer)
        assert 'error="insufficient_scope"' in value
        assert 'scope="construct:approve construct:operate construct:read"' in value
        assert run_id not in answer.text

        # A token with some roles but not the one a tool needs: the tool's coded error.
        async with as_bearer(url, issuer.token(audience, scope="construct:read")) as reader:
            assert (await call(reader, "run_status", run_id=run_id))["status"] == "awaiting_host"
            text = await call_error(reader, "orchestrate_start", request="Not a reader's to start.")
            assert text.startswith("forbidden: ") and "needs the role 'operate'" in text, text
            assert "identity 'alice@example.com' has read" in text

        # The static token still works, beside the issuer's.
        async with as_bearer(url, STATIC) as ci:
            assert (await full_view(ci, run_id))["started_by"] == "alice@example.com"

        # Rotation: the new key (an unknown kid) is fetched and accepted; the old one, gone from the
        # key set, is refused.
        old = issuer.rotate()
        async with as_bearer(url, issuer.token(audience)) as alice:
            assert (await call(alice, "run_status", run_id=run_id))["run_id"] == run_id
        answer = await post_initialize(url, issuer.token(audience, key=old))
        assert answer.status_code == 401
        assert 'error="invalid_token"' in challenge(answer)
        assert issuer.fetches["openid-configuration"] == 1
        assert issuer.fetches["jwks"] >= 2

    log = read_log(tmp_path / "server.log")
    assert "token_refused" in log
    for token in refusals.values():
        assert token not in log


async def test_an_issuer_identity_does_what_a_token_identity_does(tmp_path: Path, issuer: Issuer) -> None:
    """Own runs only, and a decision recorded with the verified identity of the token's claim."""
    async with oauth_server(tmp_path, issuer, own_runs_only=True) as url:
        alice_token = issuer.token(url, email="alice@example.com", sub="alice-1")
        bob_token = issuer.token(url, email="bob@example.com", sub="bob-2")
        async with as_bearer(url, alice_token) as alice, as_bearer(url, bob_token) as bob:
            view = await call(alice, "orchestrate_start", request=REQUEST, approve_before=["engineer"])
            run_id = view["run_id"]
            view = await play_host(alice, view)
            gate = view["next_action"]["gate_id"]

            # bob, limited to his own runs, neither sees nor decides alice's.
            text = await call_error(bob, "run_status", run_id=run_id)
            assert text.startswith("forbidden: ") and "bob@example.com" in text, text
            assert "Secret plans" not in text
            assert (await call(bob, "runs_list"))["runs"] == []
            approve = {"run_id": run_id, "decision": "approve", "gate_id": gate}
            text = await call_error(bob, "orchestrate_approve", **approve)
            assert text.startswith("forbidden: "), text

            view = await call(
                alice, "orchestrate_approve", run_id=run_id, decision="approve", gate_id=gate, wait_seconds=0
            )
            decided = next(g for g in view["gates"] if g["gate_id"] == gate)
            assert (decided["approver"], decided["channel"], decided["verified"]) == (
                "alice@example.com",
                "http",
                True,
            )
            assert [r["run_id"] for r in (await call(alice, "runs_list"))["runs"]] == [run_id]
    # runs audit names the claim's identity, verified, for each of her actions; never a token.
    audited = cli(tmp_path, "runs", "audit", run_id, "--json")
    assert audited.returncode == 0, audited.stderr
    entries = json.loads(audited.stdout)
    assert [(e["action"], e["by"], e["verified"]) for e in entries] == [
        ("started (chain default)", "alice@example.com", True),
        ("output handed in for architect", "alice@example.com", True),
        (f"gate {gate} approved", "alice@example.com", True),
    ]
    assert alice_token not in audited.stdout and bob_token not in audited.stdout


async def test_an_issuer_alone_guards_mcp_and_the_run_pages(tmp_path: Path, issuer: Issuer) -> None:
    """Without static tokens, the issuer's tokens are the only way in: ``/mcp`` and the run pages'
    API refuse a request without one, and the pages' session names the claim's identity."""
    async with oauth_server(tmp_path, issuer, static=False) as url:
        base = url.removesuffix("/mcp")
        assert (await post_initialize(url, None)).status_code == 401
        token = issuer.token(url, scope="construct:read")
        async with httpx2.AsyncClient(base_url=base) as http:
            refused = await http.get("/runs/api/runs")
            assert refused.status_code == 401
            assert "resource_metadata=" in challenge(refused)
            bad = await http.get("/runs/api/runs", headers={"Authorization": f"Bearer {issuer.forged(url)}"})
            assert bad.status_code == 401 and 'error="invalid_token"' in challenge(bad)
            session = await http.get("/runs/api/session", headers={"Authorization": f"Bearer {token}"})
            assert session.status_code == 200
            assert session.json() == {
                "auth_required": True,
                "identity": "alice@example.com",
                "roles": ["read"],
                "own_runs_only": False,
            }

        # A Streamable HTTP session belongs to the identity that opened it.
        opened = await post_initialize(url, token)
        assert opened.status_code == 200, opened.text
        session_id = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        async with httpx2.AsyncClient() as http:
            for who, status in ((issuer.token(url, email="bob@example.com", sub="bob-2"), 404), (token, 200)):
                headers = MCP_HEADERS | {"Authorization": f"Bearer {who}", "mcp-session-id": session_id}
                answer = await http.post(url, json=listing, headers=headers)
                assert answer.status_code == status, (status, answer.text)


async def test_the_sse_transport_takes_the_same_tokens(tmp_path: Path, issuer: Issuer) -> None:
    async with oauth_server(tmp_path, issuer, "sse", static=False) as url:
        base = url.removesuffix("/mcp")
        async with httpx2.AsyncClient(base_url=base) as http:
            assert (await http.get("/.well-known/oauth-protected-resource/mcp")).status_code == 200
            refused = await http.get("/sse")
            assert refused.status_code == 401 and "resource_metadata=" in challenge(refused)
            expired = issuer.token(url, iat=1_000_000, exp=1_000_300)
            refused = await http.get("/sse", headers={"Authorization": f"Bearer {expired}"})
            assert refused.status_code == 401 and 'error="invalid_token"' in challenge(refused)
            headers = {"Authorization": f"Bearer {issuer.token(url)}"}
            async with http.stream("GET", "/sse", headers=headers) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")


class MemoryStorage:
    """The SDK client's token storage, in memory, holding the pre-registered client."""

    def __init__(self, client: OAuthClientInformationFull) -> None:
        self.tokens: OAuthToken | None = None
        self.client = client

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


async def test_the_sdk_oauth_client_signs_in_and_runs_a_gated_chain(tmp_path: Path, issuer: Issuer) -> None:
    """The flow a remote host does, with the MCP SDK's OAuth client: our 401, the protected-resource
    metadata, the issuer's metadata, authorization code with PKCE and the resource indicator (the
    person's consent automated by the stand-in), then a gated chain to its end as that person."""
    async with oauth_server(tmp_path, issuer, static=False) as url:
        redirected: list[str] = []

        async def redirect_handler(authorization_url: str) -> None:
            async with httpx2.AsyncClient() as http:  # the browser: follows to the redirect URI
                answer = await http.get(authorization_url)
            assert answer.status_code == 302, answer.text
            redirected.append(answer.headers["location"])

        async def callback_handler() -> AuthorizationCodeResult:
            query = parse_qs(urlsplit(redirected[-1]).query)
            return AuthorizationCodeResult(code=query["code"][0], state=query["state"][0])

        client_info = OAuthClientInformationFull(
            client_id=issuer.client_id,
            redirect_uris=[AnyUrl(issuer.redirect_uri)],
            token_endpoint_auth_method="none",
            grant_types=["authorization_code"],
        )
        storage = MemoryStorage(client_info)
        auth = OAuthClientProvider(
            server_url=url,
            client_metadata=OAuthClientMetadata(redirect_uris=[AnyUrl(issuer.redirect_uri)]),
            storage=storage,
            redirect_handler=redirect_handler,
            callback_handler=callback_handler,
        )
        async with (
            httpx2.AsyncClient(auth=auth) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            record, gate = await gated_chain_to_end(client, "Signed in.")
            assert record["started_by"] == "erin@example.com"
            decided = next(g for g in record["gates"] if g["gate_id"] == gate)
            assert (decided["approver"], decided["verified"]) == ("erin@example.com", True)

        # One sign-in: a token for this server (the resource the client asked for), every scope the
        # metadata offered.
        assert issuer.fetches["authorize"] == 1 and issuer.fetches["token"] == 1
        assert storage.tokens is not None
        claims = jwt.decode(storage.tokens.access_token, options={"verify_signature": False})
        assert claims["aud"] == url
        assert sorted(claims["scope"].split()) == ["construct:approve", "construct:operate", "construct:read"]

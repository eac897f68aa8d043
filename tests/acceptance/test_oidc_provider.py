"""The server behind a real, certified authorization server: ``oidc-provider`` (npm, pinned in
tests/oidc with the Node 22 it runs on; tests/oidc/provider.mjs configures it as a team would: one
public client with PKCE, resource indicators giving JWT access tokens for this server's ``/mcp``).

The flow a remote host does, with the official MCP Python SDK's OAuth client: our 401, the
protected-resource metadata, the provider's metadata, authorization code with PKCE and the resource
indicator, the person's sign-in and consent on the provider's own pages (filled in here as a
browser would), then a chain with a gate run to its end over Streamable HTTP, the decisions recorded
as the signed-in identity, verified. And the provider's tokens refused where they must be: another
resource's token (wrong audience), one after the provider's keys changed (bad signature), an
expired one. Skips without the npm install (``npm ci`` in tests/oidc), fails under ``CI=true``."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractContextManager, AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import anyio
import httpx2
import jwt
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata
from pydantic import AnyUrl

from tests.acceptance.harness import REPO, free_port, full_view, gated_chain_to_end, read_log
from tests.acceptance.node_tools import SUITE_DIR
from tests.acceptance.node_tools import require as require_node
from tests.acceptance.test_mcp_http import http_server_on
from tests.acceptance.test_oauth_tokens import MemoryStorage, post_initialize
from tests.acceptance.test_page_sign_in import COOKIE

pytestmark = pytest.mark.slow

OIDC_DIR = REPO / "tests" / "oidc"
NODE = OIDC_DIR / "node_modules" / ".bin" / "node"
CLIENT_ID = "construct-host"
PERSON = "dana"
ALL_SCOPES = "construct:read construct:operate construct:approve"
REQUEST = "A feature only the signed-in may read about."


def require_provider() -> None:
    """Skip locally, fail under ``CI=true``, without the pinned provider and Node."""
    require_node("oidc-provider", "oidc-provider", OIDC_DIR)


@contextmanager
def running_provider(
    port: int,
    resources: str,
    redirect_uri: str,
    log: Path,
    page_redirect_uri: str = "",
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """oidc-provider on ``port`` for ``resources`` (comma-separated), with the run pages' client
    when ``page_redirect_uri`` is given; yields its issuer URL."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(NODE), "provider.mjs", str(port), resources, redirect_uri, page_redirect_uri],
            cwd=OIDC_DIR,
            stdout=subprocess.PIPE,
            stderr=out,
            text=True,
            env={**os.environ, **(env or {})},
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.strip() == "listening", f"the provider did not start:\n{log.read_text()}"
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=20)
            if process.stdout is not None:
                process.stdout.close()


INTROSPECTION_SECRET = "introspection-" + secrets.token_hex(12)
OPAQUE_ENV = {"OPAQUE": "1", "INTROSPECTION_SECRET": INTROSPECTION_SECRET}
INTROSPECTION = """
introspection_client_id = "construct-server"
introspection_client_secret_env = "INTROSPECTION_SECRET"
introspection_cache_seconds = 1
"""


def config(issuer: str, audience: str, *, opaque: bool = False) -> str:
    return f"""
[auth]
issuer = "{issuer}"
audience = "{audience}"
keys_refresh_cooldown_seconds = 0
keys_cache_seconds = 1
page_client_id = "construct-runs"
{INTROSPECTION if opaque else ""}"""


@dataclass
class Team:
    """The server (its ``/mcp`` URL) in front of the provider, which :meth:`rotate` restarts."""

    url: str
    redirect_uri: str
    provider_port: int
    resources: str
    log: Path
    stack: ExitStack
    env: dict[str, str]

    @property
    def base(self) -> str:
        return self.url.removesuffix("/mcp")

    def provider(self) -> AbstractContextManager[str]:
        page = f"{self.base}/runs/callback"
        return running_provider(
            self.provider_port, self.resources, self.redirect_uri, self.log, page, self.env
        )

    def rotate(self) -> None:
        """Restart the provider on its port: new signing keys (and no memory of past tokens)."""
        self.stack.close()
        self.stack.enter_context(self.provider())


@asynccontextmanager
async def team_server(tmp_path: Path, *, opaque: bool = False) -> AsyncIterator[Team]:
    """The provider and the server in front of it; with ``opaque``, the provider's tokens for the
    server are opaque and the server introspects them."""
    require_provider()
    server_port, provider_port = free_port(), free_port()
    audience = f"http://127.0.0.1:{server_port}/mcp"
    (tmp_path / "construct.toml").write_text(
        config(f"http://127.0.0.1:{provider_port}", audience, opaque=opaque)
    )
    env = dict(OPAQUE_ENV) if opaque else {}
    redirect_uri = f"http://127.0.0.1:{free_port()}/callback"
    resources = f"{audience},http://127.0.0.1:{server_port}/other"
    with ExitStack() as stack:
        team = Team(audience, redirect_uri, provider_port, resources, tmp_path / "provider.log", stack, env)
        stack.enter_context(team.provider())
        async with http_server_on(server_port, tmp_path, "streamable-http", env=env):
            yield team


_FORM = re.compile(r'<form[^>]*action="(?P<action>[^"]*)"[^>]*>(?P<body>.*?)</form>', re.S)
_INPUT = re.compile(r"<input[^>]*>")
_ATTR = re.compile(r'(\w+)="([^"]*)"')


async def sign_in(
    authorization_url: str, redirect_uri: str, browser: httpx2.AsyncClient | None = None
) -> str:
    """What a person's browser (``browser``, else a new one) does with ``authorization_url``:
    follow the provider's redirects, sign in as :data:`PERSON` on its login page and consent on its
    consent page; returns the URL the provider finally sends the browser to (``redirect_uri`` with
    the code)."""
    async with AsyncExitStack() as stack:
        if browser is None:
            browser = await stack.enter_async_context(httpx2.AsyncClient())
        response = await browser.get(authorization_url)
        for _ in range(12):
            if response.status_code in (302, 303):
                location = urljoin(str(response.url), response.headers["location"])
                if location.startswith(redirect_uri):
                    return location
                response = await browser.get(location)
                continue
            assert response.status_code == 200, response.text
            form = _FORM.search(response.text)
            assert form is not None, response.text
            fields = {}
            for tag in _INPUT.findall(form.group("body")):
                attrs = dict(_ATTR.findall(tag))
                if "name" in attrs:
                    fields[attrs["name"]] = html.unescape(attrs.get("value", ""))
            if "login" in fields:
                fields |= {"login": PERSON, "password": "any"}
            action = urljoin(str(response.url), html.unescape(form.group("action")))
            response = await browser.post(action, data=fields)
    raise AssertionError("the provider never sent the browser back")


async def test_a_remote_host_signs_in_and_runs_a_gated_chain(tmp_path: Path) -> None:
    async with team_server(tmp_path) as team:
        url, redirect_uri = team.url, team.redirect_uri
        landed: list[str] = []

        async def redirect_handler(authorization_url: str) -> None:
            landed.append(await sign_in(authorization_url, redirect_uri))

        async def callback_handler() -> AuthorizationCodeResult:
            query = parse_qs(urlsplit(landed[-1]).query)
            # RFC 9207: the provider names itself in the response; the SDK checks it
            return AuthorizationCodeResult(
                code=query["code"][0], state=query["state"][0], iss=query["iss"][0]
            )

        storage = MemoryStorage(
            OAuthClientInformationFull(
                client_id=CLIENT_ID,
                redirect_uris=[AnyUrl(redirect_uri)],
                token_endpoint_auth_method="none",
                grant_types=["authorization_code"],
            )
        )
        auth = OAuthClientProvider(
            server_url=url,
            client_metadata=OAuthClientMetadata(redirect_uris=[AnyUrl(redirect_uri)]),
            storage=storage,
            redirect_handler=redirect_handler,
            callback_handler=callback_handler,
        )
        async with (
            httpx2.AsyncClient(auth=auth, timeout=60) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            record, gate = await gated_chain_to_end(client, REQUEST)
        assert len(landed) == 1, "one sign-in"
        assert record["started_by"] == PERSON
        decided = next(g for g in record["gates"] if g["gate_id"] == gate)
        assert (decided["approver"], decided["verified"]) == (PERSON, True)

        assert storage.tokens is not None
        token = storage.tokens.access_token
        claims = jwt.decode(token, options={"verify_signature": False})
        header = jwt.get_unverified_header(token)
        assert claims["aud"] == url and header["alg"] == "ES256" and header["typ"] == "at+jwt"
        assert sorted(claims["scope"].split()) == ["construct:approve", "construct:operate", "construct:read"]

        # The provider's token for this resource opens /mcp; altered, it is refused and shows nothing.
        assert (await post_initialize(url, token)).status_code == 200
        forged = token[:-8] + ("A" * 8 if not token.endswith("A" * 8) else "B" * 8)
        refused = await post_initialize(url, forged)
        assert refused.status_code == 401 and REQUEST not in refused.text
        assert token not in read_log(tmp_path / "server.log")

        # The provider's keys change (restarted with new ones): once the key set is fetched again,
        # the old token's key is not in it, so the token is refused (a revoked key); a token signed
        # with a new key is taken.
        team.rotate()
        await anyio.sleep(1.2)  # keys_cache_seconds: the old key set is not trusted past it
        stale = await post_initialize(url, token)
        assert stale.status_code == 401 and REQUEST not in stale.text
        fresh = await _token_for(await _issuer(url), url, redirect_uri)
        assert jwt.get_unverified_header(fresh)["kid"] != header["kid"]
        assert (await post_initialize(url, fresh)).status_code == 200


async def test_tokens_of_the_provider_this_server_must_refuse(tmp_path: Path) -> None:
    """The same provider's tokens, refused here: one issued for another resource it serves (the
    wrong audience), and no token at all for a resource it does not serve (``invalid_target``).
    Neither shows the run's content, and neither is recorded."""
    async with team_server(tmp_path) as team:
        url, redirect_uri = team.url, team.redirect_uri
        issuer = await _issuer(url)
        other = url.replace("/mcp", "/other")
        token = await _token_for(issuer, other, redirect_uri)
        assert jwt.decode(token, options={"verify_signature": False})["aud"] == other
        refused = await post_initialize(url, token)
        assert refused.status_code == 401 and 'error="invalid_token"' in refused.headers["www-authenticate"]

        unknown = url.replace("/mcp", "/unknown")
        landed = await sign_in(_authorize_url(issuer, unknown, redirect_uri, "v" * 64), redirect_uri)
        back = parse_qs(urlsplit(landed).query)
        assert "code" not in back and back["error"] == ["invalid_target"], back
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def _authorize_url(
    issuer: str, resource: str, redirect_uri: str, verifier: str, scope: str = "construct:read"
) -> str:
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    query = {
        "client_id": CLIENT_ID,
        "response_type": "code",
        "redirect_uri": redirect_uri,
        "scope": scope,
        "resource": resource,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": secrets.token_urlsafe(8),
    }
    return str(httpx2.URL(f"{issuer}/auth", params=query))


async def _token_for(issuer: str, resource: str, redirect_uri: str, scope: str = "construct:read") -> str:
    """An access token of ``issuer`` for ``resource`` and ``scope``: a person signs in, the code is
    exchanged."""
    verifier = secrets.token_urlsafe(48)
    landed = await sign_in(_authorize_url(issuer, resource, redirect_uri, verifier, scope), redirect_uri)
    code = parse_qs(urlsplit(landed).query)["code"][0]
    async with httpx2.AsyncClient() as http:
        answer = await http.post(
            f"{issuer}/token",
            data={
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": redirect_uri,
                "client_id": CLIENT_ID,
                "code_verifier": verifier,
                "resource": resource,
            },
        )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["access_token"])


async def _issuer(url: str) -> str:
    """The issuer the server's protected-resource metadata names."""
    async with httpx2.AsyncClient() as http:
        resource = (await http.get(url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp"))).json()
    return str(resource["authorization_servers"][0]).rstrip("/")


async def test_the_typescript_sdk_signs_in_the_same_way(tmp_path: Path) -> None:
    """The TypeScript MCP SDK's OAuth client (tests/conformance/oauth_host.mjs): from our 401 to
    the provider's pages (discovery, PKCE), one sign-in, then a gated chain to its end as the person."""
    require_node("node", "the TypeScript MCP SDK")
    async with team_server(tmp_path) as team:
        done = await anyio.run_process(
            [
                str(SUITE_DIR / "node_modules" / ".bin" / "node"),
                "oauth_host.mjs",
                team.url,
                CLIENT_ID,
                team.redirect_uri,
                PERSON,
            ],
            cwd=SUITE_DIR,
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode()
        summary = json.loads(done.stdout.decode().strip().splitlines()[-1])
        assert summary["status"] == "completed" and summary["sign_ins"] == 1, summary
        async with httpx2.AsyncClient() as http:
            issued = await _token_for(await _issuer(team.url), team.url, team.redirect_uri)
            http.headers["Authorization"] = f"Bearer {issued}"
            async with Client(streamable_http_client(team.url, http_client=http)) as client:
                record = await full_view(client, summary["run_id"])
    assert record["started_by"] == PERSON
    assert [(g["approver"], g["verified"]) for g in record["gates"]] == [(PERSON, True)]


async def test_the_run_pages_sign_a_person_in_through_the_provider(tmp_path: Path) -> None:
    """The run pages' own sign-in (``page_client_id``) through the certified provider: the page
    sends the browser to the provider (PKCE, nonce, the resource), the person signs in and
    consents, the callback checks the access token and the ID token's nonce and opens a session;
    after sign-out the same cookie opens nothing."""
    async with team_server(tmp_path) as team, httpx2.AsyncClient(follow_redirects=False) as browser:
        base = team.base
        started = await browser.get(f"{base}/runs")
        assert started.status_code == 303 and started.headers["location"].startswith(await _issuer(team.url))
        callback = await sign_in(started.headers["location"], f"{base}/runs/callback", browser)
        signed_in = await browser.get(callback)
        assert signed_in.status_code == 303, signed_in.text
        session = browser.cookies.get(COOKIE)
        assert session
        who = (await browser.get(f"{base}/runs/api/session")).json()
        assert who["identity"] == PERSON and who["roles"] == ["approve", "operate", "read"]
        assert (await browser.get(f"{base}/runs/api/runs")).status_code == 200
        out = await browser.post(f"{base}/runs/sign-out", json={}, headers={"Origin": base})
        assert out.status_code == 200
        async with httpx2.AsyncClient(cookies={COOKIE: session}) as replay:
            assert (await replay.get(f"{base}/runs/api/runs")).status_code == 401


async def test_opaque_tokens_are_introspected(tmp_path: Path) -> None:
    """A provider whose tokens for this server are opaque: each is introspected (RFC 7662) as the
    confidential client ``construct-server``, taken while the provider says it is active and names
    this server in ``aud``; revoked at the provider, it is refused once the kept answer expires."""
    async with team_server(tmp_path, opaque=True) as team:
        issuer = await _issuer(team.url)
        token = await _token_for(issuer, team.url, team.redirect_uri, ALL_SCOPES)
        assert token.count(".") != 2, "an opaque token"
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
            Client(streamable_http_client(team.url, http_client=http)) as client,
        ):
            record, _ = await gated_chain_to_end(client, REQUEST)
        assert record["status"] == "completed" and record["started_by"] == PERSON

        # A JWT of the same provider for another resource is still checked as a JWT and refused.
        other = await _token_for(issuer, team.url.replace("/mcp", "/other"), team.redirect_uri)
        assert (await post_initialize(team.url, other)).status_code == 401

        async with httpx2.AsyncClient() as http:
            revoked = await http.post(
                f"{issuer}/token/revocation", data={"token": token, "client_id": CLIENT_ID}
            )
        assert revoked.status_code == 200, revoked.text
        await anyio.sleep(1.2)  # introspection_cache_seconds
        refused = await post_initialize(team.url, token)
        assert refused.status_code == 401 and REQUEST not in refused.text
        log = read_log(tmp_path / "server.log")
        assert token not in log and INTROSPECTION_SECRET not in log
        assert "not active" in log

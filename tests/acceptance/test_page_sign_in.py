"""The run pages sign a person in through the ``[auth]`` issuer: a real server subprocess, the
stand-in issuer of tests/acceptance/oauth_issuer.py (a real HTTP server on 127.0.0.1, consent given
at once) and an httpx client acting as the browser, redirect by redirect. The whole sign-in
(authorization code with PKCE), the cookies' attributes, a page and the API read with the session, a
decision recorded with the identity verified, sign-out, and the refusals: the cookie replayed after
sign-out, an expired session, a state or PKCE mismatch, a code from another browser, a cross-site
decision; none shows a run's content or records anything, and a confidential client's secret is
never in the log."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import pytest

from tests.acceptance.harness import free_port, full_view, read_log
from tests.acceptance.oauth_issuer import Issuer, running_issuer
from tests.acceptance.test_mcp_http import http_server_on
from tests.acceptance.test_oauth_tokens import STATIC, as_bearer
from tests.browser.test_run_pages import gated_run

pytestmark = pytest.mark.slow

CLIENT_ID = "construct-runs"
SECRET = "page-client-secret-" + "4f1c9a7e2b6d8035"
COOKIE = "construct-runs"
BINDING = "construct-sign-in"
CONTENT = "rate limiter"  # in the gated run's request: no refusal may show it


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    with running_issuer() as running:
        yield running


@asynccontextmanager
async def signing_server(
    home: Path, issuer: Issuer, *, secret: bool = False, extra: str = ""
) -> AsyncIterator[str]:
    """The server with page sign-in through ``issuer`` (and a static token; ``extra`` lines in
    ``[auth]``); yields its base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    issuer.client_id, issuer.redirect_uri = CLIENT_ID, f"{base}/runs/callback"
    issuer.client_secret = SECRET if secret else None
    confidential = 'page_client_secret_env = "PAGE_SECRET"\n' if secret else ""
    (home / "construct.toml").write_text(
        f"""
[tokens.ci]
token = "{STATIC}"
roles = ["read", "operate", "approve"]

[auth]
issuer = "{issuer.url}"
audience = "{base}/mcp"
identity_claim = "email"
page_client_id = "{CLIENT_ID}"
{confidential}{extra}"""
    )
    async with http_server_on(port, home, "streamable-http", env={"PAGE_SECRET": SECRET} if secret else None):
        yield base


def set_cookies(answer: httpx2.Response) -> dict[str, Any]:
    """The answer's ``Set-Cookie`` headers, parsed: name -> morsel."""
    cookies: dict[str, Any] = {}
    for header in answer.headers.get_list("set-cookie"):
        parsed = SimpleCookie()
        parsed.load(header)
        cookies.update(parsed)
    return cookies


async def to_issuer(browser: httpx2.AsyncClient, path: str) -> httpx2.Response:
    """Open ``path`` without a session: the redirect to the issuer."""
    answer = await browser.get(path)
    assert answer.status_code == 303, answer.text
    return answer


async def consent(browser: httpx2.AsyncClient, authorize_url: str) -> str:
    """The issuer signs the person in at once: the callback URL it sends the browser to."""
    answer = await browser.get(authorize_url)
    assert answer.status_code == 302, answer.text
    return answer.headers["location"]


async def sign_in(browser: httpx2.AsyncClient, path: str = "/runs") -> httpx2.Response:
    """The whole sign-in from ``path``: the callback's answer (a session, a redirect back)."""
    started = await to_issuer(browser, path)
    answer = await browser.get(await consent(browser, started.headers["location"]))
    assert answer.status_code == 303, answer.text
    return answer


async def test_a_person_signs_in_decides_and_signs_out(tmp_path: Path, issuer: Issuer) -> None:
    async with signing_server(tmp_path, issuer) as base, as_bearer(f"{base}/mcp", STATIC) as ci:
        run_id = await gated_run(ci)
        async with httpx2.AsyncClient(base_url=base) as browser:
            # No session: the page sends the browser to the issuer, with PKCE, state, nonce and the
            # resource; the sign-in is bound to this browser by an HttpOnly cookie.
            started = await to_issuer(browser, f"/runs/{run_id}")
            location = urlsplit(started.headers["location"])
            assert f"{location.scheme}://{location.netloc}{location.path}" == f"{issuer.url}/authorize"
            asked = {k: v[0] for k, v in parse_qs(location.query).items()}
            assert asked["response_type"] == "code" and asked["client_id"] == CLIENT_ID
            assert asked["redirect_uri"] == f"{base}/runs/callback"
            assert asked["code_challenge_method"] == "S256" and len(asked["code_challenge"]) == 43
            assert asked["resource"] == f"{base}/mcp"
            assert asked["scope"].split() == [
                "openid",
                "construct:approve",
                "construct:operate",
                "construct:read",
            ]
            assert len(asked["state"]) >= 40 and len(asked["nonce"]) >= 40
            binding = set_cookies(started)[BINDING]
            assert binding["httponly"] and binding["samesite"].lower() == "lax" and binding["path"] == "/"
            assert CONTENT not in started.text and run_id not in started.text

            # The issuer signs the person in; the callback opens a session and goes back to the page.
            callback = await consent(browser, started.headers["location"])
            code = parse_qs(urlsplit(callback).query)["code"][0]
            signed_in = await browser.get(callback)
            assert signed_in.status_code == 303, signed_in.text
            assert signed_in.headers["location"] == f"{base}/runs/{run_id}"
            cookies = set_cookies(signed_in)
            session = cookies[COOKIE]
            assert session["httponly"] and session["samesite"].lower() == "lax" and session["path"] == "/"
            assert not session["secure"] and not session["domain"]  # loopback http; this host only
            assert 0 < int(session["max-age"]) <= 900
            assert cookies[BINDING]["max-age"] == "0"  # the binding is spent
            session_id = session.value
            assert len(session_id) >= 40 and code not in session_id

            # The page and the API with the session: the page as before (same strict policy).
            page = await browser.get(f"/runs/{run_id}")
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert page.headers["content-security-policy"].startswith("default-src 'none';")
            assert "'unsafe-inline'" not in page.headers["content-security-policy"]
            assert "set-cookie" not in page.headers
            who = (await browser.get("/runs/api/session")).json()
            assert who["identity"] == "erin@example.com"
            assert who["roles"] == ["approve", "operate", "read"]
            view = (await browser.get(f"/runs/api/runs/{run_id}")).json()
            assert view["status"] == "awaiting_approval"

            # A decision needs this server's Origin (a cross-site or origin-less one is refused).
            gate_url = f"/runs/api/runs/{run_id}/gates/before:engineer"
            for origin in ({}, {"Origin": "http://127.0.0.1:1"}):
                refused = await browser.post(gate_url, json={"decision": "approve"}, headers=origin)
                assert refused.status_code == 403, (origin, refused.text)
                assert CONTENT not in refused.text
            decided = await browser.post(gate_url, json={"decision": "approve"}, headers={"Origin": base})
            assert decided.status_code == 200, decided.text
            record = await full_view(ci, run_id)
            gate = next(g for g in record["gates"] if g["gate_id"] == "before:engineer")
            assert (gate["approver"], gate["channel"], gate["verified"]) == ("erin@example.com", "web", True)

            # Sign-out: from this server's pages only; the session is forgotten, the cookie deleted.
            assert (await browser.post("/runs/sign-out", json={})).status_code == 403
            out = await browser.post("/runs/sign-out", json={}, headers={"Origin": base})
            assert out.status_code == 200 and out.json() == {"signed_out": True}
            assert set_cookies(out)[COOKIE]["max-age"] == "0"

        # The cookie replayed after sign-out: refused everywhere, nothing shown, nothing recorded.
        before = (await full_view(ci, run_id))["version"]
        async with httpx2.AsyncClient(base_url=base, cookies={COOKIE: session_id}) as replay:
            for path in ("/runs/api/session", "/runs/api/runs", f"/runs/api/runs/{run_id}"):
                answer = await replay.get(path)
                assert answer.status_code == 401, (path, answer.text)
                assert answer.json()["sign_in"] == "/runs/sign-in"
                assert CONTENT not in answer.text and run_id not in answer.text
            decide = await replay.post(
                gate_url, json={"decision": "reject", "comment": "replayed"}, headers={"Origin": base}
            )
            assert decide.status_code == 401 and CONTENT not in decide.text
            page = await replay.get(f"/runs/{run_id}")
            assert page.status_code == 303 and page.headers["location"].startswith(f"{issuer.url}/authorize?")
        assert (await full_view(ci, run_id))["version"] == before

        # Static tokens still work on the pages' API beside the sign-in.
        async with httpx2.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {STATIC}"}) as http:
            assert (await http.get("/runs/api/session")).json()["identity"] == "ci"

    log = read_log(tmp_path / "server.log")
    for action in ("page_signed_in", "page_signed_out", "page_session_refused"):
        assert action in log, action
    assert session_id not in log and code not in log and asked["code_challenge"] not in log


async def test_refused_sign_ins_and_an_expired_session(tmp_path: Path, issuer: Issuer) -> None:
    """A confidential client (its secret from the environment): signs in, then each refusal leaves
    no session; the session ends with its access token; the secret is never in the log."""
    issuer.token_seconds = 4
    async with signing_server(tmp_path, issuer, secret=True) as base:
        async with httpx2.AsyncClient(base_url=base) as browser:
            signed_in = await sign_in(browser)
            assert signed_in.headers["location"] == f"{base}/runs"
            assert int(set_cookies(signed_in)[COOKIE]["max-age"]) <= issuer.token_seconds
            assert (await browser.get("/runs/api/session")).json()["identity"] == "erin@example.com"
            browser.cookies.delete(COOKIE)

            refusals: dict[str, httpx2.Response] = {}
            # A forged or unknown state.
            callback = await consent(browser, (await to_issuer(browser, "/runs")).headers["location"])
            query = parse_qs(urlsplit(callback).query)
            forged = f"{base}/runs/callback?code={query['code'][0]}&state=forged-{'x' * 40}"
            refusals["state mismatch"] = await browser.get(forged)
            # The code delivered to another browser (no binding cookie there).
            callback = await consent(browser, (await to_issuer(browser, "/runs")).headers["location"])
            async with httpx2.AsyncClient() as other:
                refusals["another browser"] = await other.get(callback)
            # PKCE: the code of one sign-in with the state (and so the verifier) of another.
            first = await consent(browser, (await to_issuer(browser, "/runs")).headers["location"])
            second = await consent(browser, (await to_issuer(browser, "/runs")).headers["location"])
            code_2 = parse_qs(urlsplit(second).query)["code"][0]
            state_1 = parse_qs(urlsplit(first).query)["state"][0]
            refusals["PKCE mismatch"] = await browser.get(
                f"{base}/runs/callback?code={code_2}&state={state_1}"
            )
            # The issuer's own refusal.
            state = parse_qs(urlsplit((await to_issuer(browser, "/runs")).headers["location"]).query)[
                "state"
            ][0]
            refusals["access denied"] = await browser.get(
                f"{base}/runs/callback?error=access_denied&state={state}"
            )
            # An ID token that is not this sign-in's (another nonce).
            issuer.id_token_nonce = "n" * 43
            callback = await consent(browser, (await to_issuer(browser, "/runs")).headers["location"])
            refusals["ID token of another sign-in"] = await browser.get(callback)
            issuer.id_token_nonce = None
            # The issuer no longer knows the client's secret.
            issuer.client_secret = "rotated-" + SECRET
            callback = await consent(browser, (await to_issuer(browser, "/runs")).headers["location"])
            refusals["wrong client secret"] = await browser.get(callback)
            issuer.client_secret = SECRET
            for name, answer in refusals.items():
                assert answer.status_code in (400, 401), (name, answer.status_code, answer.text)
                assert answer.json()["error"] == "sign_in_failed", name
                assert COOKIE not in set_cookies(answer), name
                assert SECRET not in answer.text, name
            assert browser.cookies.get(COOKIE) is None
            assert (await browser.get("/runs/api/runs")).status_code == 401

            # A fresh sign-in works again; then its session ends with its access token (the cookie
            # sent on past its Max-Age, as a replaying client would).
            session_id = set_cookies(await sign_in(browser))[COOKIE].value
            ends = time.time() + issuer.token_seconds
            assert (await browser.get("/runs/api/runs")).status_code == 200
            await anyio.sleep(max(0.0, ends - time.time()) + 1.0)
        async with httpx2.AsyncClient(base_url=base, cookies={COOKIE: session_id}) as replay:
            expired = await replay.get("/runs/api/runs")
            assert expired.status_code == 401 and expired.json()["sign_in"] == "/runs/sign-in"
            assert (await replay.get("/runs")).status_code == 303

    log = read_log(tmp_path / "server.log")
    assert log.count("page_sign_in_refused") == len(refusals), log
    assert SECRET not in log
    assert issuer.fetches["token"] >= 4


async def test_a_person_the_issuer_gives_no_role_is_not_signed_in(tmp_path: Path, issuer: Issuer) -> None:
    """The pages ask for ``openid`` alone: the access token gives no role, and no session is made."""
    openid_only = 'page_scopes = ["openid"]\n'
    async with (
        signing_server(tmp_path, issuer, extra=openid_only) as base,
        httpx2.AsyncClient(base_url=base) as browser,
    ):
        started = await to_issuer(browser, "/runs")
        answer = await browser.get(await consent(browser, started.headers["location"]))
        assert answer.status_code == 403 and answer.json()["error"] == "sign_in_failed"
        assert "no role" in answer.json()["message"] and COOKIE not in set_cookies(answer)
        assert (await browser.get("/runs/api/runs")).status_code == 401
    assert "the token gives no role" in read_log(tmp_path / "server.log")

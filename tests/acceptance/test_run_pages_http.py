"""The run pages' HTTP surface (``/runs``, ``/runs/api/...``) against a server subprocess, without
a browser: the security headers, the tokens and roles, the checks on ids and bodies, the coded JSON
errors, and the decision record (channel ``web``); the token checked before a body is read; and the
same pages without any token."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client

from tests.acceptance.test_mcp_http import http_server
from tests.browser.test_run_pages import ALICE, BOB, CAROL, CONFIG, VERA, as_identity, gated_run

pytestmark = pytest.mark.slow


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


#: A body just under the default bound (15,688,576 bytes): what the server would hold if it read it.
LARGE_BODY_BYTES = 15_000_000
#: Over the default bound (and under twice it: read and dropped, then the typed answer).
OVER_BOUND_BYTES = 16_000_000


async def _raw_post_head(port: int, path: str, headers: dict[str, str], sent_body: bytes = b"") -> bytes:
    """POST ``path`` over a raw connection declaring a ``LARGE_BODY_BYTES`` body, of which only
    ``sent_body`` is sent; the head of the first answer (status line and headers)."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {LARGE_BODY_BYTES}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode() + sent_body)
        answer = b""
        # A server waiting for the rest of the body would never answer: the test fails after 20 s.
        with anyio.fail_after(20):
            while b"\r\n\r\n" not in answer:
                answer += await stream.receive()
    return answer.split(b"\r\n\r\n", 1)[0]


HEADERS_JSON = {"Content-Type": "application/json"}


async def _chunks(total: int, size: int = 1 << 20) -> AsyncIterator[bytes]:
    """``total`` bytes of body, streamed (chunked) in ``size`` pieces."""
    for start in range(0, total, size):
        yield b" " * min(size, total - start)


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


async def test_the_pages_headers_tokens_roles_and_errors(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG)
    async with (
        http_server(tmp_path, "streamable-http") as port,
        as_identity(port, ALICE) as alice,
        httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        run_id = await gated_run(alice)

        # The pages need no token (they hold no data) and send a strict policy.
        for path in ("/runs", f"/runs/{run_id}"):
            answer = await http.get(path)
            assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
            policy = answer.headers["content-security-policy"]
            (script,) = re.findall(r"<script>(.*?)</script>", answer.text, flags=re.DOTALL)
            assert policy.startswith("default-src 'none';")
            assert f"script-src '{_sha256(script)}';" in policy
            assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["referrer-policy"] == "no-referrer"
            assert "set-cookie" not in answer.headers
        bad_page = await http.get("/runs/NOT_A_RUN")
        assert bad_page.status_code == 400 and bad_page.json()["error"] == "invalid_argument"

        # The endpoints need a token; a reader reads, and only reads.
        assert (await http.get("/runs/api/runs")).status_code == 401
        assert (await http.get("/runs/api/session", headers=_bearer("x" * 20))).status_code == 401
        session = (await http.get("/runs/api/session", headers=_bearer(VERA))).json()
        assert session == {
            "auth_required": True,
            "identity": "vera",
            "roles": ["read"],
            "own_runs_only": False,
        }
        listed = (await http.get("/runs/api/runs", headers=_bearer(VERA))).json()
        assert [r["run_id"] for r in listed["runs"]] == [run_id]
        paused = "/runs/api/runs?status=awaiting_approval&status=awaiting_host"
        assert [r["run_id"] for r in (await http.get(paused, headers=_bearer(VERA))).json()["runs"]] == [
            run_id
        ]
        done = (await http.get("/runs/api/runs?status=completed", headers=_bearer(VERA))).json()
        assert done["runs"] == []
        view = (await http.get(f"/runs/api/runs/{run_id}", headers=_bearer(VERA))).json()
        assert view["status"] == "awaiting_approval" and view["tasks"][0]["output"] is None
        whole = (await http.get(f"/runs/api/runs/{run_id}?task_id=architect", headers=_bearer(VERA))).json()
        assert whole["tasks"][0]["output"].startswith("## Plan")
        # The run's events, as run_events answers them (the page reads output_delta events there).
        feed = (await http.get(f"/runs/api/runs/{run_id}/events?after_seq=1", headers=_bearer(VERA))).json()
        assert feed["run_id"] == run_id and feed["events"][0]["seq"] == 2
        assert feed["next_after_seq"] == feed["events"][-1]["seq"] and "next_output_after" in feed
        gate_url = f"/runs/api/runs/{run_id}/gates/before:engineer"
        refused = await http.post(gate_url, json={"decision": "approve"}, headers=_bearer(VERA))
        assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
        assert "'approve'" in refused.json()["message"] and VERA not in refused.text

        # An identity limited to its own runs neither sees nor decides anyone else's.
        carol = _bearer(CAROL)
        assert (await http.get("/runs/api/runs", headers=carol)).json()["runs"] == []
        hidden = await http.get(f"/runs/api/runs/{run_id}", headers=carol)
        assert hidden.status_code == 403 and hidden.json()["error"] == "forbidden"
        assert (await http.get(f"/runs/api/runs/{run_id}/events", headers=carol)).status_code == 403
        assert (await http.post(gate_url, json={"decision": "approve"}, headers=carol)).status_code == 403

        # Checked before anything is recorded: ids, media type, body, decision.
        bob = _bearer(BOB)
        for path, code, status in (
            ("/runs/api/runs/BAD_ID!", "invalid_argument", 400),
            ("/runs/api/runs/run-0000000000000-0000000000000000", "run_not_found", 404),
            (f"/runs/api/runs/{run_id}?task_id=nobody", "invalid_argument", 400),
            ("/runs/api/nothing", "not_found", 404),
            ("/runs/api/runs?status=sleeping", "invalid_argument", 400),
            ("/runs/api/runs?limit=many", "invalid_argument", 400),
            (f"/runs/api/runs/{run_id}/events?output_after=-1", "invalid_argument", 400),
            (f"/runs/api/runs/{run_id}/events?after_seq=999", "invalid_argument", 400),
        ):
            answer = await http.get(path, headers=bob)
            assert (answer.status_code, answer.json()["error"]) == (status, code), answer.text
        wrong = await http.delete(f"/runs/api/runs/{run_id}", headers=bob)
        assert wrong.status_code == 405 and wrong.json()["error"] == "method_not_allowed"
        assert (await http.put("/runs", headers=bob)).json()["error"] == "method_not_allowed"
        form = await http.post(
            gate_url, content=b"decision=approve", headers={**bob, "content-type": "text/plain"}
        )
        assert form.status_code == 415 and form.json()["error"] == "unsupported_media_type"
        for body, code in (
            (b"not json", "invalid_argument"),
            (b'{"decision": "maybe"}', "invalid_argument"),
            (b'{"decision": "approve", "approver": "mallory"}', "invalid_argument"),
        ):
            answer = await http.post(
                gate_url, content=body, headers={**bob, "content-type": "application/json"}
            )
            assert answer.status_code == 400 and answer.json()["error"] == code, answer.text
        elsewhere = await http.post(
            f"/runs/api/runs/{run_id}/gates/after:reviewer", json={"decision": "approve"}, headers=bob
        )
        assert elsewhere.status_code in (400, 409) and "error" in elsewhere.json()
        # A DNS-rebinding site (another Host) or another site's page (another Origin) is refused.
        rebound = await http.get("/runs/api/runs", headers={**bob, "host": "evil.example:80"})
        assert rebound.status_code == 403
        forged = await http.post(
            gate_url, json={"decision": "approve"}, headers={**bob, "origin": "https://evil.example"}
        )
        assert forged.status_code == 403

        # The decision, recorded as bob's, verified, through the web page; repeating it is safe,
        # a different one is a conflict.
        decided = await http.post(gate_url, json={"decision": "approve", "comment": "ok"}, headers=bob)
        assert decided.status_code == 200, decided.text
        gate = decided.json()["gates"][0]
        assert (gate["status"], gate.get("approver"), gate.get("verified", False), gate["channel"]) == (
            "approved",
            "bob",
            True,
            "web",
        )
        again = await http.post(gate_url, json={"decision": "approve", "comment": "ok"}, headers=bob)
        assert again.status_code == 200
        other = await http.post(gate_url, json={"decision": "reject", "comment": "ok"}, headers=bob)
        assert other.status_code == 409 and other.json()["error"] == "conflict"


async def test_the_token_is_checked_before_a_body_is_read(tmp_path: Path) -> None:
    """Issue 22, finding 4: an anonymous client must not make the server hold request bodies (16
    such 15 MB POSTs took a server from 81 MB to 320 MB). A request without a valid token is
    answered 401 before its body is read; the body bound applies to an identified request only."""
    (tmp_path / "construct.toml").write_text(CONFIG)
    async with (
        http_server(tmp_path, "streamable-http") as port,
        as_identity(port, ALICE) as alice,
        httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http,
    ):
        run_id = await gated_run(alice)
        gate_url = f"/runs/api/runs/{run_id}/gates/before:engineer"
        for headers in ({}, _bearer("x" * 20)):
            # Asked to confirm first (Expect: 100-continue), the server says "Continue" only when the
            # app asks for the body: without a valid token it answers 401 and never asks.
            head = await _raw_post_head(port, gate_url, {**headers, "Expect": "100-continue"})
            assert head.startswith(b"HTTP/1.1 401 "), f"the body was asked for: {head!r}"
            assert b'www-authenticate: Bearer realm="construct-mcp"' in head
            # Sending it regardless: answered 401 with 16 KB of the declared 15 MB sent.
            head = await _raw_post_head(port, gate_url, headers, b" " * 16_384)
            assert head.startswith(b"HTTP/1.1 401 "), head
        # A client that uploads the whole body before it reads still gets its 401.
        whole = await http.post(gate_url, content=_chunks(LARGE_BODY_BYTES), headers=HEADERS_JSON)
        assert whole.status_code == 401 and whole.json()["error"] == "unauthorized"

        # With the token, the body bound: over it, the typed too_large, and nothing decided.
        over = await http.post(
            gate_url, content=_chunks(OVER_BOUND_BYTES), headers={**HEADERS_JSON, **_bearer(BOB)}
        )
        assert over.status_code == 413, over.text
        assert over.json()["error"]["message"].startswith("too_large: the request body is over ")
        view = (await http.get(f"/runs/api/runs/{run_id}", headers=_bearer(BOB))).json()
        assert view["status"] == "awaiting_approval" and view["gates"][0]["status"] == "requested"
        decided = await http.post(gate_url, json={"decision": "approve"}, headers=_bearer(BOB))
        assert decided.status_code == 200 and decided.json()["gates"][0]["status"] == "approved"
    assert "action=body_too_large" in (tmp_path / "server.log").read_text()


async def test_without_tokens_the_pages_need_no_login(tmp_path: Path) -> None:
    async with (
        http_server(tmp_path, "streamable-http") as port,
        httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        # The log says where to point a host and a browser.
        base = f"http://127.0.0.1:{port}"
        assert f"MCP at {base}/mcp; the runs page at {base}/runs" in (tmp_path / "server.log").read_text()
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            run_id = await gated_run(client)
        session = (await http.get("/runs/api/session")).json()
        assert session["auth_required"] is False and session["identity"] is None
        decided = await http.post(
            f"/runs/api/runs/{run_id}/gates/before:engineer", json={"decision": "reject"}
        )
        assert decided.status_code == 200, decided.text
        gate = decided.json()["gates"][0]
        assert (gate["status"], gate.get("approver"), gate.get("verified", False), gate["channel"]) == (
            "rejected",
            None,
            False,
            "web",
        )
        assert decided.json()["status"] == "rejected"

"""The run pages' HTTP surface (``/runs``, ``/runs/api/...``) against a server subprocess, without
a browser: the security headers, the tokens and roles, the checks on ids and bodies, the coded JSON
errors, and the decision record (channel ``web``); and the same pages without any token."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import httpx2
import pytest
from mcp import Client

from tests.acceptance.test_mcp_http import http_server
from tests.browser.test_run_pages import ALICE, BOB, CAROL, CONFIG, VERA, as_identity, gated_run

pytestmark = pytest.mark.slow


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


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
        gate_url = f"/runs/api/runs/{run_id}/gates/before:engineer"
        refused = await http.post(gate_url, json={"decision": "approve"}, headers=_bearer(VERA))
        assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
        assert "'approve'" in refused.json()["message"] and VERA not in refused.text

        # An identity limited to its own runs neither sees nor decides anyone else's.
        carol = _bearer(CAROL)
        assert (await http.get("/runs/api/runs", headers=carol)).json()["runs"] == []
        hidden = await http.get(f"/runs/api/runs/{run_id}", headers=carol)
        assert hidden.status_code == 403 and hidden.json()["error"] == "forbidden"
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


async def test_without_tokens_the_pages_need_no_login(tmp_path: Path) -> None:
    async with (
        http_server(tmp_path, "streamable-http") as port,
        httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
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

"""Asking at a gate over Streamable HTTP with named tokens (a real server subprocess, the official
client, both protocol eras): the decision records the token's identity as verified, and an identity
that may not decide gates is not asked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitRequestParams, ElicitResult, ErrorData, InputRequiredResult

from server.mcp.elicit import FORM_KEY
from tests.acceptance.harness import call, read_log
from tests.acceptance.test_identities import ALICE, BOB, CONFIG
from tests.acceptance.test_mcp_http import http_server

pytestmark = pytest.mark.slow


class Answers:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        self.asked.append(params.message)
        return ElicitResult(action="accept", content={"decision": "approve", "comment": "fine by me"})


@asynccontextmanager
async def as_identity(port: int, token: str, mode: str, answers: Answers) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as authed,
        Client(
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=authed),
            mode=mode,
            elicitation_callback=answers,
        ) as client,
    ):
        yield client


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_form_over_http_records_the_verified_identity(tmp_path: Path, mode: str) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG)
    alice_answers, bob_answers = Answers(), Answers()
    async with (
        http_server(tmp_path, "streamable-http", BOB_TOKEN=BOB) as port,
        as_identity(port, ALICE, mode, alice_answers) as alice,
        as_identity(port, BOB, mode, bob_answers) as bob,
    ):
        view: dict[str, Any] = await call(
            alice,
            "orchestrate_start",
            request="Over HTTP.",
            chain=["writer"],
            approve_before=["writer"],
            idempotency_key="http-1",
            wait_seconds=5,
        )
        run_id = view["run_id"]
        assert (alice.protocol_version == "2026-07-28") == (mode == "auto")
        # alice operates but may not decide gates: she is not asked, and sees next_action as before.
        assert view["next_action"]["kind"] == "approve" and alice_answers.asked == []
        # bob reads and approves: a waiting run_status asks him, and records him, verified.
        view = await call(bob, "run_status", run_id=run_id, wait_seconds=5)
        assert len(bob_answers.asked) == 1 and "before:writer" in bob_answers.asked[0]
        assert view["next_action"]["kind"] == "run_host_task" and view["next_action"]["task_id"] == "writer"
        gate = view["gates"][0]
        assert (
            gate["status"],
            gate.get("approver"),
            gate["channel"],
            gate.get("verified", False),
            gate["comment"],
        ) == (
            "approved",
            "bob",
            "elicitation",
            True,
            "fine by me",
        )


ERIN = "erin-token-" + "6d1f0a9b3e7c2854"  # read, approve: like bob


async def test_a_form_state_issued_to_one_identity_does_not_answer_for_another(tmp_path: Path) -> None:
    """erin replays the state bob was given, with an answer: refused (the SDK's seal binds the
    token's identity; the state names the identity it was issued to too), and nothing is recorded."""
    (tmp_path / "construct.toml").write_text(
        CONFIG + f'\n[tokens.erin]\ntoken = "{ERIN}"\nroles = ["read", "approve"]\n'
    )
    async with (
        http_server(tmp_path, "streamable-http", BOB_TOKEN=BOB) as port,
        as_identity(port, ALICE, "auto", Answers()) as alice,
        as_identity(port, BOB, "auto", Answers()) as bob,
        as_identity(port, ERIN, "auto", Answers()) as erin,
    ):
        view = await call(
            alice,
            "orchestrate_start",
            request="Replay.",
            chain=["writer"],
            approve_before=["writer"],
            wait_seconds=0,
        )
        args = {"run_id": view["run_id"], "wait_seconds": 5}
        asked = await bob.session.call_tool("run_status", args, allow_input_required=True)
        assert isinstance(asked, InputRequiredResult) and asked.request_state is not None
        reject = ElicitResult(action="accept", content={"decision": "reject"})
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await erin.session.call_tool(
                "run_status",
                args,
                input_responses={FORM_KEY: reject},
                request_state=asked.request_state,
                allow_input_required=True,
            )
        status = await call(bob, "run_status", run_id=view["run_id"])
        assert status["gates"][0]["status"] == "requested", "nothing was recorded"
    assert "requestState rejected on tools/call: principal" in read_log(tmp_path / "server.log")

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
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitRequestParams, ElicitResult, ErrorData

from tests.acceptance.harness import call
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
        assert (gate["status"], gate["approver"], gate["channel"], gate["verified"], gate["comment"]) == (
            "approved",
            "bob",
            "elicitation",
            True,
            "fine by me",
        )

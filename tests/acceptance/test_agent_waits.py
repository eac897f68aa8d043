"""Issue 22, finding 1, through real processes: a run whose agent step waits on a remote run holds
no dispatcher slot. A parent construct-mcp (filesystem store, the inline backend, the default 4
dispatcher slots) delegates four runs to a remote construct-mcp (sqlite, the provider backend
against the fake provider) whose chain waits for a person at an approval gate; while those four
wait, four inline runs on the parent start, get their tasks, take the host's outputs and complete;
then the remote gates are approved and the four delegating runs complete. Before the fix the four
delegating runs held the four slots and the inline runs stayed ``queued``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.acceptance.harness import call, free_port, play_host, read_log
from tests.acceptance.processes import http_server
from tests.acceptance.store_targets import store_target
from tests.acceptance.test_agent_delegation import TOKEN, provider_vars, until
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

PARENT_CONFIG = """
[agents.reviewer2]
url = "http://127.0.0.1:PORT/mcp"
token_env = "REVIEWER2_TOKEN"
follow_wait_seconds = 1
paused_poll_seconds = 0.2
call_timeout_seconds = 10

[chains.delegated]
steps = [{ name = "review", agent = "reviewer2", tool = "orchestrate_start", ARGUMENTS }]
""".replace("ARGUMENTS", 'arguments = { chain = "gated", request = "{request}" }')

REMOTE_CONFIG = """
[chains.gated]
steps = [{ specialist = "writer", approve_before = true }]
"""


@asynccontextmanager
async def remote_client(port: int) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(headers=headers) as http:
        url = f"http://127.0.0.1:{port}/mcp"
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def remote_run_known(view: dict[str, Any]) -> bool:
    attempts = view["tasks"][0]["attempts"]
    return bool(attempts) and attempts[-1]["remote_run_id"] is not None


async def remote_gates(client: Client, count: int) -> list[dict[str, Any]]:
    """The remote's runs once ``count`` of them wait at their gate."""
    with anyio.fail_after(60):
        while True:
            runs = (await call(client, "runs_list"))["runs"]
            waiting = [r for r in runs if r["status"] == "awaiting_approval"]
            if len(waiting) >= count:
                return list(waiting)
            await anyio.sleep(0.2)


async def test_four_runs_waiting_on_a_remote_person_leave_the_slots_to_four_inline_runs(
    tmp_path: Path,
) -> None:
    remote_port = free_port()
    parent_home, remote_home = tmp_path / "parent", tmp_path / "remote"
    for home in (parent_home, remote_home):
        home.mkdir()
    (parent_home / "construct.toml").write_text(PARENT_CONFIG.replace("PORT", str(remote_port)))
    (remote_home / "construct.toml").write_text(REMOTE_CONFIG)
    with FakeProvider({"writer": [{"text": "the remote docs"}]}) as fake:
        async with (
            store_target("filesystem", tmp_path / "parent-store") as parent_store,
            store_target("sqlite", tmp_path / "remote-store") as remote_store,
        ):
            remote_env = remote_store.env(remote_home, **provider_vars(fake), CONSTRUCT_AUTH_TOKEN=TOKEN)
            parent_env = parent_store.env(parent_home, REVIEWER2_TOKEN=TOKEN)
            async with (
                http_server(remote_env, remote_home / "server.log", remote_port),
                http_server(parent_env, parent_home / "server.log") as (_, parent_port),
                Client(f"http://127.0.0.1:{parent_port}/mcp") as parent,
                remote_client(remote_port) as remote,
            ):
                delegating = []
                for n in range(4):
                    view = await call(
                        parent, "orchestrate_start", chain="delegated", request=f"Review {n}", wait_seconds=0
                    )
                    delegating.append(str(view["run_id"]))
                for run_id in delegating:
                    await until(parent, run_id, remote_run_known)
                gates = await remote_gates(remote, 4)  # four remote runs wait for a person

                # Four inline runs on the same parent, while the four delegating runs wait.
                for n in range(4):
                    view = await call(
                        parent, "orchestrate_start", chain=["writer"], request=f"Docs {n}", wait_seconds=5
                    )
                    assert view["status"] == "awaiting_host", view  # it got its task: a slot was free
                    done = await play_host(parent, view)
                    assert done["status"] == "completed", done
                for run_id in delegating:
                    view = await call(parent, "run_status", run_id=run_id)
                    assert view["status"] == "awaiting_agent", view
                    assert view["next_action"]["kind"] == "wait"

                # The person approves the remote gates: the delegating runs complete.
                for gate in gates:
                    await call(
                        remote,
                        "orchestrate_approve",
                        run_id=gate["run_id"],
                        gate_id="before:writer",
                        decision="approve",
                    )
                for run_id in delegating:
                    end = await until(parent, run_id, lambda v: v["status_kind"] == "terminal")
                    assert end["status"] == "completed", end.get("error")
                    review = end["tasks"][0]
                    assert review["output"] == "the remote docs"
                    assert len(review["attempts"]) == 1, review["attempts"]
                assert len((await call(remote, "runs_list"))["runs"]) == 4
                assert fake.calls_for("writer") == 4
    assert "Traceback" not in read_log(parent_home / "server.log")

"""An A2A agent's question through real processes: a construct-mcp (the provider backend against
the fake provider, on the filesystem and on sqlite) whose chain's middle step sends its message to
an A2A agent (:mod:`tests.fakes.a2a_peer`, a process of its own, behind a bearer token) that asks
"Which branch?". The question is a gate of the run.

- The server is SIGKILLed at that gate, the answer recorded while no server runs (``construct-mcp
  runs approve``: the answer is recorded and not sent), and the server restarted on the same
  store: it sends the answer once, with the message id derived from the run, the task, the
  attempt and the question, not marked a duplicate, and the step completes with the agent's
  artifact.
- The answer is given through ``orchestrate_approve`` and the server SIGKILLed while its send is
  in flight (the agent holds the answer 4 s before it answers); restarted once the agent went
  on, it finds the task no longer asks, records the answer as sent, and sends nothing more."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from orchestration.core.agent_steps import answer_message_id
from tests.acceptance.harness import SERVER_COMMAND, call, free_port, full_view
from tests.acceptance.processes import http_server
from tests.acceptance.store_targets import store_target
from tests.acceptance.test_a2a_agent_kill import peer, peer_env, review_of, until
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

CONFIG = """
[agents.peer]
protocol = "a2a"
url = "http://127.0.0.1:PORT"
token_env = "PEER_TOKEN"
paused_poll_seconds = 0.2
poll_cap_seconds = 1
call_timeout_seconds = 10

[chains.delegated]
steps = ["architect", { name = "review", agent = "peer", message = "ask {outputs.architect}" }, "writer"]
"""

GATE = "question:review:1"


def at_gate(view: dict[str, Any]) -> bool:
    return bool(view["status"] == "awaiting_approval")


def approve_offline(env: dict[str, str], run_id: str) -> dict[str, Any]:
    """``construct-mcp runs approve`` with the answer, while no server runs."""
    done = subprocess.run(
        [*SERVER_COMMAND, "runs", "approve", run_id, "--gate-id", GATE, "--comment", "main", "--json"],
        capture_output=True,
        text=True,
        env={**env, "PATH": os.environ.get("PATH", "")},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    view: dict[str, Any] = json.loads(done.stdout)
    return view


@pytest.mark.parametrize("backend", ["filesystem", "sqlite"])
async def test_sigkill_at_the_question_then_the_answer_is_sent_once_on_restart(
    tmp_path: Path, backend: str
) -> None:
    scenario = {"architect": [{"text": "the design"}], "writer": [{"text": "the docs"}]}
    home, port, log = tmp_path / "home", free_port(), tmp_path / "messages.log"
    home.mkdir()
    (home / "construct.toml").write_text(CONFIG.replace("PORT", str(port)))
    with FakeProvider(scenario) as fake:
        async with store_target(backend, tmp_path / "store") as store, peer(port, log):
            env = peer_env(store, home, fake)
            async with http_server(env, home / "server.log") as (process, server_port):
                async with Client(f"http://127.0.0.1:{server_port}/mcp") as client:
                    view = await call(
                        client, "orchestrate_start", chain="delegated", request="a cache", wait_seconds=0
                    )
                    run_id = str(view["run_id"])
                    await until(client, run_id, at_gate)
                    asked = await call(client, "run_status", run_id=run_id)
                process.kill()  # SIGKILL at the gate
                await process.wait()
            action = asked["next_action"]
            assert action["kind"] == "approve" and action["gate_id"] == GATE, action
            assert "Which branch?" in action["guards"] and "peer" in action["guards"]
            answered = approve_offline(env, run_id)
            assert answered["status"] == "awaiting_agent", answered
            assert len(log.read_text().split()) == 1  # recorded, not sent
            async with (
                http_server(env, home / "server.log") as (_, server_port),
                Client(f"http://127.0.0.1:{server_port}/mcp") as client,
            ):
                done = await until(client, run_id, lambda v: v["status_kind"] == "terminal")
                record = await full_view(client, run_id)
            runs = await store.runs()
    assert done["status"] == "completed", (done.get("error"), review_of(record)["attempts"])
    assert review_of(record)["output"] == "answered: main"
    sent = log.read_text().split()
    assert len(sent) == 2 and sent[1] == answer_message_id(run_id, "review", 1, 1), sent
    facts = next(f for h, f in runs if h.run_id == run_id)
    assert [f.type for f in facts if getattr(f, "task_id", None) == "review"] == [
        "attempt_started",
        "remote_run_started",
        "agent_question_asked",
        "agent_answer_sending",
        "agent_answer_sent",
        "task_completed",
    ]
    [decided] = [f for f in facts if f.type == "approval_decided"]
    assert (decided.gate_id, decided.comment, decided.channel) == (GATE, "main", "cli")
    [sending] = [f for f in facts if f.type == "agent_answer_sending"]
    assert not sending.possible_duplicate_call


def review_types(facts: list[Any]) -> list[str]:
    return [f.type for f in facts if getattr(f, "task_id", None) == "review"]


@pytest.mark.parametrize("backend", ["filesystem", "sqlite"])
async def test_sigkill_during_the_send_of_the_answer_then_nothing_is_sent_again(
    tmp_path: Path, backend: str
) -> None:
    scenario = {"architect": [{"text": "the design"}], "writer": [{"text": "the docs"}]}
    home, port, log = tmp_path / "home", free_port(), tmp_path / "messages.log"
    home.mkdir()
    (home / "construct.toml").write_text(CONFIG.replace("PORT", str(port)))
    with FakeProvider(scenario) as fake:
        async with (
            store_target(backend, tmp_path / "store") as store,
            peer(port, log, "--answer-seconds", "4"),
        ):
            env = peer_env(store, home, fake)
            async with http_server(env, home / "server.log") as (process, server_port):
                async with Client(f"http://127.0.0.1:{server_port}/mcp") as client:
                    view = await call(
                        client, "orchestrate_start", chain="delegated", request="a cache", wait_seconds=0
                    )
                    run_id = str(view["run_id"])
                    await until(client, run_id, at_gate)
                    await call(
                        client,
                        "orchestrate_approve",
                        run_id=run_id,
                        gate_id=GATE,
                        decision="approve",
                        comment="main",
                        wait_seconds=0,
                    )
                    with anyio.fail_after(30):
                        while True:
                            if len(log.read_text().split()) >= 2:
                                break  # the answer reached the agent
                            await anyio.sleep(0.02)
                process.kill()  # SIGKILL while message/send waits for the agent
                await process.wait()
            facts = next(f for h, f in await store.runs() if h.run_id == run_id)
            assert review_types(facts)[-1] == "agent_answer_sending", review_types(facts)
            await anyio.sleep(5)  # the agent goes on with the answer it took
            async with (
                http_server(env, home / "server.log") as (_, server_port),
                Client(f"http://127.0.0.1:{server_port}/mcp") as client,
            ):
                done = await until(client, run_id, lambda v: v["status_kind"] == "terminal")
                record = await full_view(client, run_id)
            runs = await store.runs()
    assert done["status"] == "completed", (done.get("error"), review_of(record)["attempts"])
    assert review_of(record)["output"] == "answered: main"
    sent = log.read_text().split()
    assert len(sent) == 2 and sent[1] == answer_message_id(run_id, "review", 1, 1), sent
    facts = next(f for h, f in runs if h.run_id == run_id)
    assert review_types(facts) == [
        "attempt_started",
        "remote_run_started",
        "agent_question_asked",
        "agent_answer_sending",
        "agent_answer_sent",
        "task_completed",
    ]

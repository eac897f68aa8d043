"""An A2A agent step against an agent built with a server we did not write: Pydantic's
``fasta2a`` (:mod:`tests.fakes.fasta2a_peer`), on every store. It speaks A2A 1.0's JSON-RPC
binding; the step completes with its artifact's text, one message sent. fasta2a's own in-memory
storage writes task timestamps without a time zone, which is no RFC 3339 time: the SDK refuses
the answer, and the step fails with ``malformed_response`` (not retried), naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.chains import Catalog
from orchestration.core import StartRequest
from orchestration.core.agent_steps import message_id
from orchestration.core.models import ExecutionContract
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from orchestration.store import RunStore
from orchestration.workers import AgentEndpoint, Workers, agent_workers
from tests.unit.helpers import play, sequential_ids

fasta2a_peer = pytest.importorskip("tests.fakes.fasta2a_peer", reason="needs fasta2a (the test extra)")


def runtime(store: RunStore, url: str) -> Runtime:
    raw = {
        "agents": {"peer": {"protocol": "a2a", "url": url}},
        "chains": {
            "delegated": {
                "steps": [
                    "architect",
                    {"name": "review", "agent": "peer", "message": "review {request}"},
                    "writer",
                ]
            }
        },
    }
    endpoint = AgentEndpoint(
        name="peer", url=url, protocol="a2a", paused_poll_seconds=0.05, poll_cap_seconds=0.2
    )
    return Runtime(
        store,
        Catalog.builtin().extended(raw, "construct.toml", Path(".")),
        new_id=sequential_ids(),
        resolve_contract=lambda request, chain: ExecutionContract(worker_backend="inline", max_attempts=2),
        worker=Workers(None, agent_workers({"peer": endpoint})),
        settings=RuntimeSettings(owner="p1", lease_ttl_seconds=30, cancel_poll_seconds=0.01),
    )


async def test_a_step_delegates_to_a_fasta2a_agent(store: RunStore) -> None:
    with fasta2a_peer.serving() as (url, worker):
        rt = runtime(store, url)
        head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
        done = await play(rt, head.run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    snap = await rt.snapshot(head.run_id)
    assert snap.outputs["review"] == "fasta2a reviewed: review the cache"
    [attempt] = snap.head.task("review").attempts
    assert attempt.remote_run_id is not None
    assert worker.message_ids == [message_id(f"construct:{head.run_id}:review:1")]


async def test_fasta2a_s_own_timestamps_are_an_answer_that_cannot_be_read(store: RunStore) -> None:
    with fasta2a_peer.serving(rfc3339=False) as (url, worker):
        rt = runtime(store, url)
        head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
        done = await play(rt, head.run_id)
    assert done.status == RunStatus.FAILED
    [attempt] = (await rt.snapshot(head.run_id)).head.task("review").attempts  # not retried
    assert attempt.error is not None and attempt.error.code == "malformed_response"
    assert "timestamp" in attempt.error.message and len(worker.message_ids) == 1

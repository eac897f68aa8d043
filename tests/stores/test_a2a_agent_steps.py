"""A chain step that delegates to an A2A agent, against a real peer (the a2a-sdk's own server
around a scripted executor, :mod:`tests.fakes.a2a_peer`, on 127.0.0.1), on every store: the
message is sent once, the task followed (outside the drive: the run is ``awaiting_agent``) to its
end, and its artifacts' text becomes the step's output; the typed errors of an agent that cannot
be reached, fails or wants credentials (a question is a gate of the run:
tests/stores/test_a2a_questions.py); the same message id on a follow-up attempt; cancel reaching
the remote task."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from orchestration.chains import Catalog
from orchestration.core import StartRequest
from orchestration.core.agent_steps import message_id
from orchestration.core.clock import ManualClock
from orchestration.core.models import ExecutionContract
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from orchestration.store import RunStore
from orchestration.workers import AgentEndpoint, Workers, agent_workers
from orchestration.workers.a2a_agents import A2AWorker
from orchestration.workers.retry import RetryPolicy
from tests.fakes.a2a_peer import ScriptedExecutor, free_port, serving
from tests.unit.helpers import play, sequential_ids

TOKEN = "peer-token-0123456789"


@pytest.fixture
def executor() -> ScriptedExecutor:
    return ScriptedExecutor(work_seconds=0.3, slow_seconds=30)


@pytest.fixture
def peer(executor: ScriptedExecutor) -> Iterator[str]:
    with serving(executor, token=TOKEN) as url:
        yield url


def endpoint(url: str) -> AgentEndpoint:
    return AgentEndpoint(
        name="peer",
        url=url,
        protocol="a2a",
        token_env="PEER_TOKEN",
        call_timeout_seconds=5,
        paused_poll_seconds=0.05,
        poll_cap_seconds=0.2,
    )


def catalog(message: str = "review {request}\n\n{outputs.architect}", schema: str | None = None) -> Catalog:
    step: dict[str, Any] = {"name": "review", "agent": "peer", "message": message}
    if schema is not None:
        step["output_schema"] = schema
    raw = {
        "agents": {"peer": {"protocol": "a2a", "url": "http://127.0.0.1:1"}},
        "chains": {"delegated": {"steps": ["architect", step, "writer"]}},
    }
    return Catalog.builtin().extended(raw, "construct.toml", Path("."))


def runtime(
    store: RunStore,
    url: str,
    *,
    token: str = TOKEN,
    owner: str = "p1",
    catalog_: Catalog | None = None,
    clock: ManualClock | None = None,
) -> tuple[Runtime, A2AWorker, ManualClock]:
    clock = clock or ManualClock()
    worker = A2AWorker(
        {"peer": endpoint(url)},
        env={"PEER_TOKEN": token},
        policy=RetryPolicy(base_delay_seconds=0),
        clock=clock,
    )
    rt = Runtime(
        store,
        catalog_ or catalog(),
        clock=clock,
        new_id=sequential_ids(),
        resolve_contract=lambda request, chain: ExecutionContract(worker_backend="inline", max_attempts=2),
        worker=Workers(None, worker),
        settings=RuntimeSettings(owner=owner, lease_ttl_seconds=30, cancel_poll_seconds=0.01),
    )
    return rt, worker, clock


async def test_a_step_sends_its_message_and_the_tasks_artifacts_become_its_output(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    rt, _, _ = runtime(store, peer)
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    done = await play(rt, head.run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    snap = await rt.snapshot(head.run_id)
    assert snap.outputs["review"] == "reviewed:\nreview the cache\nok"
    review = snap.head.task("review")
    [attempt] = review.attempts
    assert attempt.remote_run_id is not None and attempt.executor == "agent:peer:message/send"
    # one message, its id derived from the run, the task and the attempt
    assert executor.message_ids == [message_id(f"construct:{head.run_id}:review:1")]
    hops = executor.metadata[0]["construct-mcp/delegation"]  # the delegation, one hop on
    assert hops["hops"] == 1 and len(hops["servers"]) == 1
    # the token is in no record
    facts = await store.read_facts(head.run_id, 0, done.last_seq)
    assert TOKEN not in done.model_dump_json() + "".join(f.model_dump_json() for f in facts)


async def test_the_router_sends_a2a_agents_steps_to_the_a2a_client(
    store: RunStore, peer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PEER_TOKEN", TOKEN)
    agents = agent_workers({"peer": endpoint(peer)})
    rt = Runtime(
        store,
        catalog(),
        new_id=sequential_ids(),
        resolve_contract=lambda request, chain: ExecutionContract(worker_backend="inline", max_attempts=2),
        worker=Workers(None, agents),
        settings=RuntimeSettings(owner="p1", lease_ttl_seconds=30, cancel_poll_seconds=0.01),
    )
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    done = await play(rt, head.run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert (await rt.snapshot(head.run_id)).outputs["review"].startswith("reviewed:")


async def test_a_data_part_is_the_output_of_a_step_with_a_schema(store: RunStore, peer: str) -> None:
    schema = {
        "type": "object",
        "properties": {"verdict": {"type": "string"}, "score": {"type": "integer"}},
        "required": ["verdict", "score"],
    }
    raw = {
        "agents": {"peer": {"protocol": "a2a", "url": peer}},
        "chains": {
            "delegated": {
                "steps": [
                    "architect",
                    {"name": "review", "agent": "peer", "message": "data", "output_schema": schema},
                ]
            }
        },
    }
    rt, _, _ = runtime(store, peer, catalog_=Catalog.builtin().extended(raw, "construct.toml", Path(".")))
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    done = await play(rt, head.run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert json.loads((await rt.snapshot(head.run_id)).outputs["review"]) == {
        "verdict": "approve",
        "score": 3,
    }


@pytest.mark.parametrize(
    ("message", "code", "said"),
    [
        ("fail now", "agent_run_failed", "the reviewer crashed"),
        ("auth please", "auth", "sign in at https://login.example"),
    ],
)
async def test_a_task_that_does_not_complete_fails_the_step_with_a_typed_error(
    store: RunStore, peer: str, message: str, code: str, said: str
) -> None:
    rt, _, _ = runtime(store, peer, catalog_=catalog(message))
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    done = await play(rt, head.run_id)
    assert done.status == RunStatus.FAILED
    review = (await rt.snapshot(head.run_id)).head.task("review")
    [attempt] = review.attempts  # not retried
    assert attempt.error is not None and attempt.error.code == code and said in attempt.error.message


async def test_an_unreachable_agent_is_a_retried_typed_error(store: RunStore) -> None:
    rt, _, _ = runtime(store, f"http://127.0.0.1:{free_port()}")
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    done = await play(rt, head.run_id)
    assert done.status == RunStatus.FAILED
    review = (await rt.snapshot(head.run_id)).head.task("review")
    assert [a.error.code if a.error else None for a in review.attempts] == ["agent_unreachable"] * 2
    # the second attempt followed the first one's call: the same message, possibly sent twice
    assert [a.follows for a in review.attempts] == [None, 1]
    assert review.attempts[1].telemetry.possible_duplicate_call


async def test_a_wrong_token_is_an_auth_error_that_does_not_show_it(store: RunStore, peer: str) -> None:
    rt, _, _ = runtime(store, peer, token="wrong-token-9876543210")
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    done = await play(rt, head.run_id)
    review = (await rt.snapshot(head.run_id)).head.task("review")
    [attempt] = review.attempts
    assert done.status == RunStatus.FAILED and attempt.error is not None
    assert attempt.error.code == "auth" and "wrong-token" not in attempt.error.message


async def test_an_attempt_after_a_crash_resends_the_same_message_id(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    """The first attempt dies between sending and recording the task (the message reached the
    agent; no ``remote_run_started``): the next attempt sends the same message id again, marked
    a possible duplicate call, and completes."""
    first, worker, clock = runtime(store, peer)
    head, _ = await first.start(StartRequest(request="the cache", chain="delegated"))
    await first.drive(head.run_id)
    await first.submit_host_output(head.run_id, "architect", "the design")

    class Crash(BaseException):
        """Stands for SIGKILL: nothing of the process's own handles it."""

    async def crash(remote_run_id: str, ended: bool = True) -> None:
        raise Crash

    original = A2AWorker.delegate

    async def delegate_then_crash(self: A2AWorker, contract: Any, call: Any, prev: Any, remember: Any) -> Any:
        return await original(self, contract, call, prev, crash)

    worker.delegate = partial(delegate_then_crash, worker)  # type: ignore[method-assign]
    with pytest.raises(BaseException) as crashed:
        await first.drive(head.run_id)
    assert (
        crashed.group_contains(Crash)
        if isinstance(crashed.value, BaseExceptionGroup)
        else crashed.type is Crash
    )
    clock.advance(60)  # the lease of the dead process expires
    second, _, _ = runtime(store, peer, owner="p2", clock=clock)
    done = await play(second, head.run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    review = (await second.snapshot(head.run_id)).head.task("review")
    assert [a.follows for a in review.attempts] == [None, 1]
    assert review.attempts[1].telemetry.possible_duplicate_call
    sent = message_id(f"construct:{head.run_id}:review:1")
    assert executor.message_ids == [sent, sent]


async def test_cancelling_the_run_cancels_the_remote_task(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    rt, _, _ = runtime(store, peer, catalog_=catalog("slow review"))
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    await rt.drive(head.run_id)
    snap = await rt.snapshot(head.run_id)
    assert snap.host_task is not None
    await rt.submit_host_output(head.run_id, snap.host_task.task_id, "the design")
    await rt.drive(head.run_id)
    waiting = await rt.status(head.run_id)
    assert waiting.status == RunStatus.AWAITING_AGENT
    task_id = waiting.task("review").attempts[-1].remote_run_id
    cancelled = await rt.cancel(head.run_id, reason="changed my mind")
    assert cancelled.status == RunStatus.CANCELLED
    assert executor.cancelled == [task_id]
    facts = await store.read_facts(head.run_id, 0, cancelled.last_seq)
    [fact] = [f for f in facts if f.type == "remote_run_cancelled"]
    assert fact.model_dump()["cancelled"] is True


async def test_an_agent_that_answers_with_a_message_completes_the_step_at_once(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    rt, _, _ = runtime(store, peer, catalog_=catalog("hello {request}"))
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    done = await play(rt, head.run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    snap = await rt.snapshot(head.run_id)
    assert snap.outputs["review"] == "hello back"
    [attempt] = snap.head.task("review").attempts
    assert attempt.remote_run_id is None and len(executor.message_ids) == 1


async def test_steps_that_send_messages_run_side_by_side_in_a_parallel_chain(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    """Two A2A steps after the same step: both tasks started (and recorded) before either ended,
    and the writer sees both outputs."""
    steps = [
        {"specialist": "architect", "after": []},
        {"name": "left", "agent": "peer", "message": "left {outputs.architect}", "after": ["architect"]},
        {"name": "right", "agent": "peer", "message": "right {outputs.architect}", "after": ["architect"]},
        {"specialist": "writer", "after": ["left", "right"]},
    ]
    raw = {"agents": {"peer": {"protocol": "a2a", "url": peer}}, "chains": {"delegated": {"steps": steps}}}
    rt, _, _ = runtime(store, peer, catalog_=Catalog.builtin().extended(raw, "construct.toml", Path(".")))
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    done = await play(rt, head.run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    snap = await rt.snapshot(head.run_id)
    assert snap.outputs["left"].startswith("reviewed:\nleft ") and snap.outputs["right"].startswith(
        "reviewed:\nright "
    )
    ids = {snap.head.task(t).attempts[0].remote_run_id for t in ("left", "right")}
    assert None not in ids and len(ids) == 2 and len(executor.message_ids) == 2
    prompt = (await rt.prompt_for(snap.head, "writer")).user
    assert "### left (agent:peer)" in prompt and "### right (agent:peer)" in prompt


async def test_a_poll_reads_as_answered_at_once_so_the_follower_backs_off(store: RunStore, peer: str) -> None:
    """A2A has no long poll: a ``tasks/get`` answer reads as immediate, so the follower's pacing
    sleeps between polls whatever ``follow_wait_seconds`` says (never a hot loop)."""
    rt, worker, _ = runtime(store, peer, catalog_=catalog("slow review"))
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    await rt.drive(head.run_id)
    await rt.submit_host_output(head.run_id, "architect", "the design")
    await rt.drive(head.run_id)
    waiting = await rt.status(head.run_id)
    task_id = waiting.task("review").attempts[-1].remote_run_id
    assert waiting.status == RunStatus.AWAITING_AGENT and task_id is not None
    answer = await worker.remote_status("peer", task_id, 0.001)
    assert (answer.status, answer.error, answer.answered_in) == ("running", None, 0.0)
    unknown = await worker.remote_status("peer", "no-such-task", 0.001)
    assert unknown.error is not None and unknown.error.code == "agent_run_failed"
    await rt.cancel(head.run_id)

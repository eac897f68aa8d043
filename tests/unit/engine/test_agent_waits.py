"""Issue 22, findings 1-3 in one process: a run whose agent step's remote run has not ended is
``awaiting_agent`` (no drive, no lease), followed by :mod:`orchestration.engine.agent_waits` with
paced polls; answers it cannot understand are ``agent_protocol`` after a bound, in the drive's
follow too (finding 3: no hot loop); a deadline or a cancel gives the remote run up, cancelling it
there first and recording the result."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
from mcp.types import CallToolResult
from mcp_types import RequestParamsMeta

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.facts import RemoteRunCancelled
from orchestration.core.models import ExecutionContract
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.agent_waits import awaited
from orchestration.engine.dispatcher import Dispatcher
from orchestration.engine.runtime import Runtime
from orchestration.workers.agent_calls import AgentCall, AgentEndpoint
from orchestration.workers.mcp_agents import AgentWorker
from orchestration.workers.retry import RetryPolicy
from stores.memory import MemoryStore
from tests.unit.helpers import play
from tests.unit.server.test_agent_runs import (
    ENDPOINT,
    REVIEW,
    SECRET,
    FakeRemote,
    agent_worker,
    catalog,
    connector,
    result,
    runtime_for,
)

#: a quick pace, and a short bound on answers that cannot be understood
PACED = AgentEndpoint(
    name="reviewer2",
    url=ENDPOINT.url,
    token_env=ENDPOINT.token_env,
    follow_wait_seconds=0.01,
    paused_poll_seconds=0.02,
    poll_cap_seconds=0.1,
    unknown_status_seconds=0.5,
)
#: the most polls the pacing allows within the bound: each sleep is at least half its nominal
#: value, which doubles from paused_poll_seconds up to poll_cap_seconds (0.01, 0.02, 0.04, then 0.05)
MOST_POLLS = 4 + int(0.5 / 0.05) + 2


class OddRemote(FakeRemote):
    """A remote whose ``run_status`` answers at once with a status no construct-mcp has."""

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        *,
        meta: RequestParamsMeta | None = None,
    ) -> CallToolResult:
        if name == "run_status" and "detail" not in (arguments or {}):
            self.calls.append((name, dict(arguments or {})))
            return result({"run_id": (arguments or {})["run_id"], "status": "shutting_down"})
        return await super().call_tool(name, arguments, read_timeout_seconds, meta=meta)

    def poll_count(self) -> int:
        return sum(1 for n, a in self.calls if n == "run_status" and "detail" not in a)


async def awaiting(runtime: Runtime) -> str:
    """Start a delegated run and drive it until its agent step awaits the remote run."""
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    await runtime.drive(head.run_id)
    await runtime.submit_host_output(head.run_id, "architect", "the design")
    await runtime.drive(head.run_id)
    return head.run_id


async def test_a_drive_ends_once_the_remote_run_is_recorded_and_the_run_holds_nothing() -> None:
    store, remote = MemoryStore(), FakeRemote(polls=2)
    runtime = runtime_for(store, agent_worker(remote))
    run_id = await awaiting(runtime)
    head = await store.load(run_id)
    assert head.status == RunStatus.AWAITING_AGENT and head.status.kind == "paused"
    assert head.task("review").status == TaskStatus.RUNNING
    assert [(w.task_id, w.attempt, w.remote_run_id) for w in awaited(head)] == [("review", 1, "remote-1")]
    # not runnable, and no lease held: anyone may claim it (nobody needs to)
    assert run_id not in await store.runnable(runtime.clock.now())
    lease = await store.claim_lease(run_id, "other", 30, runtime.clock.now())
    assert lease is not None
    await store.release_lease(lease)
    assert [n for n, _ in remote.calls] == ["orchestrate_start"], "the drive did not follow the run"
    # the follower follows it to its end and records the step's outcome once
    assert await runtime.agent_waits.follow(run_id, awaited(head)[0])
    assert not await runtime.agent_waits.follow(run_id, awaited(head)[0]), "recorded once"
    after = await store.load(run_id)
    assert after.status == RunStatus.QUEUED and after.task("review").status == TaskStatus.DONE
    done = await play(runtime, run_id)
    assert done.status == RunStatus.COMPLETED and remote.starts() == 1


async def test_two_followers_of_one_run_record_one_outcome() -> None:
    """Two processes on one store follow the same remote run (reads only): one write wins."""
    store, remote = MemoryStore(), FakeRemote(polls=3)
    clock = ManualClock()
    first = runtime_for(store, agent_worker(remote), owner="p1", clock=clock)
    second = runtime_for(store, agent_worker(remote), owner="p2", clock=clock)
    run_id = await awaiting(first)
    wait = awaited(await store.load(run_id))[0]
    wins: list[bool] = []

    async def follow(runtime: Runtime) -> None:
        wins.append(await runtime.agent_waits.follow(run_id, wait))

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow, first)
        tg.start_soon(follow, second)
    assert sorted(wins) == [False, True]
    facts = await store.read_facts(run_id)
    assert [f.type for f in facts if getattr(f, "task_id", None) == "review"] == [
        "attempt_started",
        "remote_run_started",
        "task_completed",
    ]


async def test_the_drives_follow_paces_odd_answers_and_ends_in_agent_protocol() -> None:
    """Finding 3: a remote answering at once with a status no construct-mcp has is polled a
    bounded number of times, then the attempt fails with the typed ``agent_protocol``."""
    remote = OddRemote()
    worker = AgentWorker({"reviewer2": PACED}, env={"REVIEWER2_TOKEN": SECRET}, connect=connector(remote))
    call = AgentCall(
        run_id="r",
        task_id="review",
        attempt=1,
        agent=catalog().resolve("delegated").step("review").agent,  # type: ignore[arg-type]
        arguments={},
        idempotency_key="k",
        remote_run_id="remote-9",
    )

    async def remember(remote_run_id: str, ended: bool = True) -> None:
        raise AssertionError("a recorded remote run is not started again")

    with anyio.fail_after(10):
        outcome = await worker.delegate(ExecutionContract(max_attempts=3), call, (), remember)
    error = getattr(outcome, "error", None)
    assert error is not None and error.code == "agent_protocol" and error.retryable, outcome
    assert "shutting_down" in error.message
    assert 2 <= remote.poll_count() <= MOST_POLLS, remote.poll_count()


async def test_the_follower_paces_odd_answers_and_records_agent_protocol() -> None:
    store, remote = MemoryStore(), OddRemote()
    worker = AgentWorker(
        {"reviewer2": PACED},
        env={"REVIEWER2_TOKEN": SECRET},
        connect=connector(remote),
        policy=RetryPolicy(base_delay_seconds=0),
    )
    runtime = runtime_for(store, worker)
    run_id = await awaiting(runtime)
    with anyio.fail_after(10):
        assert await runtime.agent_waits.follow(run_id, awaited(await store.load(run_id))[0])
    head = await store.load(run_id)
    attempt = head.task("review").attempts[-1]
    assert head.status == RunStatus.QUEUED and attempt.error is not None
    assert attempt.error.code == "agent_protocol"
    assert 2 <= remote.poll_count() <= MOST_POLLS, remote.poll_count()
    # the next attempt follows the same remote run (its outcome is unknown), and waits again
    await runtime.drive(run_id)
    again = await store.load(run_id)
    assert again.status == RunStatus.AWAITING_AGENT
    last = again.task("review").attempts[-1]
    assert (last.number, last.follows, last.remote_run_id) == (2, 1, "remote-1")
    assert remote.starts() == 1


async def test_a_deadline_while_awaiting_fails_the_step_and_cancels_the_remote_run() -> None:
    store, remote = MemoryStore(), FakeRemote()
    clock = ManualClock()
    runtime = runtime_for(store, agent_worker(remote), clock=clock)
    runtime.catalog = catalog({**REVIEW, "timeout_seconds": 60})
    run_id = await awaiting(runtime)
    head = await store.load(run_id)
    assert head.status == RunStatus.AWAITING_AGENT and head.wake_at is not None
    clock.advance(61)
    assert run_id in await store.runnable(clock.now()), "its wake_at hands it out"
    await runtime.drive(run_id)
    failed = await store.load(run_id)
    assert failed.status == RunStatus.FAILED and failed.error is not None
    assert failed.error.code == "deadline_exceeded"
    assert (
        "orchestrate_cancel",
        {"run_id": "remote-1", "reason": f"run {run_id} gave up waiting: task_failed"},
    ) in remote.calls
    facts = await store.read_facts(run_id)
    cancels = [f for f in facts if isinstance(f, RemoteRunCancelled)]
    assert [(f.remote_run_id, f.cancelled, f.error) for f in cancels] == [("remote-1", True, None)]


async def test_cancelling_a_run_awaiting_its_agent_cancels_the_remote_run_and_records_it() -> None:
    store, remote = MemoryStore(), FakeRemote()
    runtime = runtime_for(store, agent_worker(remote))
    run_id = await awaiting(runtime)
    wait = awaited(await store.load(run_id))[0]
    cancelled = await runtime.cancel(run_id, reason="not needed")
    assert cancelled.status == RunStatus.CANCELLED
    assert remote.calls[-1] == (
        "orchestrate_cancel",
        {"run_id": "remote-1", "reason": f"run {run_id} was cancelled"},
    )
    facts = await store.read_facts(run_id)
    assert [f.type for f in facts[-2:]] == ["remote_run_cancelled", "run_cancelled"]
    assert not await runtime.agent_waits.follow(run_id, wait), "nothing is recorded after the cancel"


async def test_a_cancel_records_a_remote_that_does_not_answer() -> None:
    store, remote = MemoryStore(), FakeRemote()
    runtime = runtime_for(store, agent_worker(remote))
    runtime.settings = replace(runtime.settings, remote_cancel_seconds=0.2)
    run_id = await awaiting(runtime)
    remote.hang = True
    original = remote.call_tool

    async def hanging(
        name: str, arguments: Any = None, read_timeout_seconds: Any = None, *, meta: Any = None
    ) -> CallToolResult:
        if name == "orchestrate_cancel":
            await anyio.sleep_forever()
        return await original(name, arguments, read_timeout_seconds, meta=meta)

    remote.call_tool = hanging  # type: ignore[method-assign]
    with anyio.fail_after(5):
        await runtime.cancel(run_id)
    facts = await store.read_facts(run_id)
    assert [(f.type, getattr(f, "cancelled", None), getattr(f, "error", None)) for f in facts[-2:]] == [
        ("remote_run_cancelled", False, "timeout"),
        ("run_cancelled", None, None),
    ]


async def test_the_dispatcher_follows_at_once_and_its_sweep_after_a_restart() -> None:
    """The dispatcher of the process that made the run await starts its follower at once; a
    dispatcher started later on the same store (a restart) finds it by its sweep."""
    store, remote = MemoryStore(), FakeRemote(polls=1)
    runtime = runtime_for(store, agent_worker(remote), owner="p1")
    run_id = await awaiting(runtime)  # awaiting, with nobody following it (no dispatcher ran)
    restarted = runtime_for(store, agent_worker(remote), owner="p2")
    dispatcher = Dispatcher(restarted, poll_seconds=0.01, child_poll_seconds=0.01)
    async with anyio.create_task_group() as tg:
        await tg.start(dispatcher.run)
        with anyio.fail_after(10):
            while (await store.load(run_id)).task("review").status != TaskStatus.DONE:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        dispatcher.stop()
    assert remote.starts() == 1


async def test_a_parallel_run_whose_only_work_is_remote_runs_awaits_them_without_a_drive() -> None:
    """Two steps that delegate side by side: once both remote runs are recorded the run is
    ``awaiting_agent`` and its drive has ended; both are followed to their end."""
    store, remote = MemoryStore(), FakeRemote(polls=1)
    both = {"chain": "review-loop", "request": "{outputs.architect}"}
    agent = {"agent": "reviewer2", "tool": "orchestrate_start", "arguments": both, "after": ["architect"]}
    steps = [
        {"specialist": "architect", "after": []},
        {"name": "left", **agent},
        {"name": "right", **agent},
        {"specialist": "writer", "after": ["left", "right"]},
    ]
    raw = {"agents": {"reviewer2": {}}, "chains": {"delegated": {"steps": steps}}}
    runtime = runtime_for(store, agent_worker(remote))
    runtime.catalog = Catalog.builtin().extended(raw, "construct.toml", Path("."))
    run_id = await awaiting(runtime)
    head = await store.load(run_id)
    assert head.status == RunStatus.AWAITING_AGENT, head.status
    assert sorted(w.task_id for w in awaited(head)) == ["left", "right"]
    assert [n for n, _ in remote.calls] == ["orchestrate_start"] * 2, "no follow in the drive"
    done = await play(runtime, run_id)
    assert done.status == RunStatus.COMPLETED and remote.starts() == 2


async def test_rejecting_a_parallel_runs_gate_cancels_the_remote_run_it_awaits() -> None:
    """A branch waits at a gate beside an awaited remote run (the run shows the gate first):
    rejecting the gate ends the run, and the remote run is cancelled there first, recorded."""
    store, remote = MemoryStore(), FakeRemote()
    both = {"chain": "review-loop", "request": "{outputs.architect}"}
    steps = [
        {"specialist": "architect", "after": []},
        {
            "name": "left",
            "agent": "reviewer2",
            "tool": "orchestrate_start",
            "arguments": both,
            "after": ["architect"],
        },
        {"specialist": "writer", "after": ["architect"], "approve_before": True},
    ]
    raw = {"agents": {"reviewer2": {}}, "chains": {"delegated": {"steps": steps}}}
    runtime = runtime_for(store, agent_worker(remote))
    runtime.catalog = Catalog.builtin().extended(raw, "construct.toml", Path("."))
    run_id = await awaiting(runtime)
    head = await store.load(run_id)
    assert head.status == RunStatus.AWAITING_APPROVAL and [w.task_id for w in awaited(head)] == ["left"]
    rejected = await runtime.approve(run_id, "reject", "before:writer", "no")
    assert rejected.status == RunStatus.REJECTED
    reason = f"run {run_id} gave up waiting: approval_decided"
    assert remote.calls[-1] == ("orchestrate_cancel", {"run_id": "remote-1", "reason": reason})
    facts = await store.read_facts(run_id)
    assert [f.type for f in facts[-2:]] == ["remote_run_cancelled", "approval_decided"]

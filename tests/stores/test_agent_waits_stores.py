"""A run ``awaiting_agent`` on every store (issue 22, finding 1): not runnable and not claimed (it
holds no lease and needs no slot), listed by its status for the follower's sweep, handed out again
once its step's deadline passes; and its follower's outcome is one compare-and-swap write."""

from __future__ import annotations

from datetime import timedelta

from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.agent_waits import awaited
from orchestration.store import ClaimsRunnable, RunStore
from tests.unit.helpers import play
from tests.unit.server.test_agent_runs import REVIEW, FakeRemote, agent_worker, catalog, runtime_for


async def test_a_run_awaiting_its_agent_is_listed_but_neither_runnable_nor_claimed(store: RunStore) -> None:
    remote, clock = FakeRemote(polls=1), ManualClock()
    runtime = runtime_for(store, agent_worker(remote), clock=clock)
    runtime.catalog = catalog({**REVIEW, "timeout_seconds": 600})
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    await runtime.drive(head.run_id)
    await runtime.submit_host_output(head.run_id, "architect", "the design")
    await runtime.drive(head.run_id)
    waiting = await store.load(head.run_id)
    assert waiting.status == RunStatus.AWAITING_AGENT and waiting.format == 6
    assert head.run_id not in await store.runnable(clock.now())
    if isinstance(store, ClaimsRunnable):
        assert await store.claim_runnable("other", 30, clock.now(), 10) == []
    listed = await store.list_runs(frozenset({RunStatus.AWAITING_AGENT}), 10)
    assert [r.run_id for r in listed.runs] == [head.run_id]
    assert await runtime.agent_waits.sweep() == 0, "no followers run here: the sweep starts none"
    # its step's deadline hands it out again
    assert head.run_id in await store.runnable(clock.now() + timedelta(seconds=601))
    # followed to its end: one outcome, then the run goes on
    assert await runtime.agent_waits.follow(head.run_id, awaited(waiting)[0])
    after = await store.load(head.run_id)
    assert after.status == RunStatus.QUEUED and after.task("review").status == TaskStatus.DONE
    done = await play(runtime, head.run_id)
    assert done.status == RunStatus.COMPLETED and remote.starts() == 1

"""A drive under store faults (``Runtime.drive``): an append whose commit status is unknown is
reconciled from the record, never lost and never written twice; a short outage during a provider
call is ridden out; an outage past ``store_outage_seconds`` cancels the call and stops the drive
cleanly, and the run resumes from its facts once the store is back."""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core.clock import SystemClock
from orchestration.core.facts import AttemptStarted, TaskCompleted
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from orchestration.errors import StoreUnavailable
from orchestration.store import RunStore
from stores.memory import MemoryStore
from tests.unit.faulty import CountingWorker, FaultyStore, provider_contract, start_request
from tests.unit.helpers import sequential_ids

TASKS = ("architect", "engineer", "reviewer")


def make(
    store: RunStore, worker: CountingWorker, outage_seconds: float = 5.0, lease_ttl_seconds: float = 3
) -> Runtime:
    return Runtime(
        store,
        Catalog.builtin(),
        clock=SystemClock(),
        new_id=sequential_ids(),
        resolve_contract=provider_contract,
        worker=worker,
        settings=RuntimeSettings(
            lease_ttl_seconds=lease_ttl_seconds, cancel_poll_seconds=0.05, store_outage_seconds=outage_seconds
        ),
    )


async def assert_clean_log(store: FaultyStore, run_id: str) -> None:
    """Sequence numbers contiguous, one completion per task, the run completed."""
    facts = await store.inner.read_facts(run_id)
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
    completed = [f.task_id for f in facts if isinstance(f, TaskCompleted)]
    assert completed == list(TASKS)
    assert (await store.inner.load(run_id)).status == RunStatus.COMPLETED


@pytest.mark.parametrize("writes_before_fault", [0, 1, 2, 3, 4])
async def test_an_append_that_committed_before_the_connection_died_is_not_written_again(
    writes_before_fault: int,
) -> None:
    store, worker = FaultyStore(MemoryStore()), CountingWorker()
    runtime = make(store, worker)
    head, _ = await runtime.start(start_request("r1"))
    appends = 0

    def fault(op: str) -> None:
        nonlocal appends
        if op == "append":
            appends += 1
            if appends == writes_before_fault + 1:
                store.fail_after_commit = 1

    store.before = fault
    with anyio.fail_after(10):
        await runtime.drive(head.run_id)
    await assert_clean_log(store, head.run_id)
    # Reconciled from the record, not retried into a second call or a second fact.
    assert worker.calls == {("r1", t): 1 for t in TASKS}
    facts = await store.inner.read_facts(head.run_id)
    assert not any(isinstance(f, AttemptStarted) and f.possible_duplicate_call for f in facts)


async def test_an_append_that_did_not_commit_is_made_again() -> None:
    store, worker = FaultyStore(MemoryStore()), CountingWorker()
    runtime = make(store, worker)
    head, _ = await runtime.start(start_request("r1"))
    store.fail_before_commit = 3
    with anyio.fail_after(10):
        await runtime.drive(head.run_id)
    await assert_clean_log(store, head.run_id)
    assert worker.calls == {("r1", t): 1 for t in TASKS}


async def test_a_short_outage_during_a_call_is_ridden_out() -> None:
    store, worker = FaultyStore(MemoryStore()), CountingWorker(delay=0.4)
    runtime = make(store, worker, outage_seconds=5)
    head, _ = await runtime.start(start_request("r1"))

    async def outage() -> None:
        while worker.in_flight == 0:  # noqa: ASYNC110 - the worker has no event to wait on
            await anyio.sleep(0.01)
        store.down = True
        # Longer than the call: its outcome must wait for the store, not be dropped.
        await anyio.sleep(0.8)
        store.down = False

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(outage)
            await runtime.drive(head.run_id)
    assert store.failures > 0, "the store really was down during the drive"
    await assert_clean_log(store, head.run_id)
    assert worker.calls == {("r1", t): 1 for t in TASKS}
    assert sum(worker.cancelled.values()) == 0


async def test_an_outage_past_the_limit_cancels_the_call_and_the_run_resumes_later() -> None:
    store, worker = FaultyStore(MemoryStore()), CountingWorker(delay=5)
    runtime = make(store, worker, outage_seconds=0.3)
    head, _ = await runtime.start(start_request("r1"))

    async def outage() -> None:
        while worker.in_flight == 0:  # noqa: ASYNC110 - the worker has no event to wait on
            await anyio.sleep(0.01)
        store.down = True

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(outage)
            started = anyio.current_time()
            with pytest.raises(StoreUnavailable, match="did not answer"):
                await runtime.drive(head.run_id)
            stopped_after = anyio.current_time() - started
    # Stopped soon after the limit, long before the 5 s call would have ended into a dead store.
    assert stopped_after < 2.5
    assert worker.cancelled == {("r1", "architect"): 1}
    assert worker.in_flight == 0

    store.down = False
    worker.delay = 0
    # The lease could not be released while the store was down; another worker takes over
    # once it expires (ttl 3 s), and the cancelled attempt is an orphan retried as attempt 2.
    other = make(store, worker)
    other.settings = replace(other.settings, owner="another-worker")
    with anyio.fail_after(10):
        # None while the stale lease holds: try again until it has expired.
        while await other.drive(head.run_id) is None:  # noqa: ASYNC110
            await anyio.sleep(0.2)
    await assert_clean_log(store, head.run_id)
    facts = await store.inner.read_facts(head.run_id)
    marked = [
        (f.task_id, f.attempt) for f in facts if isinstance(f, AttemptStarted) and f.possible_duplicate_call
    ]
    assert marked == [("architect", 2)]

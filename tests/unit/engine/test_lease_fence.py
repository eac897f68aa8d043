"""A lease is a fence, not a hint (``Runtime.drive``, DESIGN §9), in process.

A drive that stalls past its lease — here its provider call blocks while the injected clock moves
past the TTL, and its lease keeper and cancel watch sleep far longer, as in a process that was not
scheduled at all — while another worker claims the run and finishes it: when the stalled drive
wakes up, its next write is refused (``LeaseLost``), it records nothing, and the run ends
``completed`` with each task's output recorded once. Also: one drive per run per runtime, and a
claim the runtime makes again on a run it is driving is handed to that drive.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from orchestration.chains.catalog import Catalog
from orchestration.chains.prompts import TaskPrompt
from orchestration.core.clock import ManualClock
from orchestration.core.facts import AttemptStarted, Fact, TaskCompleted
from orchestration.core.models import ChainStep, ExecutionContract, Telemetry, TypedError
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.dispatcher import Dispatcher
from orchestration.engine.runtime import Runtime
from orchestration.errors import LeaseLost
from orchestration.store import RunStore
from orchestration.workers.port import DeltaSink
from stores.filesystem import FilesystemStore
from stores.memory import MemoryStore
from stores.sqlite import SqliteStore
from tests.unit.faulty import FaultyStore, provider_contract, start_request
from tests.unit.helpers import sequential_ids

TASKS = ("architect", "engineer", "reviewer")
TTL = 60.0
#: Far longer than any of these tests: the stalled drive neither renews nor polls for changes.
STALLED = 3600.0


class StallingWorker:
    """A provider worker whose first call blocks until :attr:`gate` is set (a stalled process);
    later calls return at once. Outputs name the worker, so the log shows who recorded them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[str] = []
        self.gate = anyio.Event()
        self.entered = anyio.Event()

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        self.calls.append(step.name)
        if len(self.calls) == 1:
            self.entered.set()
            await self.gate.wait()
        return AttemptSucceeded(f"{step.name} by {self.name}", Telemetry(output_tokens=1))


def runtime(store: RunStore, worker: StallingWorker, clock: ManualClock, owner: str, poll: float) -> Runtime:
    return Runtime(
        store,
        Catalog.builtin(),
        clock=clock,
        new_id=sequential_ids(),
        resolve_contract=provider_contract,
        worker=worker,
        settings=RuntimeSettings(owner=owner, lease_ttl_seconds=TTL, cancel_poll_seconds=poll),
    )


@asynccontextmanager
async def open_store(kind: str, tmp_path: Path) -> AsyncIterator[RunStore]:
    store: RunStore
    if kind == "memory":
        store = MemoryStore()
    elif kind == "filesystem":
        store = FilesystemStore(tmp_path / "store")
    else:
        store = await SqliteStore.open(tmp_path / "store.db")
    try:
        yield store
    finally:
        await store.close()


STORES = ["memory", "filesystem", "sqlite"]


async def completions(store: RunStore, run_id: str) -> list[TaskCompleted]:
    return [f for f in await store.read_facts(run_id) if isinstance(f, TaskCompleted)]


def attempts(facts: list[Fact]) -> list[tuple[str, int, bool]]:
    return [(f.task_id, f.attempt, f.possible_duplicate_call) for f in facts if isinstance(f, AttemptStarted)]


async def assert_taken_over_cleanly(
    store: RunStore, run_id: str, a: StallingWorker, b: StallingWorker
) -> None:
    head = await store.load(run_id)
    assert head.status == RunStatus.COMPLETED
    facts = await store.read_facts(run_id)
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
    # Each task's output recorded once, all by the worker that took the run over.
    assert [(f.task_id, f.output) for f in await completions(store, run_id)] == [
        (task, f"{task} by worker-b") for task in TASKS
    ]
    # The stalled worker called once; the call it could not record was made again, marked.
    assert a.calls == ["architect"]
    assert b.calls == list(TASKS)
    assert attempts(facts) == [
        ("architect", 1, False),
        ("architect", 2, True),
        ("engineer", 1, False),
        ("reviewer", 1, False),
    ]


@pytest.mark.parametrize("kind", STORES)
async def test_a_drive_that_stalled_past_its_lease_records_nothing_after_a_takeover(
    kind: str, tmp_path: Path
) -> None:
    async with open_store(kind, tmp_path) as store:
        clock = ManualClock()
        worker_a, worker_b = StallingWorker("worker-a"), StallingWorker("worker-b")
        a = runtime(store, worker_a, clock, "worker-a", poll=STALLED)
        b = runtime(store, worker_b, clock, "worker-b", poll=0.05)
        head, _ = await a.start(start_request("r1"))
        run_id = head.run_id
        errors: list[BaseException] = []
        a_done = anyio.Event()

        async def drive_a() -> None:
            try:
                await a.drive(run_id)
            except LeaseLost as exc:
                errors.append(exc)
            finally:
                a_done.set()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drive_a)
                await worker_a.entered.wait()
                # worker-a is stalled in its call; its lease runs out and worker-b claims the run,
                # retrying the attempt it finds in flight as an orphan (its call blocks for now).
                clock.advance(TTL + 1)
                tg.start_soon(b.drive, run_id)
                await worker_b.entered.wait()
                before = await store.read_facts(run_id)
                # worker-a wakes up: its call returns, and its next write must be refused.
                worker_a.gate.set()
                await a_done.wait()
                assert len(errors) == 1 and isinstance(errors[0], LeaseLost), errors
                assert errors[0].code == "lease_lost"
                assert await store.read_facts(run_id) == before
                worker_b.gate.set()
        await assert_taken_over_cleanly(store, run_id, worker_a, worker_b)


async def test_the_dispatcher_leaves_a_run_whose_lease_was_lost_to_its_holder(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``LeaseLost`` from a drive is the fence doing its job: logged at INFO, not a failure."""
    caplog.set_level(logging.INFO)
    store = MemoryStore()
    clock = ManualClock()
    worker_a, worker_b = StallingWorker("worker-a"), StallingWorker("worker-b")
    a = runtime(store, worker_a, clock, "worker-a", poll=STALLED)
    b = runtime(store, worker_b, clock, "worker-b", poll=0.05)
    head, _ = await a.start(start_request("r1"))
    dispatcher = Dispatcher(a, poll_seconds=0.05)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(dispatcher.run)
            await worker_a.entered.wait()
            clock.advance(TTL + 1)
            tg.start_soon(b.drive, head.run_id)
            await worker_b.entered.wait()
            worker_a.gate.set()
            # Polling the log: the dispatcher has no event for "a drive ended".
            while not any(getattr(r, "action", None) == "drive_lease_lost" for r in caplog.records):  # noqa: ASYNC110
                await anyio.sleep(0.02)
            worker_b.gate.set()
            while (await store.load(head.run_id)).status != RunStatus.COMPLETED:  # noqa: ASYNC110
                await anyio.sleep(0.02)
            dispatcher.stop()
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert "drive_failed" not in actions and "drive_crashed" not in actions
    lost = [r for r in caplog.records if getattr(r, "action", None) == "drive_lease_lost"]
    assert all(r.levelno == logging.INFO for r in lost)
    await assert_taken_over_cleanly(store, head.run_id, worker_a, worker_b)


async def test_a_second_drive_of_a_run_in_one_runtime_returns_at_once_without_claiming() -> None:
    store = FaultyStore(MemoryStore())
    worker = StallingWorker("worker-a")
    a = runtime(store, worker, ManualClock(), "worker-a", poll=0.05)
    head, _ = await a.start(start_request("r1"))
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.drive, head.run_id)
            await worker.entered.wait()
            claims = store.calls["claim_lease"]
            # Without the guard this drive would claim again (same owner), take the running
            # attempt for an orphan and call the provider a second time.
            assert await a.drive(head.run_id) is None
            assert store.calls["claim_lease"] == claims
            worker.gate.set()
    assert worker.calls == list(TASKS)
    facts = await store.inner.read_facts(head.run_id)
    assert [f.task_id for f in facts if isinstance(f, TaskCompleted)] == list(TASKS)
    assert not any(dup for _, _, dup in attempts(facts))


@pytest.mark.parametrize("via", ["hand_over", "dispatcher"])
async def test_a_claim_made_again_by_the_same_runtime_is_handed_to_its_drive(
    via: str, tmp_path: Path
) -> None:
    """A drive whose own lease ran out unrenewed (its process stalled, nobody else came) and that
    this runtime claimed again goes on with the new lease: no second call, no ``LeaseLost``."""
    store = FaultyStore(await SqliteStore.open(tmp_path / "store.db"))
    try:
        clock = ManualClock()
        worker = StallingWorker("worker-a")
        a = runtime(store, worker, clock, "worker-a", poll=0.05)
        head, _ = await a.start(start_request("r1"))
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                if via == "hand_over":
                    tg.start_soon(a.drive, head.run_id)
                    await worker.entered.wait()
                    clock.advance(TTL + 1)
                    again = await store.claim_lease(head.run_id, "worker-a", TTL, clock.now())
                    assert again is not None
                    assert a.hand_over(again)
                else:
                    dispatcher = Dispatcher(a, poll_seconds=0.05)
                    await tg.start(dispatcher.run)
                    await worker.entered.wait()
                    clock.advance(TTL + 1)
                    # Two more batch claims: at least one saw the expired lease and took it again.
                    claims = store.calls["claim_runnable"]
                    while store.calls["claim_runnable"] < claims + 2:  # noqa: ASYNC110
                        await anyio.sleep(0.02)
                worker.gate.set()
                while (await store.load(head.run_id)).status != RunStatus.COMPLETED:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
                if via == "dispatcher":
                    dispatcher.stop()
        assert worker.calls == list(TASKS)
        facts = await store.inner.read_facts(head.run_id)
        assert [f.task_id for f in facts if isinstance(f, TaskCompleted)] == list(TASKS)
        assert not any(dup for _, _, dup in attempts(facts))
    finally:
        await store.close()

"""Parallel runs on the provider backend (one drive runs a run's ready steps at once): calls in
flight together, the chain's ``max_parallel``, siblings that do not disturb each other, outcomes
recorded against the run as it is when they arrive, a cancel that stops every call.

Concurrency is proven without timing: the fake workers block until the calls they expect are all
in flight (a sequential drive would never get there; ``fail_after`` only turns that hang into a
failure)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
import pytest

from orchestration.chains.prompts import TaskPrompt
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.facts import AttemptStarted, Fact, TaskCompleted
from orchestration.core.models import ChainStep, ExecutionContract, RunHead, Telemetry, TypedError
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from orchestration.store import Lease
from orchestration.workers.port import DeltaSink
from stores.memory import MemoryStore
from tests.unit.helpers import provider_contract, sequential_ids
from tests.unit.parallel import PARALLEL_CATALOG, RESEARCHERS

HANG_GUARD_SECONDS = 20


def runtime_with(worker: object, store: MemoryStore | None = None) -> Runtime:
    return Runtime(
        store or MemoryStore(),
        PARALLEL_CATALOG,
        clock=ManualClock(),
        new_id=sequential_ids(),
        resolve_contract=provider_contract,
        worker=worker,  # type: ignore[arg-type]
        settings=RuntimeSettings(lease_ttl_seconds=30, cancel_poll_seconds=0.01),
    )


@dataclass
class Barrier:
    """A worker whose calls wait until ``expected`` of them are in flight at once; records the
    most that ever were."""

    expected: int
    in_flight: int = 0
    most: int = 0
    started: list[str] = field(default_factory=list)
    all_in: anyio.Event = field(default_factory=anyio.Event)

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        self.started.append(step.name)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        if step.specialist == "researcher":
            if self.in_flight >= self.expected:
                self.all_in.set()
            await self.all_in.wait()
            # Let the other calls see the barrier open before this one ends.
            await anyio.lowlevel.checkpoint()
        self.in_flight -= 1
        return AttemptSucceeded(f"{step.name} output", Telemetry(output_tokens=3))


async def test_three_calls_are_in_flight_at_once() -> None:
    worker = Barrier(expected=3)
    runtime = runtime_with(worker)
    head, _ = await runtime.start(StartRequest("Study it", chain="research", worker_backend="provider"))
    with anyio.fail_after(HANG_GUARD_SECONDS):
        await runtime.drive(head.run_id)
    final = await runtime.status(head.run_id)
    assert final.status == RunStatus.COMPLETED
    assert worker.most == 3
    assert worker.started[-1] == "writer" and sorted(worker.started[:3]) == sorted(RESEARCHERS)


@dataclass
class Bounded:
    """Researcher calls wait for ``release``; ``two_in`` is set once two are in flight."""

    in_flight: int = 0
    most: int = 0
    started: int = 0
    two_in: anyio.Event = field(default_factory=anyio.Event)
    release: anyio.Event = field(default_factory=anyio.Event)

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        self.started += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        if self.in_flight == 2:
            self.two_in.set()
        if step.specialist == "researcher":
            await self.release.wait()
        self.in_flight -= 1
        return AttemptSucceeded(f"{step.name} output", Telemetry())


async def test_max_parallel_bounds_the_calls_in_flight() -> None:
    worker = Bounded()
    runtime = runtime_with(worker)
    head, _ = await runtime.start(StartRequest("Study it", chain="fan-two", worker_backend="provider"))
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.drive, head.run_id)
            await worker.two_in.wait()
            # Give the drive every chance to start the third branch (the memory store never
            # blocks, so a drive without the bound would have started it by now).
            for _ in range(200):
                await anyio.lowlevel.checkpoint()
            assert worker.started == 2
            worker.release.set()
    assert (await runtime.status(head.run_id)).status == RunStatus.COMPLETED
    assert worker.most == 2 and worker.started == 4


class NotifyingStore(MemoryStore):
    """Sets ``a_done`` once task ``a``'s output is recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.a_done = anyio.Event()

    async def append(
        self,
        run_id: str,
        expected_version: int,
        facts: Sequence[Fact],
        head: RunHead,
        lease: Lease | None = None,
        *,
        flushing: Callable[[], None] | None = None,
    ) -> RunHead:
        stored = await super().append(run_id, expected_version, facts, head, lease, flushing=flushing)
        if any(isinstance(f, TaskCompleted) and f.task_id == "a" for f in facts):
            self.a_done.set()
        return stored


@dataclass
class Sibling:
    """``a`` answers at once; ``b`` answers only once ``a``'s output is recorded (the run's version
    has moved on since ``b``'s attempt started); ``c`` likewise."""

    store: NotifyingStore
    calls: list[tuple[str, int]] = field(default_factory=list)

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        self.calls.append((step.name, attempt))
        if step.name in ("b", "c"):
            await self.store.a_done.wait()
        return AttemptSucceeded(f"{step.name} output", Telemetry())


async def test_a_siblings_outcome_neither_cancels_a_call_nor_loses_its_outcome() -> None:
    store = NotifyingStore()
    worker = Sibling(store)
    runtime = runtime_with(worker, store)
    head, _ = await runtime.start(StartRequest("Study it", chain="fan-continue", worker_backend="provider"))
    with anyio.fail_after(HANG_GUARD_SECONDS):
        await runtime.drive(head.run_id)
    final = await runtime.status(head.run_id)
    assert final.status == RunStatus.COMPLETED
    # One call per task: b and c were not cancelled when a's outcome changed the run.
    assert sorted(worker.calls) == [("a", 1), ("b", 1), ("c", 1), ("writer", 1)]
    facts = await store.read_facts(head.run_id)
    started = {f.task_id: f.seq for f in facts if isinstance(f, AttemptStarted)}
    done = {f.task_id: f.seq for f in facts if isinstance(f, TaskCompleted)}
    # b's outcome was recorded against a head newer than the one its attempt started on.
    assert started["b"] < done["a"] < done["b"]
    assert sorted(done) == ["a", "b", "c", "writer"]
    assert not any(f.possible_duplicate_call for f in facts if isinstance(f, AttemptStarted))


@dataclass
class Blocked:
    """Every call blocks until cancelled."""

    started: int = 0
    in_flight: anyio.Event = field(default_factory=anyio.Event)

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        self.started += 1
        if self.started == 3:
            self.in_flight.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


async def test_a_cancel_stops_every_call_in_flight() -> None:
    worker = Blocked()
    runtime = runtime_with(worker)
    head, _ = await runtime.start(StartRequest("Study it", chain="research", worker_backend="provider"))
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.drive, head.run_id)
            await worker.in_flight.wait()
            await runtime.cancel(head.run_id, reason="enough")
    final = await runtime.status(head.run_id)
    assert final.status == RunStatus.CANCELLED
    assert [t.status for t in final.tasks] == [TaskStatus.CANCELLED] * 4


@pytest.mark.parametrize("failing", ["b"])
async def test_a_required_branch_failing_ends_the_run_and_stops_its_siblings(failing: str) -> None:
    """b fails (not retryable, on_failure fail) while a and c are still in flight: the run fails
    at once, and their calls are stopped (their tasks cancelled), not waited for."""

    @dataclass
    class FailB(Blocked):
        async def execute(
            self,
            contract: ExecutionContract,
            step: ChainStep,
            prompt: TaskPrompt,
            attempt: int,
            previous_errors: tuple[TypedError, ...],
            sink: DeltaSink | None = None,
        ) -> AttemptOutcome:
            if step.name == failing:
                from orchestration.core.outcomes import AttemptFailedOutcome

                return AttemptFailedOutcome(TypedError(code="auth", message="bad key"), Telemetry())
            return await super().execute(contract, step, prompt, attempt, previous_errors)

    runtime = runtime_with(FailB())
    head, _ = await runtime.start(StartRequest("Study it", chain="fan-continue", worker_backend="provider"))
    with anyio.fail_after(HANG_GUARD_SECONDS):
        await runtime.drive(head.run_id)
    final = await runtime.status(head.run_id)
    assert final.status == RunStatus.FAILED and final.error is not None and final.error.code == "auth"
    statuses = {t.task_id: t.status for t in final.tasks}
    assert statuses == {
        "a": TaskStatus.CANCELLED,
        "b": TaskStatus.FAILED,
        "c": TaskStatus.CANCELLED,
        "writer": TaskStatus.SKIPPED,
    }


@dataclass
class Released:
    """Calls wait until released; ``all_in`` is set once three are in flight."""

    started: int = 0
    all_in: anyio.Event = field(default_factory=anyio.Event)
    release: anyio.Event = field(default_factory=anyio.Event)

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        self.started += 1
        if self.started == 3:
            self.all_in.set()
        await self.release.wait()
        return AttemptSucceeded(f"{step.name} output", Telemetry())


async def test_a_graceful_stop_lets_the_calls_in_flight_end_and_records_them() -> None:
    worker = Released()
    runtime = runtime_with(worker)
    head, _ = await runtime.start(StartRequest("Study it", chain="research", worker_backend="provider"))
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.drive, head.run_id)
            await worker.all_in.wait()
            runtime.stop()
            worker.release.set()
    final = await runtime.status(head.run_id)
    # The three outputs are recorded; the writer was not started (the runtime is stopping).
    assert [t.status for t in final.tasks] == [TaskStatus.DONE] * 3 + [TaskStatus.PENDING]
    assert worker.started == 3

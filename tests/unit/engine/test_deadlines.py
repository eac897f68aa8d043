"""Per-task and per-run time limits: passing one fails the task or the run with
``deadline_exceeded``, durably — also when nothing was running at that moment."""

from __future__ import annotations

import anyio
import pytest

from orchestration.chains.prompts import TaskPrompt
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock, SystemClock
from orchestration.core.models import ChainStep, ExecutionContract, Telemetry, TypedError
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.errors import InvalidState
from orchestration.workers.port import DeltaSink
from stores.memory import MemoryStore
from tests.unit.helpers import make_runtime


async def test_task_deadline_fails_a_host_task_that_was_never_answered() -> None:
    clock = ManualClock()
    runtime = make_runtime(clock=clock)
    head, _ = await runtime.start(StartRequest("x", task_timeout_seconds=60))
    await runtime.drive(head.run_id)
    paused = await runtime.status(head.run_id)
    assert paused.status == RunStatus.AWAITING_HOST and paused.wake_at is not None
    assert await runtime.store.runnable(clock.now()) == []
    clock.advance(61)
    # The paused run shows up as runnable once its deadline passed: a dispatcher will find it.
    assert await runtime.store.runnable(clock.now()) == [head.run_id]
    with pytest.raises(InvalidState, match="ran out of time"):
        await runtime.submit_host_output(head.run_id, "architect", "too late")
    await runtime.drive(head.run_id)
    final = await runtime.status(head.run_id)
    assert final.status == RunStatus.FAILED
    architect = final.task("architect")
    assert architect.status == TaskStatus.FAILED and architect.error is not None
    assert architect.error.code == "deadline_exceeded"
    assert final.error is not None and final.error.code == "deadline_exceeded"


async def test_run_deadline_while_awaiting_approval() -> None:
    clock = ManualClock()
    runtime = make_runtime(clock=clock)
    head, _ = await runtime.start(StartRequest("x", approve_before=("architect",), timeout_seconds=10))
    await runtime.drive(head.run_id)
    clock.advance(10)
    with pytest.raises(InvalidState, match="ran out of time"):
        await runtime.approve(head.run_id, "approve", "before:architect")
    await runtime.drive(head.run_id)
    final = await runtime.status(head.run_id)
    assert final.status == RunStatus.FAILED and final.error is not None
    assert final.error.code == "deadline_exceeded"
    assert all(t.status == TaskStatus.SKIPPED for t in final.tasks)
    assert final.wake_at is None


async def test_task_limit_from_start_does_not_override_the_chain() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("x", task_timeout_seconds=5))
    assert all(s.timeout_seconds == 5 for s in head.chain.steps)


class SlowWorker:
    def __init__(self) -> None:
        self.cancelled = 0

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        return AttemptSucceeded("late", Telemetry())


async def test_a_provider_call_is_aborted_at_the_task_deadline() -> None:
    worker = SlowWorker()
    runtime = make_runtime(MemoryStore(), clock=None)
    runtime.clock = SystemClock()
    runtime.worker = worker
    head, _ = await runtime.start(
        StartRequest("x", chain=("writer",), worker_backend="provider", task_timeout_seconds=0.3)
    )
    with anyio.fail_after(10):
        await runtime.drive(head.run_id)
    final = await runtime.status(head.run_id)
    assert worker.cancelled == 1
    assert final.status == RunStatus.FAILED
    writer = (await runtime.snapshot(head.run_id)).head.task("writer")
    assert writer.error is not None and writer.error.code == "deadline_exceeded"
    assert len(writer.attempts) == 1, "no second (orphan) attempt after the deadline"

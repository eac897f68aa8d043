"""Cancel wins over a task in flight, whether the cancel comes through this runtime or through
another one on the same store (another server process, the CLI)."""

from __future__ import annotations

from dataclasses import replace

import anyio

from orchestration.core import StartRequest
from orchestration.core.clock import SystemClock
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.runtime import Runtime
from stores.memory import MemoryStore
from tests.unit.engine.test_deadlines import SlowWorker
from tests.unit.helpers import make_runtime


async def _cancel_while_calling(canceller: Runtime, runtime: Runtime, worker: SlowWorker) -> None:
    head, _ = await runtime.start(StartRequest("x", chain=("writer", "reviewer"), worker_backend="provider"))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.drive, head.run_id)
            while (await runtime.status(head.run_id)).status != RunStatus.RUNNING:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            started = anyio.current_time()
            await canceller.cancel(head.run_id, "stop")
        elapsed = anyio.current_time() - started
    final = await runtime.status(head.run_id)
    assert worker.cancelled == 1, "the call in flight was aborted"
    assert elapsed < 5
    assert final.status == RunStatus.CANCELLED
    assert [t.status for t in final.tasks] == [TaskStatus.CANCELLED, TaskStatus.CANCELLED]
    facts = await runtime.store.read_facts(head.run_id)
    assert facts[-1].type == "run_cancelled", "nothing was recorded after the cancel"


async def test_cancel_through_the_same_runtime() -> None:
    worker = SlowWorker()
    runtime = make_runtime(MemoryStore())
    runtime.clock, runtime.worker = SystemClock(), worker
    await _cancel_while_calling(runtime, runtime, worker)


async def test_cancel_through_another_runtime_on_the_same_store() -> None:
    worker = SlowWorker()
    store = MemoryStore()
    runtime = make_runtime(store)
    runtime.clock, runtime.worker = SystemClock(), worker
    runtime.settings = replace(runtime.settings, cancel_poll_seconds=0.05)
    other = make_runtime(store)
    other.clock = SystemClock()
    await _cancel_while_calling(other, runtime, worker)

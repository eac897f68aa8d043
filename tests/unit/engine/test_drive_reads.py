"""What a drive reads from the store per task boundary (issue 11): a recorded fact never changes,
so a drive does not read back an output it committed itself."""

from __future__ import annotations

from typing import Any

from orchestration.core.facts import Fact
from orchestration.core.inputs import StartRequest
from orchestration.core.models import RunHead, TypedError
from orchestration.core.vocabulary import RunStatus
from stores.memory import MemoryStore
from tests.unit.helpers import ScriptedWorker, make_runtime


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.fact_reads: list[int] = []
        self.loads = 0
        self.range_reads = 0

        self._inside = 0

    async def load(self, run_id: str) -> RunHead:
        # Only the runtime's reads count, not the ones the memory store makes for itself.
        self.loads += self._inside == 0
        return await super().load(run_id)

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        self.range_reads += self._inside == 0
        self._inside += 1
        try:
            return await super().read_facts(run_id, after_seq, limit)
        finally:
            self._inside -= 1

    async def append(self, *args: Any, **kwargs: Any) -> RunHead:
        self._inside += 1
        try:
            return await super().append(*args, **kwargs)
        finally:
            self._inside -= 1

    async def read_fact(self, run_id: str, seq: int) -> Fact:
        self.fact_reads.append(seq)
        self._inside += 1
        try:
            return await super().read_fact(run_id, seq)
        finally:
            self._inside -= 1


CHAIN = ("architect", "engineer", "reviewer", "tester", "writer")


async def test_a_drive_reads_no_output_it_committed_itself() -> None:
    store = CountingStore()
    runtime = make_runtime(store)
    head, _ = await runtime.start(StartRequest(request="x", chain=CHAIN, worker_backend="provider"))
    await runtime.drive(head.run_id)
    assert (await runtime.status(head.run_id)).status == RunStatus.COMPLETED
    # Every prompt needs the earlier outputs; the drive recorded all of them itself.
    assert store.fact_reads == []


async def test_a_drive_reads_the_run_once_and_decides_from_the_heads_it_wrote() -> None:
    store = CountingStore()
    runtime = make_runtime(store)
    head, _ = await runtime.start(StartRequest(request="x", chain=CHAIN, worker_backend="provider"))
    await runtime.drive(head.run_id)
    assert (await runtime.status(head.run_id)).status == RunStatus.COMPLETED
    # Ten successful compare-and-swaps (attempt_started + outcome per task) and run_finished:
    # the run is read once, at the start of the drive.
    # (the other two: the memory store's lease claim checks the run exists; the status above)
    assert store.loads == 3


async def test_after_a_failed_compare_and_swap_the_drive_reads_the_run_again() -> None:
    store = CountingStore()
    worker = ScriptedWorker()
    runtime = make_runtime(store, worker)
    head, _ = await runtime.start(StartRequest(request="x", chain=CHAIN[:2], worker_backend="provider"))
    run_id = head.run_id
    real_append = store.append
    raced = False

    async def append_after_a_cancel(*args: Any, **kwargs: Any) -> RunHead:
        # Just before the first outcome is recorded, another client cancels the run.
        nonlocal raced
        facts = args[2]
        if not raced and type(facts[0]).__name__ == "TaskCompleted":
            raced = True
            await runtime.cancel(run_id, "changed my mind")
        return await real_append(*args, **kwargs)

    store.append = append_after_a_cancel  # type: ignore[method-assign]
    await runtime.drive(run_id)
    final = await runtime.status(run_id)
    # The outcome's compare-and-swap failed; the drive read the run again and saw the cancel.
    assert final.status == RunStatus.CANCELLED
    assert worker.calls == {"architect": 1}


async def test_an_outcome_and_the_next_attempt_started_are_one_write() -> None:
    store = CountingStore()
    runtime = make_runtime(store)
    head, _ = await runtime.start(StartRequest(request="x", chain=CHAIN, worker_backend="provider"))
    await runtime.drive(head.run_id)
    final = await runtime.status(head.run_id)
    assert final.status == RunStatus.COMPLETED
    facts = await store.read_facts(head.run_id)
    # run_created, attempt_started + outcome per task, run_finished ...
    assert len(facts) == 1 + 2 * len(CHAIN) + 1
    # ... in created, the first attempt_started, four outcomes each with the next task's
    # attempt_started, the last outcome, run_finished.
    assert final.version == 1 + 1 + (len(CHAIN) - 1) + 1 + 1


async def test_a_retry_without_a_wait_is_started_in_the_failed_attempts_write() -> None:
    store = CountingStore()
    retryable = TypedError(code="provider_unavailable", message="down", retryable=True)
    worker = ScriptedWorker({"architect": [retryable, "ok"]})
    runtime = make_runtime(store, worker)
    head, _ = await runtime.start(StartRequest(request="x", chain=CHAIN[:1], worker_backend="provider"))
    await runtime.drive(head.run_id)
    final = await runtime.status(head.run_id)
    assert final.status == RunStatus.COMPLETED
    types = [type(f).__name__ for f in await store.read_facts(head.run_id)]
    assert types == [
        "RunCreated",
        "AttemptStarted",
        "AttemptFailed",
        "AttemptStarted",
        "TaskCompleted",
        "RunFinished",
    ]
    # created, started, (failed + started again), completed, finished
    assert final.version == 5
    assert worker.calls == {"architect": 2}


async def test_a_prompt_reads_the_outputs_it_lacks_in_one_read() -> None:
    store = CountingStore()
    runtime = make_runtime(store)
    head, _ = await runtime.start(StartRequest(request="x", chain=CHAIN, worker_backend="inline"))
    run_id = head.run_id
    await runtime.drive(run_id)
    for _ in CHAIN[:4]:
        snap = await runtime.snapshot(run_id)
        assert snap.host_task is not None
        store.fact_reads.clear()
        store.range_reads = 0
        await runtime.submit_host_output(run_id, snap.host_task.task_id, "out")
        await runtime.drive(run_id)
    # Each host output starts a new drive; the last one prepared the fifth task, whose prompt
    # needs the four earlier outputs: one read of the log, no read per output.
    assert store.fact_reads == []
    assert store.range_reads == 1
    snap = await runtime.snapshot(run_id)
    assert snap.host_task is not None and snap.host_task.task_id == CHAIN[4]
    assert snap.host_task.user.count("\nout") == 4

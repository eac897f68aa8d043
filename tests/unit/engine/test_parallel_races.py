"""Racing host answers on a parallel run, made to race deterministically: both callers read the
run at the same version before either writes (a store whose first two reads wait for each other).
For different tasks, the loser of the compare-and-swap re-reads and lands its answer too; for the
same task, exactly one answer lands (the same output again is answered with the run, a different
one is a conflict)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
import pytest

from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.facts import Fact, TaskCompleted
from orchestration.core.models import RunHead
from orchestration.engine.runtime import Runtime
from orchestration.errors import Conflict, VersionConflict
from orchestration.store import Lease
from stores.memory import MemoryStore
from tests.unit.helpers import ScriptedWorker, make_runtime
from tests.unit.parallel import RESEARCHERS


class ReadTogether(MemoryStore):
    """Once armed, the next two loads return only when both have read (the same version)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.waiting = 0
        self.both = anyio.Event()
        self.read_versions: list[int] = []
        self.conflicts = 0

    async def load(self, run_id: str) -> RunHead:
        head = await super().load(run_id)
        if self.armed and self.waiting < 2:
            self.waiting += 1
            self.read_versions.append(head.version)
            if self.waiting == 2:
                self.both.set()
            await self.both.wait()
        return head

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
        try:
            return await super().append(run_id, expected_version, facts, head, lease, flushing=flushing)
        except VersionConflict:
            self.conflicts += 1
            raise


async def started() -> tuple[ReadTogether, Runtime, str]:
    store = ReadTogether()
    runtime = make_runtime(store, ScriptedWorker(), ManualClock())
    head, _ = await runtime.start(StartRequest("Study it", chain="research"))
    await runtime.drive(head.run_id)
    store.armed = True
    return store, runtime, head.run_id


async def test_racing_answers_for_different_tasks_both_land() -> None:
    store, runtime, run_id = await started()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for task_id in RESEARCHERS[:2]:
                tg.start_soon(runtime.submit_host_output, run_id, task_id, f"found {task_id}")
    # Both read the same version; one write lost the compare-and-swap, re-read and landed.
    assert store.read_versions[0] == store.read_versions[1] and store.conflicts == 1
    facts = await store.read_facts(run_id)
    assert sorted(f.task_id for f in facts if isinstance(f, TaskCompleted)) == sorted(RESEARCHERS[:2])


@pytest.mark.parametrize("same_output", [True, False])
async def test_racing_answers_for_the_same_task_land_once(same_output: bool) -> None:
    store, runtime, run_id = await started()
    outputs = ["found it", "found it" if same_output else "found something else"]
    results: list[object] = []

    async def answer(text: str) -> None:
        try:
            results.append(await runtime.submit_host_output(run_id, RESEARCHERS[0], text))
        except Conflict as exc:
            results.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for text in outputs:
                tg.start_soon(answer, text)
    facts = await store.read_facts(run_id)
    completed = [f for f in facts if isinstance(f, TaskCompleted)]
    assert [f.task_id for f in completed] == [RESEARCHERS[0]]
    conflicts = [r for r in results if isinstance(r, Conflict)]
    assert len(conflicts) == (0 if same_output else 1)
    assert store.conflicts == 1

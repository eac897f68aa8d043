"""What a drive reads from the store per task boundary (issue 11): a recorded fact never changes,
so a drive does not read back an output it committed itself."""

from __future__ import annotations

from orchestration.facts import Fact
from orchestration.inputs import StartRequest
from orchestration.vocabulary import RunStatus
from stores.memory import MemoryStore
from tests.unit.helpers import make_runtime


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.fact_reads: list[int] = []

    async def read_fact(self, run_id: str, seq: int) -> Fact:
        self.fact_reads.append(seq)
        return await super().read_fact(run_id, seq)


CHAIN = ("architect", "engineer", "reviewer", "tester", "writer")


async def test_a_drive_reads_no_output_it_committed_itself() -> None:
    store = CountingStore()
    runtime = make_runtime(store)
    head, _ = await runtime.start(StartRequest(request="x", chain=CHAIN, worker_backend="provider"))
    await runtime.drive(head.run_id)
    assert (await runtime.status(head.run_id)).status == RunStatus.COMPLETED
    # Every prompt needs the earlier outputs; the drive recorded all of them itself.
    assert store.fact_reads == []

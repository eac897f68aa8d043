"""A run whose record cannot be read back: ``drive`` raises the ``CorruptRecord`` itself (not an
ExceptionGroup around it, which a dispatcher would log as a crash), releases the lease, and leaves
the run alone for ``unreadable_retry_seconds`` instead of failing again at every poll."""

from __future__ import annotations

import pytest

from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.facts import Fact
from orchestration.core.fold import apply_write
from orchestration.errors import CorruptRecord
from orchestration.workers.host import host_output_facts
from stores.memory import MemoryStore
from tests.unit.helpers import make_runtime


class DamagedFacts(MemoryStore):
    """A memory store whose facts cannot be read back while ``damaged`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.damaged = False

    async def read_fact(self, run_id: str, seq: int) -> Fact:
        if self.damaged:
            raise CorruptRecord(run_id, "facts.jsonl", "test damage")
        return await super().read_fact(run_id, seq)


async def test_an_unreadable_run_is_set_aside_then_retried() -> None:
    store, clock = DamagedFacts(), ManualClock()
    runtime = make_runtime(store, clock=clock)
    head, _ = await runtime.start(StartRequest("x", chain=("architect", "engineer")))
    # The architect's output recorded alone, as a server before issue 23 recorded it (since,
    # the next host task is prepared in the same write): the drive prepares the engineer's task,
    # reading the architect's output.
    head = await store.load(head.run_id)
    facts = host_output_facts(head, "architect", 1, "design", clock.now())
    await store.append(head.run_id, head.version, facts, apply_write(head, facts))
    store.damaged = True

    with pytest.raises(CorruptRecord):
        await runtime.drive(head.run_id)
    # The lease was released: another worker could claim the run at once.
    lease = await store.claim_lease(head.run_id, "other", 30, clock.now())
    assert lease is not None
    await store.release_lease(lease)

    # Still damaged, but not tried again (which would raise) until the retry time.
    clock.advance(runtime.unreadable_retry_seconds - 1)
    assert await runtime.drive(head.run_id) is None

    clock.advance(2)
    store.damaged = False
    action = await runtime.drive(head.run_id)
    assert action is not None and type(action).__name__ == "AwaitHost"

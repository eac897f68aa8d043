"""``ReadsLeases``: every adapter reads a run's lease as the last claim or renewal left it, expired
or not, and None once it is released or was never claimed; the read takes nothing (a claim by
another owner still works exactly as before it)."""

from __future__ import annotations

from datetime import timedelta

from orchestration.store import ReadsLeases, RunStore
from tests.stores.builders import BASE_TIME, new_run, run_id


async def test_a_lease_reads_back_as_claimed_renewed_expired_and_released(store: RunStore) -> None:
    assert isinstance(store, ReadsLeases)
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    assert await store.lease_of(head.run_id) is None  # never claimed
    assert await store.lease_of(run_id(2)) is None  # no such run

    lease = await store.claim_lease(head.run_id, "a", 30, BASE_TIME)
    assert lease is not None
    assert await store.lease_of(head.run_id) == lease
    renewed = await store.renew_lease(lease, 60, BASE_TIME + timedelta(seconds=10))
    read = await store.lease_of(head.run_id)
    assert read == renewed and read.expires_at == BASE_TIME + timedelta(seconds=70)

    # Expired, still stored: the read says so, and takes nothing (another owner claims it).
    later = BASE_TIME + timedelta(seconds=100)
    assert await store.lease_of(head.run_id) == renewed
    taken = await store.claim_lease(head.run_id, "b", 30, later)
    assert taken is not None and await store.lease_of(head.run_id) == taken

    await store.release_lease(taken)
    assert await store.lease_of(head.run_id) is None

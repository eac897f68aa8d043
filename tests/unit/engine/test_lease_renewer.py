"""Upkeep per server, not per run (issue 24): a runtime renews the leases of all its drives in one
store call per renewal interval (``LeaseRenewer``, ``RunStore.renew_leases``), and each drive still
learns of its own lease alone: one taken by another claim stops that drive (``LeaseLost``) and no
other, and a store outage is ridden out by every drive up to ``store_outage_seconds``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import anyio
import pytest

from orchestration.core.clock import SystemClock
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.runtime import Runtime
from orchestration.errors import LeaseLost, StoreUnavailable
from orchestration.store import Lease, RunStore
from stores.memory import MemoryStore
from stores.sqlite import SqliteStore
from tests.unit.engine.test_store_outage import make as make_runtime
from tests.unit.faulty import CountingWorker, FaultyStore, start_request

DRIVES = 5
#: a short lease, so that renewals come every 0.1 s
TTL = 0.3


class CountingRenewals(FaultyStore):
    """A store wrapper that keeps, for every renewal call, how many leases it renewed."""

    def __init__(self, inner: RunStore) -> None:
        super().__init__(inner)
        self.renewals: list[int] = []
        #: the last lease of each run a renewal was asked for
        self.renewed: dict[str, Lease] = {}

    async def renew_lease(self, lease: Lease, ttl_seconds: float, now: datetime) -> Lease:
        self.renewals.append(1)
        self.renewed[lease.run_id] = lease
        return await super().renew_lease(lease, ttl_seconds, now)

    async def renew_leases(
        self, leases: Sequence[Lease], ttl_seconds: float, now: datetime
    ) -> dict[str, Lease | None]:
        self._check("renew_leases")
        self.renewals.append(len(leases))
        self.renewed.update((lease.run_id, lease) for lease in leases)
        return await self.inner.renew_leases(leases, ttl_seconds, now)


def make(store: RunStore, worker: CountingWorker, outage_seconds: float = 30.0) -> Runtime:
    return make_runtime(store, worker, outage_seconds, lease_ttl_seconds=TTL)


async def start_all(runtime: Runtime) -> list[str]:
    return [(await runtime.start(start_request(f"r{n}")))[0].run_id for n in range(DRIVES)]


async def until(check: Callable[[], bool], what: str) -> None:
    """Wait (up to 20 s) until ``check()`` is true (``what``: what is waited for)."""
    with anyio.fail_after(20):
        while not check():  # noqa: ASYNC110 (polls counters, there is no event to wait on)
            await anyio.sleep(0.01)


async def test_one_call_per_interval_renews_the_leases_of_every_drive_in_flight(tmp_path: Path) -> None:
    sqlite = await SqliteStore.open(tmp_path / "runs.db")
    store, worker = CountingRenewals(sqlite), CountingWorker(delay=3600)
    runtime = make(store, worker)
    try:
        run_ids = await start_all(runtime)
        async with anyio.create_task_group() as tg:
            for run_id in run_ids:
                tg.start_soon(runtime.drive, run_id)
            await until(lambda: worker.in_flight == DRIVES, "every drive in its provider call")
            seen = len(store.renewals)
            await until(lambda: len(store.renewals) >= seen + 3, "three more renewals")
            # Each renewal renewed all five leases at once: one call, not one per drive.
            assert store.renewals[seen : seen + 3] == [DRIVES] * 3
            tg.cancel_scope.cancel()
    finally:
        await sqlite.close()


async def test_a_lease_taken_by_another_claim_stops_its_drive_alone() -> None:
    memory = MemoryStore()
    store, worker = CountingRenewals(memory), CountingWorker(delay=3600)
    runtime = make(store, worker)
    run_ids = await start_all(runtime)
    lost: list[str] = []

    async def drive(run_id: str) -> None:
        try:
            await runtime.drive(run_id)
        except LeaseLost:
            lost.append(run_id)

    async with anyio.create_task_group() as tg:
        for run_id in run_ids:
            tg.start_soon(drive, run_id)
        await until(lambda: worker.in_flight == DRIVES, "every drive in its provider call")
        await until(lambda: run_ids[0] in store.renewed, "run 0's lease renewed once")
        # Another worker takes run 0: its lease released under the drive (as if it had expired),
        # then claimed.
        assert await memory.claim_lease(run_ids[0], "elsewhere", 60, SystemClock().now()) is None
        await memory.release_lease(store.renewed[run_ids[0]])
        assert await memory.claim_lease(run_ids[0], "elsewhere", 60, SystemClock().now()) is not None
        await until(lambda: lost == [run_ids[0]], "the drive of run 0 stopped")
        seen = len(store.renewals)
        await until(lambda: len(store.renewals) >= seen + 2, "two more renewals")
        # The other four drives go on, renewed together.
        assert store.renewals[seen : seen + 2] == [DRIVES - 1] * 2
        assert worker.in_flight == DRIVES - 1
        tg.cancel_scope.cancel()


async def test_a_store_outage_past_the_limit_stops_every_drive_and_the_runs_resume() -> None:
    store, worker = FaultyStore(MemoryStore()), CountingWorker(delay=3600)
    runtime = make(store, worker, outage_seconds=0.5)
    run_ids = await start_all(runtime)
    stopped: list[str] = []

    async def drive(run_id: str) -> None:
        with pytest.raises(StoreUnavailable):
            await runtime.drive(run_id)
        stopped.append(run_id)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for run_id in run_ids:
                tg.start_soon(drive, run_id)
            await until(lambda: worker.in_flight == DRIVES, "every drive in its provider call")
            store.down = True
    assert sorted(stopped) == sorted(run_ids)
    store.down = False
    for run_id in run_ids:
        assert (await store.load(run_id)).status == RunStatus.RUNNING


async def test_drives_have_no_renewal_task_of_their_own_and_the_first_to_end_leaves_the_rest_kept() -> None:
    memory = MemoryStore()
    store, worker = CountingRenewals(memory), CountingWorker(delay=3600)
    runtime = make(store, worker)
    run_ids = await start_all(runtime)
    base = len(asyncio.all_tasks())
    scopes = {run_id: anyio.CancelScope() for run_id in run_ids}

    async def drive(run_id: str) -> None:
        with scopes[run_id]:
            await runtime.drive(run_id)

    async with anyio.create_task_group() as tg:
        for run_id in run_ids:
            tg.start_soon(drive, run_id)
        await until(lambda: worker.in_flight == DRIVES, "every drive in its provider call")
        # One task per drive, and the renewer's two (its renewals, the watch of calls in flight)
        # whatever the number of drives.
        assert len(asyncio.all_tasks()) - base == DRIVES + 2
        # The first drive, whose start started the renewer, ends: the others are still renewed.
        scopes[run_ids[0]].cancel()
        await until(lambda: worker.in_flight == DRIVES - 1, "the first drive stopped")
        seen = len(store.renewals)
        await until(lambda: len(store.renewals) >= seen + 2, "two more renewals")
        assert store.renewals[seen : seen + 2] == [DRIVES - 1] * 2
        tg.cancel_scope.cancel()
    await anyio.sleep(0.05)
    assert len(asyncio.all_tasks()) == base  # no drive left: the renewer's task is gone too

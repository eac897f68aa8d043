"""The dispatcher in process: several dispatchers (each with its own store connection, as separate
processes would have) share runs through batch claims without executing any task twice; scans that
fail back off and recover; a store notification wakes the dispatcher long before its poll; a drive
stopped by an outage has its lease released once the store is back, so the run resumes at once."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core.clock import SystemClock
from orchestration.core.facts import AttemptStarted, Fact
from orchestration.core.models import RunHead
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.backoff import Backoff
from orchestration.engine.dispatcher import Dispatcher
from orchestration.engine.runtime import Runtime
from orchestration.store import CreateResult, CreatesClaimed, Lease, RunStore
from stores import migrate
from stores.memory import MemoryStore
from stores.postgres import PostgresStore
from stores.sqlite import SqliteStore
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url
from tests.unit.faulty import CountingWorker, FaultyStore, provider_contract, start_request
from tests.unit.helpers import sequential_ids

TASKS = ("architect", "engineer", "reviewer")


def runtime_on(store: RunStore, worker: CountingWorker, owner: str, **kwargs: Any) -> Runtime:
    ids = sequential_ids()
    return Runtime(
        store,
        Catalog.builtin(),
        clock=SystemClock(),
        # Ids unique across the runtimes that share a store.
        new_id=lambda: ids().replace("test", owner),
        resolve_contract=provider_contract,
        worker=worker,
        settings=RuntimeSettings(
            owner=owner,
            lease_ttl_seconds=kwargs.pop("lease_ttl_seconds", 5),
            cancel_poll_seconds=0.05,
            **kwargs,
        ),
    )


@asynccontextmanager
async def dispatching(*dispatchers: Dispatcher) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        for dispatcher in dispatchers:
            await tg.start(dispatcher.run)
        try:
            yield
        finally:
            for dispatcher in dispatchers:
                dispatcher.stop()


async def wait_until(predicate: Callable[[], Any], within: float, step: float = 0.02) -> None:
    with anyio.fail_after(within):
        # Polling: the state lives in a store or a counter, neither of which has an event.
        while not await predicate():  # noqa: ASYNC110
            await anyio.sleep(step)


async def all_completed(store: RunStore, run_ids: list[str]) -> bool:
    for run_id in run_ids:
        if (await store.load(run_id)).status != RunStatus.COMPLETED:
            return False
    return True


# ------------------------------------------------------------------------------ scale-out


@asynccontextmanager
async def shared_stores(backend: str, tmp_path: Path, count: int) -> AsyncIterator[list[RunStore]]:
    """``count`` store instances on one database, as ``count`` server processes would open it."""
    async with AsyncExitStack() as stack:
        opened: list[RunStore] = []
        if backend == "sqlite":
            for _ in range(count):
                opened.append(await SqliteStore.open(tmp_path / "shared.db"))
                stack.push_async_callback(opened[-1].close)
        else:
            dsn = await postgres_dsn()
            schema = await stack.enter_async_context(postgres_schema(dsn))
            await migrate(schema_url(dsn, schema), home=tmp_path)
            for _ in range(count):
                opened.append(await PostgresStore.open(dsn, schema=schema))
                stack.push_async_callback(opened[-1].close)
        yield opened


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_dispatchers_on_one_database_share_runs_and_run_each_task_once(
    backend: str, tmp_path: Path
) -> None:
    async with shared_stores(backend, tmp_path, 3) as stores:
        workers = [CountingWorker(delay=0.01) for _ in stores]
        runtimes = [runtime_on(s, w, f"w{n}") for n, (s, w) in enumerate(zip(stores, workers, strict=True))]
        dispatchers = [Dispatcher(r, concurrency=4, poll_seconds=0.05) for r in runtimes]
        run_ids = []
        async with dispatching(*dispatchers):
            for n in range(30):
                head, _ = await runtimes[n % 3].start(start_request(f"r{n}"))
                run_ids.append(head.run_id)
            await wait_until(lambda: all_completed(stores[0], run_ids), within=60)
        for run_id in run_ids:
            facts = await stores[0].read_facts(run_id)
            assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
            assert not any(isinstance(f, AttemptStarted) and f.possible_duplicate_call for f in facts)
    calls = sum((w.calls for w in workers), start=type(workers[0].calls)())
    assert calls == {(f"r{n}", t): 1 for n in range(30) for t in TASKS}
    # Every dispatcher took part.
    assert all(sum(w.calls.values()) > 0 for w in workers), [sum(w.calls.values()) for w in workers]


async def test_a_claimed_run_is_driven_with_its_claim(tmp_path: Path) -> None:
    """The batch claim is the lease the drive uses: no second claim per run."""
    store = FaultyStore(await SqliteStore.open(tmp_path / "one.db"))
    try:
        runtime = runtime_on(store, CountingWorker(), "w")
        dispatcher = Dispatcher(runtime, poll_seconds=0.05)
        async with dispatching(dispatcher):
            head, _ = await runtime.start(start_request("r1"))
            await wait_until(lambda: all_completed(store, [head.run_id]), within=10)
        assert store.calls["claim_runnable"] >= 1
        # One claim_lease at most: the pass after the drive, if something woke the run meanwhile.
        assert store.calls["claim_lease"] <= 1
    finally:
        await store.close()


async def test_a_freed_slot_claims_only_after_a_claim_that_filled_every_slot(tmp_path: Path) -> None:
    """A drive's end frees a slot; it claims at once only when the last claim got as many runs as
    it asked for (more may be waiting), not after one that found all there was (a poll, a new run
    or a notification wakes the dispatcher for new work)."""
    store = FaultyStore(await SqliteStore.open(tmp_path / "one.db"))
    try:
        runtime = runtime_on(store, CountingWorker(), "w")
        # Polls far apart: every claim in the test is one a wake-up asked for.
        dispatcher = Dispatcher(runtime, concurrency=2, poll_seconds=3600)
        async with dispatching(dispatcher):
            await wait_until(lambda: _claims(store, 1), within=5)  # the first pass
            head, _ = await runtime.start(start_request("one"))
            await wait_until(lambda: all_completed(store, [head.run_id]), within=10)
            await anyio.sleep(0.2)
            # The start's own wake-up claimed it (1 of 2 slots asked for): its drive's end
            # claims nothing more.
            assert store.calls["claim_runnable"] == 2
            # Three runs for two slots, made runnable while the dispatcher is busy: the claim
            # fills both slots, so each freed slot claims again, and the third run is driven.
            heads = [(await runtime.start(start_request(f"n{n}")))[0] for n in range(3)]
            await wait_until(lambda: all_completed(store, [h.run_id for h in heads]), within=10)
        assert store.calls["claim_runnable"] >= 4
    finally:
        await store.close()


async def _claims(store: FaultyStore, count: int) -> bool:
    return store.calls["claim_runnable"] >= count


class ClaimingSqlite(SqliteStore):
    """SQLite with a claimed create (as Postgres has: ``CreatesClaimed``, here two steps, which is
    enough in one process) and a batch claim that can be held in flight (:attr:`hold`)."""

    hold: anyio.Event | None = None
    holding: anyio.Event | None = None
    #: the leases the held claim got
    claimed: list[Lease] | None = None
    claims = 0

    async def create_claimed(
        self, head: RunHead, facts: Sequence[Fact], owner: str, ttl_seconds: float, now: datetime
    ) -> tuple[CreateResult, Lease | None]:
        result = await self.create(head, facts)
        lease = await self.claim_lease(head.run_id, owner, ttl_seconds, now) if result.created else None
        return result, lease

    async def claim_runnable(
        self, owner: str, ttl_seconds: float, now: datetime, limit: int = 10
    ) -> list[Lease]:
        self.claims += 1
        if self.hold is None or self.holding is None:
            return await super().claim_runnable(owner, ttl_seconds, now, limit)
        self.holding.set()
        await self.hold.wait()
        self.claimed = await super().claim_runnable(owner, ttl_seconds, now, limit)
        return self.claimed


async def test_a_claims_run_whose_slot_a_claimed_create_took_meanwhile_is_given_back_not_left_waiting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run created claimed while a batch claim is in flight may take the slot the claim asked
    for. The claim's lease on its run is then given back, and the run claimed again once a slot is
    free: it never waits for a slot with a lease nobody renews (it would expire, and another
    server take the run over mid-call: issue 24, tasks called twice in bench/scale.py's table
    scenario)."""
    store = await ClaimingSqlite.open(tmp_path / "one.db")
    try:
        assert isinstance(store, ClaimingSqlite) and isinstance(store, CreatesClaimed)
        worker = CountingWorker(delay=0.2)
        runtime = runtime_on(store, worker, "w")
        dispatcher = Dispatcher(runtime, concurrency=1, poll_seconds=3600)
        most = 0
        async with dispatching(dispatcher):
            await wait_until(lambda: _claimed_once(store), within=5)  # the first pass, before any run
            # A run made runnable by somebody else (no dispatcher of its own).
            other = runtime_on(store, worker, "x")
            waiting, _ = await other.start(start_request("waiting"))
            store.hold, store.holding = anyio.Event(), anyio.Event()
            dispatcher.wake()
            with anyio.fail_after(5):
                await store.holding.wait()
            # The claim (one slot) is in flight; the run started now is driven here at once.
            assert dispatcher.has_room()
            started, _ = await runtime.start(start_request("started"))
            assert dispatcher.active == {started.run_id}
            store.hold.set()
            with anyio.fail_after(5):
                while store.claimed is None:  # noqa: ASYNC110 (the claim's answer)
                    await anyio.sleep(0.001)
            store.hold = None
            assert [lease.run_id for lease in store.claimed] == [waiting.run_id]
            # Its lease given back, not waiting for the slot "started" holds (0.6 s of calls).
            await anyio.sleep(0.1)
            assert dispatcher.active == {started.run_id}
            assert (await store.load(waiting.run_id)).status == RunStatus.QUEUED

            async def done() -> bool:
                nonlocal most
                most = max(most, len(dispatcher.active))
                return await all_completed(store, [waiting.run_id, started.run_id])

            await wait_until(done, within=15, step=0.005)
        assert most == 1
        # The claimed run never found its slot taken (the dispatcher's backstop gives such a lease back).
        assert not [r for r in caplog.records if getattr(r, "action", None) == "claim_without_slot"]
        assert worker.calls == {(name, t): 1 for name in ("waiting", "started") for t in TASKS}
        for run_id in (waiting.run_id, started.run_id):
            facts = await store.read_facts(run_id)
            assert not any(isinstance(f, AttemptStarted) and f.possible_duplicate_call for f in facts)
    finally:
        await store.close()


async def _claimed_once(store: ClaimingSqlite) -> bool:
    return store.claims >= 1


# ------------------------------------------------------------------------------ store faults


async def test_failed_scans_back_off_and_the_dispatcher_recovers() -> None:
    store = FaultyStore(MemoryStore())
    runtime = runtime_on(store, CountingWorker(), "w")
    head, _ = await runtime.start(start_request("r1"))
    store.down = True
    delays: list[float] = []
    backoff = Backoff(base=0.05, cap=0.4, rng=random.Random(7))
    next_delay = backoff.next_delay

    def recording() -> float:
        delays.append(next_delay())
        return delays[-1]

    backoff.next_delay = recording  # type: ignore[method-assign]
    # A poll far longer than the test: only the backoff can bring the dispatcher back.
    dispatcher = Dispatcher(runtime, poll_seconds=60, backoff=backoff)
    async with dispatching(dispatcher):
        await anyio.sleep(1.0)
        assert not dispatcher.store_healthy
        failed_scans = store.calls["runnable"]
        store.down = False
        await wait_until(lambda: all_completed(store.inner, [head.run_id]), within=5)
        assert dispatcher.store_healthy
    # Exponential, capped, jittered: a handful of scans in a second, not a busy loop.
    assert 3 <= failed_scans <= 12, failed_scans
    assert delays[:3] == sorted(delays[:3]) and max(delays) <= 0.4
    assert len(set(delays)) == len(delays), "jittered"


async def test_a_drive_stopped_by_an_outage_resumes_when_the_store_is_back() -> None:
    store = FaultyStore(MemoryStore())
    worker = CountingWorker(delay=10)
    # A long lease: without the dispatcher releasing it, the run would wait 60 s for its expiry.
    runtime = runtime_on(store, worker, "w", store_outage_seconds=0.3, lease_ttl_seconds=60)
    dispatcher = Dispatcher(runtime, poll_seconds=0.1, backoff=Backoff(base=0.05, cap=0.2))
    async with dispatching(dispatcher):
        head, _ = await runtime.start(start_request("r1"))
        await wait_until(lambda: _true(worker.in_flight > 0), within=5)
        store.down = True
        await wait_until(lambda: _true(sum(worker.cancelled.values()) == 1), within=5)
        worker.delay = 0
        store.down = False
        await wait_until(lambda: all_completed(store.inner, [head.run_id]), within=5)
    facts = await store.inner.read_facts(head.run_id)
    marked = [
        (f.task_id, f.attempt) for f in facts if isinstance(f, AttemptStarted) and f.possible_duplicate_call
    ]
    assert marked == [("architect", 2)]


async def _true(value: bool) -> bool:
    return value


# ------------------------------------------------------------------------------ notifications


class NotifyingStore(MemoryStore):
    """A memory store with the ``listen`` capability, fired by the test."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners: dict[Callable[[str], None], Callable[[], None] | None] = {}
        self.listen_calls = 0

    async def listen(
        self, callback: Callable[[str], None], on_lost: Callable[[], None] | None = None
    ) -> None:
        self.listen_calls += 1
        self.listeners[callback] = on_lost

    async def unlisten(self, callback: Callable[[str], None]) -> None:
        self.listeners.pop(callback, None)

    def notify(self, run_id: str) -> None:
        for callback in list(self.listeners):
            callback(run_id)

    def lose(self) -> None:
        for on_lost in list(self.listeners.values()):
            if on_lost is not None:
                on_lost()


async def test_a_notification_wakes_the_dispatcher_long_before_its_poll() -> None:
    store = NotifyingStore()
    runtime = runtime_on(store, CountingWorker(), "w")
    # Another process: it writes to the same store, but this dispatcher hears only the store.
    elsewhere = runtime_on(store, CountingWorker(), "elsewhere")
    dispatcher = Dispatcher(runtime, poll_seconds=60)
    async with dispatching(dispatcher):
        assert len(store.listeners) == 1
        head, _ = await elsewhere.start(start_request("r1"))
        await anyio.sleep(0.2)
        assert (await store.load(head.run_id)).status == RunStatus.QUEUED, "not woken without a notification"
        started = anyio.current_time()
        store.notify(head.run_id)
        await wait_until(lambda: all_completed(store, [head.run_id]), within=5)
        assert anyio.current_time() - started < 2

        # A dropped notification connection makes the dispatcher listen again at once.
        calls = store.listen_calls
        store.lose()
        await wait_until(lambda: _true(store.listen_calls > calls), within=2)
    assert store.listeners == {}, "unsubscribed when stopped"

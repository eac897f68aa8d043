"""The postgres adapter's notification connection under faults: ``listen`` is idempotent per
callback, a dropped connection is reported through ``on_lost``, and listening again reconnects so
that wake-ups resume (the dispatcher relies on all three after a PostgreSQL restart). A claimed
create is leased to its creator and heard by nobody; a runtime creates so while its dispatcher has
a free slot, and that dispatcher drives the run with no claim."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import anyio
import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core.inputs import StartRequest
from orchestration.core.models import ExecutionContract, RunHead, Telemetry
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.dispatcher import Dispatcher
from orchestration.engine.runtime import Runtime
from orchestration.store import Lease
from stores import migrate, parse_store_spec
from stores.postgres import PostgresStore
from tests.stores.builders import BASE_TIME, new_run, run_id, start_attempt
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url

pytestmark = pytest.mark.postgres


class Heard:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lost = 0
        self.event = anyio.Event()

    def __call__(self, run_id: str) -> None:
        self.ids.append(run_id)
        self.event.set()

    def on_lost(self) -> None:
        self.lost += 1
        self.event.set()

    async def wait(self) -> None:
        with anyio.fail_after(5):
            await self.event.wait()
        self.event = anyio.Event()


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[PostgresStore, PostgresStore, str]]:
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        await migrate(schema_url(dsn, schema), home=tmp_path)
        plain = parse_store_spec(dsn, home=tmp_path).dsn or dsn
        listener = await PostgresStore.open(plain, schema=schema)
        writer = await PostgresStore.open(plain, schema=schema)
        try:
            yield listener, writer, plain
        finally:
            await listener.close()
            await writer.close()


async def _terminate_listener(dsn: str, store: PostgresStore) -> None:
    """Kill the backend of the store's LISTEN session (only this test's channel), as a server
    restart would."""
    conn = await asyncpg.connect(dsn)
    try:
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE query = 'LISTEN \"' || $1 || '\"' AND pid <> pg_backend_pid()",
            store.channel,
        )
        assert killed >= 1
    finally:
        await conn.close()


async def test_listen_twice_with_one_callback_calls_it_once(
    stores: tuple[PostgresStore, PostgresStore, str],
) -> None:
    listener, writer, _ = stores
    heard = Heard()
    await listener.listen(heard, heard.on_lost)
    await listener.listen(heard, heard.on_lost)
    await writer.create(*new_run(run_id(1)))
    await heard.wait()
    await anyio.sleep(0.2)
    assert heard.ids == [run_id(1)]


async def test_a_dropped_connection_is_reported_and_listening_again_reconnects(
    stores: tuple[PostgresStore, PostgresStore, str],
) -> None:
    listener, writer, dsn = stores
    heard = Heard()
    await listener.listen(heard, heard.on_lost)
    assert listener.listening

    await _terminate_listener(dsn, listener)
    await heard.wait()
    assert heard.lost == 1 and not listener.listening
    # Nothing is heard while the connection is down (a hint, not a queue).
    await writer.create(*new_run(run_id(1)))
    await anyio.sleep(0.3)
    assert heard.ids == []

    await listener.listen(heard, heard.on_lost)
    assert listener.listening
    await writer.create(*new_run(run_id(2)))
    await heard.wait()
    assert heard.ids == [run_id(2)]


async def test_closing_the_store_is_not_reported_as_a_lost_connection(
    stores: tuple[PostgresStore, PostgresStore, str],
) -> None:
    listener, _, _ = stores
    heard = Heard()
    await listener.listen(heard, heard.on_lost)
    await listener.unlisten(heard)
    await listener.listen(heard, heard.on_lost)
    await listener.close()
    await anyio.sleep(0.1)
    assert heard.lost == 0


async def test_a_claimed_create_is_leased_to_its_creator_and_heard_by_no_listener(
    stores: tuple[PostgresStore, PostgresStore, str],
) -> None:
    listener, writer, _ = stores
    heard = Heard()
    await listener.listen(heard, heard.on_lost)
    head, facts = new_run(run_id(1))
    result, lease = await writer.create_claimed(head, facts, "creator", 30, BASE_TIME)
    assert result.created and lease is not None and lease.owner == "creator"
    assert lease.expires_at == BASE_TIME + timedelta(seconds=30)
    await writer.create(*new_run(run_id(2)))
    await heard.wait()
    await anyio.sleep(0.2)
    assert heard.ids == [run_id(2)]
    # The lease is live: nobody else claims the run, the creator's fenced writes go through.
    claimed = await writer.claim_runnable("other", 30, BASE_TIME, 10)
    assert [c.run_id for c in claimed] == [run_id(2)]
    assert await writer.claim_lease(run_id(1), "other", 30, BASE_TIME) is None
    renewed = await writer.renew_lease(lease, 30, BASE_TIME)
    write = start_attempt(head)
    await writer.append(run_id(1), write.expected_version, write.facts, write.head, renewed)
    # Once it expires, anyone may claim it, as any lease (run 2's has expired too).
    later = BASE_TIME + timedelta(seconds=31)
    again = await writer.claim_runnable("another", 30, later, 10)
    assert [c.run_id for c in again] == [run_id(1), run_id(2)]


async def test_a_claimed_create_whose_key_is_taken_gets_no_lease(
    stores: tuple[PostgresStore, PostgresStore, str],
) -> None:
    _, writer, _ = stores
    first = new_run(run_id(1), key="k")
    assert (await writer.create(*first)).created
    result, lease = await writer.create_claimed(*new_run(run_id(2), key="k"), "me", 30, BASE_TIME)
    assert not result.created and result.head.run_id == run_id(1) and lease is None
    assert [c.run_id for c in await writer.claim_runnable("other", 30, BASE_TIME, 10)] == [run_id(1)]


class HeldWorker:
    """A provider worker whose calls wait until :attr:`release` is set; counts the calls."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.calls = 0

    async def execute(self, *_: object) -> AttemptOutcome:
        self.calls += 1
        await self.release.wait()
        return AttemptSucceeded("done", Telemetry())


async def test_a_runtime_creates_claimed_runs_only_while_its_dispatcher_has_a_free_slot(
    stores: tuple[PostgresStore, PostgresStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    listener, writer, _ = stores
    heard = Heard()
    await listener.listen(heard, heard.on_lost)
    claims: list[int] = []
    claim = writer.claim_runnable

    async def counted(owner: str, ttl: float, now: datetime, limit: int = 10) -> list[Lease]:
        leases = await claim(owner, ttl, now, limit)
        claims.append(len(leases))
        return leases

    monkeypatch.setattr(writer, "claim_runnable", counted)
    loads: list[str] = []
    load = writer.load

    async def counted_load(run_id: str) -> RunHead:
        loads.append(run_id)
        return await load(run_id)

    monkeypatch.setattr(writer, "load", counted_load)
    worker = HeldWorker()
    runtime = Runtime(
        writer,
        Catalog.builtin(),
        resolve_contract=lambda _r, _c: ExecutionContract(worker_backend="provider", provider="p", model="m"),
        worker=worker,
        settings=RuntimeSettings(owner="here"),
    )
    dispatcher = Dispatcher(runtime, concurrency=1, poll_seconds=30)
    request = StartRequest(request="build", chain=("architect",), worker_backend="provider")
    async with anyio.create_task_group() as tg:
        await tg.start(dispatcher.run)
        with anyio.fail_after(5):
            while not claims:  # noqa: ASYNC110 (the dispatcher's first pass)
                await anyio.sleep(0.01)
        first, _ = await runtime.start(request)
        with anyio.fail_after(5):
            while worker.calls < 1:  # noqa: ASYNC110 (driven at once, with the lease it was created with)
                await anyio.sleep(0.01)
        assert claims == [0], "no claim was sent for the run created here"
        assert first.run_id not in loads, "its drive started from the head it was created with"
        assert first.run_id in dispatcher.active
        # The only slot is taken: the next run is announced, for the other servers to claim.
        second, _ = await runtime.start(request)
        await heard.wait()
        assert heard.ids == [second.run_id] and first.run_id not in heard.ids
        worker.release.set()
        with anyio.fail_after(10):
            while (await runtime.status(second.run_id)).status != RunStatus.COMPLETED:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        dispatcher.stop()
    assert (await runtime.status(first.run_id)).status == RunStatus.COMPLETED

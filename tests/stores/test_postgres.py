"""What is specific to the postgres adapter: ``claim_runnable`` with ``SKIP LOCKED`` across pools,
the lease fence checked under a lock on the lease row, LISTEN/NOTIFY wake-ups from another
connection, schema isolation, error translation."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import anyio.lowlevel
import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.core.models import RECORD_FORMAT
from orchestration.core.vocabulary import RunStatus
from orchestration.errors import LeaseLost, StoreUnavailable
from stores import migrate
from stores.postgres import CHANNEL, PostgresStore, channel_for
from tests.stores.builders import (
    BASE_TIME,
    cancel,
    complete_task,
    fail_attempt,
    new_run,
    run_id,
    start_attempt,
)
from tests.stores.sql_adapters import (
    PostgresDatabase,
    migrated_postgres,
    postgres_schema,
    schema_url,
)

pytestmark = pytest.mark.postgres


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[PostgresDatabase]:
    async with migrated_postgres(tmp_path) as database:
        yield database


@pytest.fixture
async def store(db: PostgresDatabase) -> AsyncIterator[PostgresStore]:
    opened = await db.open()
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def other(db: PostgresDatabase) -> AsyncIterator[PostgresStore]:
    """A second store with its own pool: another server process, as far as the database can tell."""
    opened = await db.open()
    try:
        yield opened
    finally:
        await opened.close()


async def _create_runs(store: PostgresStore, count: int) -> list[str]:
    ids = []
    for n in range(1, count + 1):
        head, facts = new_run(run_id(n), at=BASE_TIME + timedelta(seconds=n))
        await store.create(head, facts)
        ids.append(run_id(n))
    return ids


# ------------------------------------------------------------------------------ claim_runnable


async def test_claim_runnable_claims_due_runs_oldest_first(store: PostgresStore) -> None:
    await _create_runs(store, 4)
    head = await store.load(run_id(2))
    later = fail_attempt(head, not_before=BASE_TIME + timedelta(hours=1))
    await store.append(run_id(2), later.expected_version, later.facts, later.head)
    assert await store.claim_lease(run_id(3), "other", 60, BASE_TIME) is not None

    leases = await store.claim_runnable("me", 30, BASE_TIME, limit=10)
    assert [lease.run_id for lease in leases] == [run_id(1), run_id(4)]
    assert all(
        lease.owner == "me" and lease.expires_at == BASE_TIME + timedelta(seconds=30) for lease in leases
    )
    assert await store.claim_runnable("me", 30, BASE_TIME, limit=10) == []
    # Two hours on, every lease has expired and run 2 is due.
    taken = await store.claim_runnable("you", 30, BASE_TIME + timedelta(hours=2), limit=2)
    assert [lease.run_id for lease in taken] == [run_id(1), run_id(2)]


async def test_claim_runnable_skips_a_run_locked_by_another_transaction(
    store: PostgresStore, db: PostgresDatabase
) -> None:
    await _create_runs(store, 2)
    conn = await asyncpg.connect(db.dsn, server_settings={"search_path": db.schema})
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE", run_id(1))
            # Blocking here (instead of skipping) would hang until the transaction ends.
            with anyio.fail_after(5):
                leases = await store.claim_runnable("me", 30, BASE_TIME, limit=10)
            assert [lease.run_id for lease in leases] == [run_id(2)]
    finally:
        await conn.close()
    assert [lease.run_id for lease in await store.claim_runnable("me", 30, BASE_TIME, limit=10)] == [
        run_id(1)
    ]


# ------------------------------------------------------------------------------ the lease fence


async def _blocked_on_a_lock(db: PostgresDatabase, fragment: str) -> None:
    """Wait until a session of this database waits for a lock in a statement containing ``fragment``."""
    conn = await asyncpg.connect(db.dsn)
    try:
        with anyio.fail_after(10):
            # Another session's lock wait: nothing signals it but pg_stat_activity.
            while not await conn.fetchval(  # noqa: ASYNC110
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND strpos(query, $1) > 0",
                fragment,
            ):
                await anyio.sleep(0.01)
    finally:
        await conn.close()


async def test_a_claim_in_progress_makes_a_fenced_append_wait_and_then_refuses_it(
    store: PostgresStore, db: PostgresDatabase
) -> None:
    """The fence is the token on the run row, which a claim writes: an append whose token a
    concurrent claim is replacing waits for that claim's lock on the run row and is then refused (a
    check against its snapshot alone would let it through while the claim commits)."""
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    stale = await store.claim_lease(run_id(1), "worker-a", 10, BASE_TIME)
    assert stale is not None
    claimer = await asyncpg.connect(db.dsn, server_settings={"search_path": db.schema})
    try:
        claim = claimer.transaction()
        await claim.start()
        # What claim_lease writes, in its order: the run row, then the lease row.
        await claimer.execute("UPDATE runs SET lease_token = 'claimed-by-b' WHERE run_id = $1", run_id(1))
        await claimer.execute(
            "UPDATE leases SET owner = 'worker-b', token = 'claimed-by-b' WHERE run_id = $1", run_id(1)
        )
        write = start_attempt(head)
        outcome: list[BaseException | None] = []

        async def append() -> None:
            try:
                await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=stale)
                outcome.append(None)
            except LeaseLost as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            # The append's text as the server shows it starts with its comment (and is cut at
            # track_activity_query_size).
            await _blocked_on_a_lock(db, "An append in one statement")
            assert outcome == []
            await claim.commit()
        assert len(outcome) == 1 and isinstance(outcome[0], LeaseLost)
    finally:
        await claimer.close()
    assert await store.load(run_id(1)) == head


async def test_concurrent_claimers_never_get_the_same_run(store: PostgresStore, other: PostgresStore) -> None:
    expected = await _create_runs(store, 30)
    claimed: dict[str, list[str]] = {"a": [], "b": [], "c": [], "d": []}

    async def claimer(s: PostgresStore, owner: str) -> None:
        while True:
            leases = await s.claim_runnable(owner, 60, BASE_TIME, limit=2)
            if not leases:
                return
            claimed[owner].extend(lease.run_id for lease in leases)

    async with anyio.create_task_group() as tg:
        for owner, s in zip(claimed, (store, other, store, other), strict=True):
            tg.start_soon(claimer, s, owner)
    every = [rid for ids in claimed.values() for rid in ids]
    assert sorted(every) == expected  # each run exactly once
    assert sum(1 for ids in claimed.values() if ids) >= 2  # the work was actually shared


async def test_claim_runnable_and_claim_lease_race_for_one_run(
    store: PostgresStore, other: PostgresStore
) -> None:
    for round_ in range(10):
        rid = run_id(100 + round_)
        await store.create(*new_run(rid))
        winners: list[str] = []

        async def batch(winners: list[str] = winners) -> None:
            if await store.claim_runnable("batch", 60, BASE_TIME, limit=5):
                winners.append("batch")

        async def single(rid: str = rid, winners: list[str] = winners) -> None:
            if await other.claim_lease(rid, "single", 60, BASE_TIME) is not None:
                winners.append("single")

        async with anyio.create_task_group() as tg:
            tg.start_soon(batch)
            tg.start_soon(single)
        assert len(winners) == 1, winners
        lease = await store.claim_lease(rid, winners[0], 60, BASE_TIME)
        assert lease is not None
        await store.release_lease(lease)
        # finish the run so the next round's batch claim sees only the new one
        head = await store.load(rid)
        from tests.stores.builders import cancel

        w = cancel(head)
        await store.append(rid, w.expected_version, w.facts, w.head)


# ------------------------------------------------------------------------------- LISTEN/NOTIFY


class Heard:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self._event = anyio.Event()

    def __call__(self, run_id: str) -> None:
        self.ids.append(run_id)
        self._event.set()

    async def next(self) -> str:
        with anyio.fail_after(5):
            while not self.ids:
                await self._event.wait()
                self._event = anyio.Event()
        return self.ids.pop(0)

    async def nothing_for(self, seconds: float) -> bool:
        await anyio.sleep(seconds)
        return not self.ids


async def test_a_listener_is_woken_by_a_write_from_another_connection(
    store: PostgresStore, other: PostgresStore
) -> None:
    heard = Heard()
    await store.listen(heard)
    head, facts = new_run(run_id(1))
    await other.create(head, facts)
    assert await heard.next() == run_id(1)

    # A drive's write (fenced by its lease) wakes nobody, whatever it leaves the run in: nobody
    # else may take the run while the lease holds. Releasing the lease on a run left runnable does.
    lease = await other.claim_lease(run_id(1), "driver", 30, BASE_TIME)
    assert lease is not None
    started = start_attempt(head)
    running = await other.append(
        run_id(1), started.expected_version, started.facts, started.head, lease=lease
    )
    assert running.status == RunStatus.RUNNING
    done = complete_task(running)
    queued = await other.append(run_id(1), done.expected_version, done.facts, done.head, lease=lease)
    assert queued.status == RunStatus.QUEUED
    assert await heard.nothing_for(0.3)
    await other.release_lease(lease)
    assert await heard.next() == run_id(1)
    # A write without a lease (an external event: a cancel) wakes the listeners whatever it leaves
    # the run in: the drive of the run, on whichever server, must hear of it (issue 24).
    stopped = cancel(queued)
    await other.append(run_id(1), stopped.expected_version, stopped.facts, stopped.head)
    assert await heard.next() == run_id(1)


async def test_releasing_a_lease_wakes_listeners_only_when_it_leaves_the_run_due(
    store: PostgresStore, other: PostgresStore
) -> None:
    heard = Heard()
    head, facts = new_run(run_id(1))
    await other.create(head, facts)
    await store.listen(heard)
    lease = await other.claim_lease(run_id(1), "driver", 30, BASE_TIME)
    assert lease is not None
    # Retried later: queued until a time still to come (the database's clock judges it).
    later = datetime.now(UTC) + timedelta(hours=1)
    waiting = fail_attempt(head, not_before=later)
    await other.append(run_id(1), waiting.expected_version, waiting.facts, waiting.head, lease=lease)
    await other.release_lease(lease)
    assert await heard.nothing_for(0.3)
    # A lease on a finished run: its release wakes nobody either.
    second = new_run(run_id(2))
    await other.create(*second)
    assert await heard.next() == run_id(2)
    lease = await other.claim_lease(run_id(2), "driver", 30, BASE_TIME)
    assert lease is not None
    stopped = cancel(second[0])
    await other.append(run_id(2), stopped.expected_version, stopped.facts, stopped.head, lease=lease)
    await other.release_lease(lease)
    assert await heard.nothing_for(0.3)


async def test_a_rolled_back_write_wakes_nobody(store: PostgresStore, other: PostgresStore) -> None:
    heard = Heard()
    await store.listen(heard)
    head, facts = new_run(run_id(1))
    await other.create(head, facts)
    assert await heard.next() == run_id(1)
    stale = complete_task(head)
    await other.append(run_id(1), stale.expected_version, stale.facts, stale.head)
    assert await heard.next() == run_id(1)
    with pytest.raises(Exception, match="changed concurrently"):
        await other.append(run_id(1), stale.expected_version, stale.facts, stale.head)
    assert await heard.nothing_for(0.3)


async def test_unlisten_stops_the_callbacks(store: PostgresStore, other: PostgresStore) -> None:
    heard = Heard()
    await store.listen(heard)
    await store.unlisten(heard)
    await other.create(*new_run(run_id(1)))
    assert await heard.nothing_for(0.3)


async def test_stores_in_other_schemas_do_not_wake_each_other(
    store: PostgresStore, db: PostgresDatabase, tmp_path: Path
) -> None:
    assert store.channel == channel_for(db.schema) != CHANNEL
    heard = Heard()
    await store.listen(heard)
    async with postgres_schema(db.dsn) as schema:
        await migrate(schema_url(db.dsn, schema), home=tmp_path)
        elsewhere = await PostgresStore.open(db.dsn, schema=schema)
        try:
            await elsewhere.create(*new_run(run_id(1)))
        finally:
            await elsewhere.close()
    assert await heard.nothing_for(0.3)


# ----------------------------------------------------------------------------- errors, isolation


async def test_schemas_isolate_stores(store: PostgresStore, db: PostgresDatabase, tmp_path: Path) -> None:
    await store.create(*new_run(run_id(1)))
    async with postgres_schema(db.dsn) as schema:
        await migrate(schema_url(db.dsn, schema), home=tmp_path)
        elsewhere = await PostgresStore.open(db.dsn, schema=schema)
        try:
            assert (await elsewhere.list_runs()).runs == []
        finally:
            await elsewhere.close()


async def test_an_unreachable_server_is_store_unavailable_without_the_password() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with anyio.fail_after(10), pytest.raises(StoreUnavailable) as caught:
        await PostgresStore.open(f"postgresql://u:hunter2secret@127.0.0.1:{port}/db", connect_timeout=2)
    assert "hunter2secret" not in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)


async def test_a_missing_database_is_store_unavailable(db: PostgresDatabase) -> None:
    dsn = db.dsn.rsplit("/", 1)[0] + "/no_such_database_here"
    with pytest.raises(StoreUnavailable, match="no_such_database_here"):
        await PostgresStore.open(dsn)


async def test_nul_is_stored_escaped_in_jsonb_and_reads_back(
    store: PostgresStore, db: PostgresDatabase
) -> None:
    """JSONB refuses U+0000: the adapter stores it as U+E000 '0' (and U+E000 as U+E000 twice), so the
    head stays JSONB and a fact body (text since migration 0008) casts to JSONB that SQL can query,
    and the text reads back exactly."""
    head, facts = new_run(run_id(1), request="req \x00 \ue000")
    await store.create(head, facts)
    write = complete_task(head, output="a NUL \x00 character")
    await store.append(run_id(1), write.expected_version, write.facts, write.head)
    conn = await asyncpg.connect(db.dsn, server_settings={"search_path": db.schema})
    try:
        body = await conn.fetchval(
            "SELECT body::jsonb ->> 'output' FROM facts WHERE run_id = $1 AND seq = 3", run_id(1)
        )
        request = await conn.fetchval(
            "SELECT head::jsonb ->> 'request' FROM runs WHERE run_id = $1", run_id(1)
        )
    finally:
        await conn.close()
    assert body == "a NUL \ue0000 character"
    assert request == "req \ue0000 \ue000\ue000"
    assert (await store.read_fact(run_id(1), 3)).output == "a NUL \x00 character"  # type: ignore[union-attr]
    assert (await store.load(run_id(1))).request == "req \x00 \ue000"


async def test_migration_3_escapes_the_private_use_character_of_older_rows(
    store: PostgresStore, db: PostgresDatabase, tmp_path: Path
) -> None:
    text = "older \ue000 text, \ue0000 too"
    head, facts = new_run(run_id(1), request=text)
    await store.create(head, facts)
    write = complete_task(head, output=text)
    await store.append(run_id(1), write.expected_version, write.facts, write.head)
    # Undo the escape, as a release before migration 3 wrote these rows, and forget migration 3.
    conn = await asyncpg.connect(db.dsn, server_settings={"search_path": db.schema})
    try:
        for table, column in (("runs", "head"), ("facts", "body")):
            await conn.execute(
                f"UPDATE {table} SET {column} = "
                f"replace({column}::text, chr(57344) || chr(57344), chr(57344))::jsonb"
            )
        # Forget the migrations after 3 too (undoing 0004_lease_token, 0005_tombstones and
        # 0010_head_as_text), so that 3 is pending again.
        await conn.execute("ALTER TABLE leases DROP COLUMN token")
        await conn.execute("ALTER TABLE runs ALTER COLUMN head TYPE jsonb USING head::jsonb")
        await conn.execute("DROP TABLE tombstones")
        await conn.execute("DELETE FROM schema_migrations WHERE version >= 3")
    finally:
        await conn.close()
    report = await migrate(schema_url(db.dsn, db.schema), home=tmp_path)
    assert report.applied[:2] == ("0003_nul_escape.sql", "0004_lease_token.sql")
    assert (await store.load(run_id(1))).request == text
    assert (await store.read_fact(run_id(1), 3)).output == text  # type: ignore[union-attr]


async def test_a_closed_store_refuses_calls(db: PostgresDatabase) -> None:
    opened = await db.open()
    await opened.close()
    await opened.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await opened.load(run_id(1))


async def test_lists_and_runnable_can_read_through_indexes(
    store: PostgresStore, db: PostgresDatabase
) -> None:
    """With sequential and bitmap scans priced out (the test tables are tiny), each query has an index plan
    that needs no sort: a page costs ``limit`` rows, not the table."""
    from stores._sql import queries

    await _create_runs(store, 3)
    named = queries("postgres")
    conn = await asyncpg.connect(db.dsn, server_settings={"search_path": db.schema})
    try:
        await conn.execute("SET enable_seqscan = off")
        await conn.execute("SET enable_bitmapscan = off")
        await conn.execute("SET plan_cache_mode = force_generic_plan")

        async def plan(name: str, *args: object) -> str:
            rows = await conn.fetch("EXPLAIN " + named[name], *args)
            return "\n".join(r[0] for r in rows)

        listing = await plan("list_runs", BASE_TIME + timedelta(days=1), "", 5)
        assert "runs_created" in listing and "Sort" not in listing, listing
        runnable = await plan("runnable", BASE_TIME, 5, RECORD_FORMAT)
        # Two limited index scans merged in order (Merge Append): no sort of the active runs.
        assert "runs_runnable" in runnable and "->  Sort" not in runnable, runnable
        assert "Seq Scan" not in runnable, runnable
    finally:
        await conn.close()


async def test_a_released_connection_costs_no_reset_round_trip(store: PostgresStore) -> None:
    """The pooled connections keep no session state, so giving one back sends nothing (asyncpg's
    default reset sends ``RESET ALL``, ``UNLISTEN *``, ... each time)."""
    sent: list[str] = []
    pool = store._pool
    async with pool.acquire() as conn:
        conn.add_query_logger(lambda record: sent.append(record.query))
        await conn.fetchval("SELECT 1")
    await anyio.lowlevel.checkpoint()  # asyncpg calls query loggers soon after, not at once
    assert sent == ["SELECT 1"]

"""The postgres append as one statement (issue 11): one round trip per append, each refusal still
its own error, and the run and lease rows locked in the order the claim path locks them. A create
is one statement too, with an idempotency key or without, and a keyed one is still refused when its
key's run is pruned while it waits on the key (issue 24)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import anyio
import anyio.lowlevel
import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.errors import InvalidArgument, LeaseLost, RunNotFound, RunPruned, VersionConflict
from orchestration.store import CreateResult, Lease, Tombstone
from stores import migrate, parse_store_spec
from stores._retention import encode_tombstone
from stores._sql import migrations
from stores.postgres import PostgresStore
from tests.stores.builders import BASE_TIME, complete_task, new_run, run_id, start_attempt
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url

pytestmark = pytest.mark.postgres


@pytest.fixture
async def dsn_and_schema(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        await migrate(schema_url(dsn, schema), home=tmp_path)
        yield parse_store_spec(dsn, home=tmp_path).dsn or dsn, schema


@pytest.fixture
async def store(dsn_and_schema: tuple[str, str]) -> AsyncIterator[PostgresStore]:
    dsn, schema = dsn_and_schema
    # One connection, so that the test sees every statement the store sends.
    opened = await PostgresStore.open(dsn, schema=schema, min_size=1, max_size=1)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_fenced_append_is_one_statement(store: PostgresStore) -> None:
    """The compare-and-swap, the fence, the insert and the notify go in one statement (one round
    trip, committed by the implicit transaction), not BEGIN ... COMMIT around four."""
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    lease = await store.claim_lease(run_id(1), "me", 30, BASE_TIME)
    assert lease is not None
    first = start_attempt(head)
    await store.append(run_id(1), first.expected_version, first.facts, first.head, lease=lease)
    sent: list[str] = []
    async with store._pool.acquire() as conn:
        conn.add_query_logger(lambda record: sent.append(record.query))
    done = complete_task(first.head)
    await store.append(run_id(1), done.expected_version, done.facts, done.head, lease=lease)
    await anyio.lowlevel.checkpoint()  # asyncpg calls query loggers soon after, not at once
    assert len(sent) == 1, sent
    assert await store.load(run_id(1)) == done.head
    assert [f.seq for f in await store.read_facts(run_id(1))] == list(range(1, done.head.last_seq + 1))


async def test_a_create_is_one_statement_with_an_idempotency_key_or_without(store: PostgresStore) -> None:
    for n, key in ((7, None), (8, "warm")):  # asyncpg learns the statements' types once
        await store.create(*new_run(run_id(n), key=key))
    sent: list[str] = []
    async with store._pool.acquire() as conn:
        conn.add_query_logger(lambda record: sent.append(" ".join(record.query.split())))
    for n, key in ((1, None), (2, "k")):
        await anyio.lowlevel.checkpoint()
        sent.clear()
        head, facts = new_run(run_id(n), key=key)
        assert (await store.create(head, facts)).created
        await anyio.lowlevel.checkpoint()  # asyncpg calls query loggers soon after, not at once
        assert len(sent) == 1 and "facts_in" in sent[0], (key, sent)
        assert await store.load(run_id(n)) == head
        assert await store.read_facts(run_id(n)) == list(facts)
    # The same key again: the first run, nothing written.
    again, again_facts = new_run(run_id(3), key="k")
    result = await store.create(again, again_facts)
    assert not result.created and result.head.run_id == run_id(2)
    with pytest.raises(RunNotFound):
        await store.load(run_id(3))


async def test_a_keyed_create_waiting_on_its_key_sees_the_prune_that_frees_it(
    store: PostgresStore, dsn_and_schema: tuple[str, str]
) -> None:
    """A prune of the key's run holds the key's index entry until it commits; a create with the
    key waits for it, then must see the tombstone that commit wrote (though its statement's
    snapshot predates it) and be refused, writing nothing (migration 0012)."""
    head, facts = new_run(run_id(1), key="k")
    await store.create(head, facts)
    dsn, schema = dsn_and_schema
    pruning = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    outcome: list[BaseException | CreateResult] = []

    async def create() -> None:
        try:
            outcome.append(await store.create(*new_run(run_id(2), key="k")))
        except RunNotFound as exc:
            outcome.append(exc)

    try:
        prune = pruning.transaction()
        await prune.start()
        for table in ("leases", "facts", "runs"):
            await pruning.execute(f"DELETE FROM {table} WHERE run_id = $1", run_id(1))
        tomb = encode_tombstone(Tombstone.of(head, "pruned", BASE_TIME + timedelta(days=30)))
        await pruning.execute("INSERT INTO tombstones VALUES ($1, $2, $3)", run_id(1), "k", tomb)
        async with anyio.create_task_group() as tg:
            tg.start_soon(create)
            await anyio.sleep(0.5)
            assert outcome == []  # waiting on the key's unique index
            await prune.commit()
    finally:
        await pruning.close()
    assert len(outcome) == 1 and isinstance(outcome[0], RunPruned), outcome
    assert "idempotency key" in outcome[0].message and run_id(1) in outcome[0].message
    with pytest.raises(RunNotFound):
        await store.load(run_id(2))
    assert await store.create(*new_run(run_id(3), key="k-2"))


async def test_each_refusal_keeps_its_error_and_writes_nothing(store: PostgresStore) -> None:
    head, facts = new_run(run_id(2))
    await store.create(head, facts)
    lease = await store.claim_lease(run_id(2), "me", 30, BASE_TIME)
    assert lease is not None
    write = start_attempt(head)
    with pytest.raises(RunNotFound):
        other = write.head.model_copy(update={"run_id": run_id(3)})
        await store.append(run_id(3), write.expected_version, write.facts, other)
    stale = Lease(run_id(2), "me", lease.expires_at, "not-the-token")
    with pytest.raises(LeaseLost):
        await store.append(run_id(2), write.expected_version, write.facts, write.head, lease=stale)
    # The lease lost wins over a version that moved too (as the RunStore contract says).
    moved = start_attempt(head).head.model_copy(update={"version": 3})
    with pytest.raises(LeaseLost):
        await store.append(run_id(2), 2, write.facts, moved, lease=stale)
    with pytest.raises(VersionConflict) as conflict:
        await store.append(run_id(2), 2, write.facts, moved, lease=lease)
    assert conflict.value.actual == 1
    gap = start_attempt(head)
    shifted = [f.model_copy(update={"seq": f.seq + 1}) for f in gap.facts]
    with pytest.raises(InvalidArgument, match="log has no fact"):
        await store.append(
            run_id(2), 1, shifted, gap.head.model_copy(update={"last_seq": shifted[-1].seq}), lease=lease
        )
    assert await store.load(run_id(2)) == head
    assert [f.seq for f in await store.read_facts(run_id(2))] == [1]
    await store.append(run_id(2), write.expected_version, write.facts, write.head, lease=lease)
    assert await store.load(run_id(2)) == write.head


async def test_an_append_waiting_for_the_run_row_holds_no_lock_on_the_lease_row(
    store: PostgresStore, dsn_and_schema: tuple[str, str]
) -> None:
    """claim_runnable locks the run row, then writes the lease row and the token on the run row. An
    append locks the run row only: while it waits for a run row that a claim holds, it must not
    hold the lease row, or the claim's lease write would wait for the append and the two would
    deadlock."""
    dsn, schema = dsn_and_schema
    head, facts = new_run(run_id(4))
    await store.create(head, facts)
    lease = await store.claim_lease(run_id(4), "me", 30, BASE_TIME)
    assert lease is not None
    claimer = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        claim = claimer.transaction()
        await claim.start()
        await claimer.execute("SELECT 1 FROM runs WHERE run_id = $1 FOR NO KEY UPDATE", run_id(4))
        write = start_attempt(head)
        errors: list[BaseException] = []
        async with store._pool.acquire() as conn:
            pid = conn.get_server_pid()

        async def append() -> None:
            try:
                await store.append(run_id(4), write.expected_version, write.facts, write.head, lease=lease)
            except LeaseLost as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            await _wait_for_a_lock_wait(dsn, pid)
            # The claim's lease write goes through at once (a deadlock would be detected only
            # after deadlock_timeout and abort one of the two).
            await claimer.execute("SET LOCAL lock_timeout = '2s'")
            with anyio.fail_after(5):
                await claimer.execute("UPDATE leases SET token = 'claimed' WHERE run_id = $1", run_id(4))
            await claimer.execute("UPDATE runs SET lease_token = 'claimed' WHERE run_id = $1", run_id(4))
            await claim.commit()
        # The claim committed first: the append was refused by the fence, and wrote nothing.
        assert len(errors) == 1
    finally:
        await claimer.close()
    assert await store.load(run_id(4)) == head


async def _wait_for_a_lock_wait(dsn: str, pid: int) -> None:
    """Wait until the session ``pid`` waits for a lock."""
    conn = await asyncpg.connect(dsn)
    try:
        with anyio.fail_after(10):
            while not await conn.fetchval(  # noqa: ASYNC110
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", pid
            ):
                await anyio.sleep(0.01)
    finally:
        await conn.close()


async def test_heads_are_compressed_with_lz4_where_the_server_has_it(store: PostgresStore) -> None:
    """Migration head_lz4: every append rewrites the head, and lz4 compresses it faster than pglz."""
    async with store._pool.acquire() as conn:
        compression = await conn.fetchval(
            "SELECT attcompression::text FROM pg_attribute "
            "WHERE attrelid = 'runs'::regclass AND attname = 'head'"
        )
        try:
            async with conn.transaction():
                await conn.execute("SET LOCAL default_toast_compression = 'lz4'")
        except asyncpg.PostgresError:
            pytest.skip("this PostgreSQL server has no lz4 compression")
    assert compression == "l"


async def test_the_chain_snapshot_is_written_once_and_read_back_with_every_head(
    store: PostgresStore, dsn_and_schema: tuple[str, str]
) -> None:
    """Migration chain_written_once: the chain (most of a head) is written by the create only,
    appends write the head without it, reads put it back; a head written before (the chain inside
    it) is read as it is, and migrating splits it."""
    dsn, schema = dsn_and_schema
    head, facts = new_run(run_id(5))
    await store.create(head, facts)
    write = start_attempt(head)
    await store.append(run_id(5), write.expected_version, write.facts, write.head)
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        row = await conn.fetchrow(
            "SELECT head::jsonb ? 'chain' AS inline, chain IS NOT NULL AS apart FROM runs"
        )
        assert (row["inline"], row["apart"]) == (False, True)
        assert await store.load(run_id(5)) == write.head
        assert (await store.list_runs()).runs == [write.head]
        # A head as the previous version wrote it: the chain inside, none apart.
        await conn.execute(
            "UPDATE runs SET head = head::jsonb || jsonb_build_object('chain', chain), chain = NULL"
        )
        assert await store.load(run_id(5)) == write.head
        # The migration splits it (run again as it is packaged, whatever its number).
        (split,) = [m for m in migrations("postgres") if m.name.endswith("_chain_written_once.sql")]
        await conn.execute(split.sql)
        row = await conn.fetchrow(
            "SELECT head::jsonb ? 'chain' AS inline, chain IS NOT NULL AS apart FROM runs"
        )
        assert (row["inline"], row["apart"]) == (False, True)
    finally:
        await conn.close()
    assert await store.load(run_id(5)) == write.head
    done = complete_task(write.head)
    await store.append(run_id(5), done.expected_version, done.facts, done.head)
    assert await store.load(run_id(5)) == done.head


async def test_claims_and_releases_racing_keep_the_run_rows_tokens_the_leases_tokens(
    dsn_and_schema: tuple[str, str],
) -> None:
    """Migration 0009 keeps each lease's token on its run row too, written by every statement that
    changes it (claim_lease, claim_runnable, release_lease), each locking the run row first. Many of
    them racing over a few runs neither deadlock (PostgreSQL would abort one of two after
    deadlock_timeout: a StoreError here) nor leave a run row whose token is not its lease's; and a
    fenced append passes with the token its run holds and is refused with any other."""
    dsn, schema = dsn_and_schema
    stores = [await PostgresStore.open(dsn, schema=schema, min_size=1, max_size=4) for _ in range(2)]
    try:
        heads = [new_run(run_id(n)) for n in range(3)]
        for head, facts in heads:
            await stores[0].create(head, facts)
        held: dict[str, Lease] = {}

        async def racer(n: int) -> None:
            store = stores[n % 2]
            for i in range(60):
                now = BASE_TIME + timedelta(seconds=i)  # leases of 1 s: claims take expired ones over
                rid = run_id((n + i) % 3)
                match (n + i) % 3:
                    case 0:
                        lease = await store.claim_lease(rid, f"owner-{n}", 1, now)
                        if lease is not None:
                            held[rid] = lease
                    case 1:
                        for lease in await store.claim_runnable(f"owner-{n}", 1, now, limit=2):
                            held[lease.run_id] = lease
                    case _:
                        lease = held.get(rid)
                        if lease is not None:
                            await store.release_lease(lease)
                await anyio.lowlevel.checkpoint()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for n in range(6):
                    tg.start_soon(racer, n)
        conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
        try:
            rows = await conn.fetch(
                "SELECT runs.run_id, runs.lease_token, leases.token FROM runs "
                "LEFT JOIN leases ON leases.run_id = runs.run_id"
            )
        finally:
            await conn.close()
        assert rows and all(row[1] == row[2] for row in rows), [tuple(row) for row in rows]
        for (head, _), row in zip(heads, sorted(rows), strict=True):
            write = start_attempt(head)
            current = row[2]
            stale = Lease(head.run_id, "nobody", BASE_TIME, "not-the-token")
            with pytest.raises(LeaseLost):
                await stores[0].append(
                    head.run_id, write.expected_version, write.facts, write.head, lease=stale
                )
            if current is not None:
                lease = Lease(head.run_id, "whoever", BASE_TIME, current)
                await stores[0].append(
                    head.run_id, write.expected_version, write.facts, write.head, lease=lease
                )
                assert await stores[0].load(head.run_id) == write.head
    finally:
        for store in stores:
            await store.close()

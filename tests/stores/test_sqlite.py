"""What is specific to the sqlite adapter: WAL and the busy timeout, several store instances (and
processes) on one file, ``claim_runnable``, index use, unreadable rows, error translation."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from orchestration.core.vocabulary import RunStatus
from orchestration.errors import CorruptRecord, StoreError, StoreUnavailable, VersionConflict
from orchestration.store import Lease
from stores._sql import migrations, queries, split_sqlite_script
from stores.sqlite import SqliteStore
from tests.stores.builders import (
    BASE_TIME,
    cancel,
    complete_task,
    new_run,
    request_approval,
    run_id,
    start_attempt,
)


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    return tmp_path / "construct.db"


@pytest.fixture
async def store(db: Path) -> AsyncIterator[SqliteStore]:
    opened = await SqliteStore.open(db)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def other(db: Path, store: SqliteStore) -> AsyncIterator[SqliteStore]:
    """A second store on the same file: another process, as far as SQLite can tell."""
    opened = await SqliteStore.open(db)
    try:
        yield opened
    finally:
        await opened.close()


def raw(db: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db)
    try:
        with conn:
            return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


async def test_the_file_is_in_wal_mode(store: SqliteStore, db: Path) -> None:
    assert raw(db, "PRAGMA journal_mode") == [("wal",)]


async def test_two_instances_on_one_file_see_each_others_writes(
    store: SqliteStore, other: SqliteStore
) -> None:
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    write = start_attempt(head)
    await other.append(run_id(1), write.expected_version, write.facts, write.head)
    assert await store.load(run_id(1)) == write.head


async def test_concurrent_appends_from_two_instances_exactly_one_wins(
    store: SqliteStore, other: SqliteStore
) -> None:
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    write = start_attempt(head)
    outcomes: list[str] = []

    async def attempt(s: SqliteStore) -> None:
        try:
            await s.append(run_id(1), write.expected_version, write.facts, write.head)
            outcomes.append("won")
        except VersionConflict:
            outcomes.append("conflict")

    async with anyio.create_task_group() as tg:
        for s in (store, other, store, other):
            tg.start_soon(attempt, s)
    assert sorted(outcomes) == ["conflict", "conflict", "conflict", "won"]
    assert [f.seq for f in await store.read_facts(run_id(1))] == [1, 2]


async def test_concurrent_lease_claims_from_two_instances(store: SqliteStore, other: SqliteStore) -> None:
    await store.create(*new_run(run_id(1)))
    got: list[Lease | None] = []

    async def claim(s: SqliteStore, owner: str) -> None:
        got.append(await s.claim_lease(run_id(1), owner, 30, BASE_TIME))

    async with anyio.create_task_group() as tg:
        for n in range(6):
            tg.start_soon(claim, (store, other)[n % 2], f"worker-{n}")
    assert len([lease for lease in got if lease is not None]) == 1


async def test_writers_in_separate_processes_serialize_on_the_file(store: SqliteStore, db: Path) -> None:
    """Two OS processes append to one run with retry on conflict: no write is lost or doubled."""
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    child = textwrap.dedent(
        f"""
        import asyncio
        from pathlib import Path
        from orchestration.errors import VersionConflict
        from stores.sqlite import SqliteStore
        from tests.stores.builders import start_attempt

        async def main():
            store = await SqliteStore.open(Path({str(db)!r}))
            done = 0
            while done < 15:
                head = await store.load({run_id(1)!r})
                write = start_attempt(head)
                try:
                    await store.append(head.run_id, write.expected_version, write.facts, write.head)
                    done += 1
                except VersionConflict:
                    pass
            await store.close()

        asyncio.run(main())
        """
    )
    root = Path(__file__).parents[2]
    procs = [
        await anyio.open_process([sys.executable, "-c", child], cwd=root, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    with anyio.fail_after(120):
        for proc in procs:
            assert await proc.wait() == 0
            await proc.aclose()
    final = await store.load(run_id(1))
    assert final.version == 31
    assert [f.seq for f in await store.read_facts(run_id(1))] == list(range(1, 32))
    assert len(final.task("architect").attempts) == 30


# ------------------------------------------------------------------------------ claim_runnable


async def _runs_in_every_state(store: SqliteStore) -> dict[str, str]:
    """Runs 1..6: queued, queued-later (not due), running, awaiting approval, cancelled, queued."""
    names: dict[str, str] = {}
    for n in range(1, 7):
        head, facts = new_run(run_id(n), at=BASE_TIME + timedelta(seconds=n))
        await store.create(head, facts)
        if n == 2:
            from tests.stores.builders import fail_attempt

            w = fail_attempt(head, not_before=BASE_TIME + timedelta(hours=1))
            await store.append(head.run_id, w.expected_version, w.facts, w.head)
        elif n == 3:
            w = start_attempt(head)
            await store.append(head.run_id, w.expected_version, w.facts, w.head)
        elif n == 4:
            h = head
            for step in (complete_task, lambda h: complete_task(h, "engineer"), request_approval):
                w = step(h)
                h = await store.append(h.run_id, w.expected_version, w.facts, w.head)
        elif n == 5:
            w = cancel(head)
            await store.append(head.run_id, w.expected_version, w.facts, w.head)
        names[run_id(n)] = (await store.load(run_id(n))).status.value
    return names


async def test_claim_runnable_claims_what_runnable_lists(store: SqliteStore) -> None:
    states = await _runs_in_every_state(store)
    assert states[run_id(4)] == RunStatus.AWAITING_APPROVAL
    now = BASE_TIME + timedelta(minutes=1)
    expected = [run_id(1), run_id(3), run_id(6)]
    assert await store.runnable(now) == expected
    leases = await store.claim_runnable("w1", 30, now, limit=10)
    assert [lease.run_id for lease in leases] == expected
    assert all(lease.owner == "w1" and lease.expires_at == now + timedelta(seconds=30) for lease in leases)
    # Held by w1: nothing for w2, and nothing new for w1 either.
    assert await store.claim_runnable("w2", 30, now, limit=10) == []
    assert await store.claim_runnable("w1", 30, now, limit=10) == []
    # After expiry w2 takes them over; the not-yet-due run becomes claimable when due.
    later = BASE_TIME + timedelta(hours=2)
    taken = await store.claim_runnable("w2", 30, later, limit=10)
    assert [lease.run_id for lease in taken] == [run_id(1), run_id(2), run_id(3), run_id(6)]


async def test_claim_runnable_respects_the_limit_and_skips_leased_runs(store: SqliteStore) -> None:
    for n in range(1, 6):
        await store.create(*new_run(run_id(n), at=BASE_TIME + timedelta(seconds=n)))
    assert await store.claim_lease(run_id(1), "other", 60, BASE_TIME) is not None
    first = await store.claim_runnable("me", 60, BASE_TIME, limit=2)
    assert [lease.run_id for lease in first] == [run_id(2), run_id(3)]


async def test_concurrent_claim_runnable_never_hands_out_a_run_twice(
    store: SqliteStore, other: SqliteStore
) -> None:
    for n in range(1, 21):
        await store.create(*new_run(run_id(n), at=BASE_TIME + timedelta(seconds=n)))
    claimed: dict[str, list[str]] = {"a": [], "b": []}

    async def claimer(s: SqliteStore, owner: str) -> None:
        while True:
            leases = await s.claim_runnable(owner, 60, BASE_TIME, limit=3)
            if not leases:
                return
            claimed[owner].extend(lease.run_id for lease in leases)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(claimer, store, "a")
        tg.start_soon(claimer, other, "b")
    assert not set(claimed["a"]) & set(claimed["b"])
    assert sorted(claimed["a"] + claimed["b"]) == [run_id(n) for n in range(1, 21)]


# ------------------------------------------------------------------------------------- queries


def _plan(db: Path, name: str, params: dict[str, object]) -> str:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("EXPLAIN QUERY PLAN " + queries("sqlite")[name], params).fetchall()
    finally:
        conn.close()
    return " | ".join(str(row[-1]) for row in rows)


async def test_lists_and_runnable_read_through_indexes(store: SqliteStore, db: Path) -> None:
    listing = _plan(db, "list_runs", {"after_created": "9", "after_run_id": "", "limit": 5})
    assert "USING INDEX runs_created" in listing or "USING COVERING INDEX runs_created" in listing, listing
    assert "TEMP B-TREE" not in listing, listing
    runnable = _plan(db, "runnable", {"now": "2026", "limit": 5})
    # The active runs come out of runs_runnable in order (no sort of them); only the few due wake_at
    # runs and the merge of the two limited branches are sorted.
    steps = runnable.split(" | ")
    active = steps.index("SCAN runs USING INDEX runs_runnable")
    assert "TEMP B-TREE" not in steps[active + 1], runnable
    assert "SEARCH runs USING INDEX runs_wake_at (wake_at<?)" in steps, runnable
    assert "SCAN runs" not in steps, runnable
    by_status = _plan(
        db,
        "list_runs_by_status",
        {"after_created": "9", "after_run_id": "", "limit": 5, "statuses": '["queued"]'},
    )
    assert "INDEX runs_" in by_status, by_status


async def test_an_unreadable_head_is_corrupt_on_load_and_skipped_in_lists(
    store: SqliteStore, db: Path
) -> None:
    for n in (1, 2, 3):
        await store.create(*new_run(run_id(n), at=BASE_TIME + timedelta(seconds=n)))
    raw(db, 'UPDATE runs SET head = \'{"not": "a head"}\' WHERE run_id = ?', run_id(2))
    with pytest.raises(CorruptRecord):
        await store.load(run_id(2))
    page = await store.list_runs(limit=2)
    assert [h.run_id for h in page.runs] == [run_id(3)]
    assert page.next_cursor is not None
    rest = await store.list_runs(limit=2, cursor=page.next_cursor)
    assert [h.run_id for h in rest.runs] == [run_id(1)]


async def test_an_unreadable_fact_is_corrupt(store: SqliteStore, db: Path) -> None:
    await store.create(*new_run(run_id(1)))
    raw(db, "UPDATE facts SET body = 'garbage' WHERE run_id = ?", run_id(1))
    with pytest.raises(CorruptRecord, match="fact 1"):
        await store.read_facts(run_id(1))


async def test_outputs_with_any_character_round_trip(store: SqliteStore) -> None:
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    output = "nul \x00 emoji \U0001f600 quote ' backslash \\ newline \n end"
    write = complete_task(head, output=output)
    await store.append(run_id(1), write.expected_version, write.facts, write.head)
    fact = await store.read_fact(run_id(1), 3)
    assert getattr(fact, "output", None) == output


async def test_a_cancelled_append_leaves_the_store_usable(store: SqliteStore) -> None:
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    write = start_attempt(head)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await store.append(run_id(1), write.expected_version, write.facts, write.head)
    # Whether or not the cancelled write landed, the connection is not stuck inside a transaction.
    current = await store.load(run_id(1))
    nxt = start_attempt(current)
    await store.append(run_id(1), nxt.expected_version, nxt.facts, nxt.head)
    assert (await store.load(run_id(1))).version == current.version + 1


async def test_a_file_that_cannot_be_opened_is_store_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailable):
        await SqliteStore.open(blocker / "construct.db")


async def test_a_file_that_is_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "construct.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError):
        await SqliteStore.open(path)


async def test_a_closed_store_refuses_calls(db: Path) -> None:
    opened = await SqliteStore.open(db)
    await opened.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await opened.load(run_id(1))


async def test_the_chain_snapshot_is_written_once_and_read_back_with_every_head(
    store: SqliteStore, db: Path
) -> None:
    """Migration chain_written_once: the chain (most of a head) is written by the create only,
    appends write the head without it, reads put it back; a head written before (the chain inside
    it) is read as it is, and migrating splits it (a head that is not JSON is left as it is)."""
    head, facts = new_run(run_id(7), request='a "quoted" request, é, \x00')
    await store.create(head, facts)
    write = start_attempt(head)
    await store.append(run_id(7), write.expected_version, write.facts, write.head)
    inline = "json_type(head, '$.chain') IS NOT NULL"
    assert raw(db, f"SELECT {inline}, chain IS NOT NULL FROM runs") == [(0, 1)]
    assert await store.load(run_id(7)) == write.head
    assert (await store.list_runs()).runs == [write.head]
    # A head as the previous version wrote it: the chain inside, none apart.
    raw(db, "UPDATE runs SET head = json_set(head, '$.chain', json(chain)), chain = NULL")
    assert await store.load(run_id(7)) == write.head
    other, other_facts = new_run(run_id(8))
    await store.create(other, other_facts)
    raw(db, "UPDATE runs SET head = 'not json', chain = NULL WHERE run_id = ?", run_id(8))
    (split,) = [m for m in migrations("sqlite") if m.name.endswith("_chain_written_once.sql")]
    for statement in split_sqlite_script(split.sql):
        if "ALTER TABLE" not in statement:
            raw(db, statement)
    assert raw(db, f"SELECT run_id, {inline}, chain IS NOT NULL FROM runs WHERE json_valid(head)") == [
        (run_id(7), 0, 1)
    ]
    assert await store.load(run_id(7)) == write.head
    with pytest.raises(CorruptRecord):
        await store.load(run_id(8))
    done = complete_task(write.head)
    await store.append(run_id(7), done.expected_version, done.facts, done.head)
    assert await store.load(run_id(7)) == done.head

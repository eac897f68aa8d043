"""The SQLite ``RunStore`` (aiosqlite): one file, several processes, WAL mode.

Every write is one ``BEGIN IMMEDIATE`` transaction (SQLite's write lock taken up front, so no two
processes decide on a stale read), with the compare-and-swap on ``runs.version`` and the lease
fence inside it; ``synchronous = FULL``, so a write is on disk when it returns. Writes of this
process's concurrent tasks share a commit, each in its own savepoint. Reads use a second connection
and never wait for the writer.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import anyio

from orchestration.core import Fact, RunHead, RunStatus, validate_run_id
from orchestration.errors import (
    Conflict,
    ConstructError,
    CorruptRecord,
    FactNotFound,
    InvalidArgument,
    StoreError,
    StoreUnavailable,
    VersionConflict,
)
from orchestration.store import CreateResult, Lease, RunPage, new_lease_token
from stores._common import (
    check_append,
    check_create,
    decode_cursor,
    moved_chain,
    not_continuing,
    sortable_time,
)
from stores._lease import lease_lost
from stores._migrations import MigrationReport, SchemaOutOfDate, check_schema, run_migrations
from stores._sql import (
    CURSOR_START_KEY,
    Dialect,
    Migration,
    cursor_for_key,
    decode_fact,
    decode_head,
    head_version,
    queries,
    split_sqlite_script,
)
from stores._sql_versions import SqliteChainVersions
from stores._sqlite_retention import SqliteRetention, check_key_free, missing
from stores._sqlite_rows import fact_row, head_row, run_row
from stores._sqlite_thread import GroupCommit, fetch_all, fetch_one, on_thread

log = logging.getLogger(__name__)

Q = queries("sqlite")
T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT_SECONDS = 10.0


@contextmanager
def _translated(where: str) -> Iterator[None]:
    """Translate sqlite3 errors at the adapter edge; the project's own errors pass through."""
    try:
        yield
    except ConstructError:
        raise
    except sqlite3.OperationalError as exc:
        text = str(exc)
        if "unable to open" in text or "readonly" in text or "disk I/O" in text:
            raise StoreUnavailable(f"{where}: {text}") from exc
        if "locked" in text or "busy" in text:
            raise StoreError(f"{where}: the database stayed locked past the busy timeout ({text})") from exc
        raise StoreError(f"{where}: {text}") from exc
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{where}: {exc}") from exc
    except OSError as exc:
        raise StoreUnavailable(f"{where}: {exc}") from exc


async def _connect(path: Path, busy_timeout: float) -> aiosqlite.Connection:
    """A connection in autocommit mode (``isolation_level=None``): transactions are the explicit
    ``BEGIN IMMEDIATE`` ... ``COMMIT`` of :meth:`SqliteStore._write`, never the sqlite3 module's
    implicit ones. ``timeout`` is SQLite's busy timeout.

    Shielded: a cancelled ``aiosqlite.connect`` would leave its worker thread running with nobody
    to close it."""
    with anyio.CancelScope(shield=True):
        conn = await aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout)
        try:
            await _enable_wal(conn, busy_timeout)
            await conn.execute(Q["synchronous_full"])
            await conn.execute(Q["foreign_keys_on"])
        except BaseException:
            await conn.close()
            raise
    return conn


async def _enable_wal(conn: aiosqlite.Connection, busy_timeout: float) -> None:
    # Switching a new file to WAL needs an exclusive lock, and SQLite answers "database is locked"
    # at once instead of calling the busy handler when another connection is doing the same; so
    # this one statement is retried here, within the busy timeout.
    deadline = anyio.current_time() + busy_timeout
    delay = 0.005
    while True:
        try:
            await conn.execute(Q["enable_wal"])
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or anyio.current_time() + delay > deadline:
                raise
        await anyio.sleep(delay)
        delay = min(delay * 2, 0.1)


class _SqliteTarget:
    """:class:`stores._migrations.MigrationTarget` over one connection."""

    dialect: Dialect = "sqlite"

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def current_version(self) -> int:
        rows = list(await self._conn.execute_fetchall(Q["migrations_table_exists"]))
        if not rows or not rows[0][0]:
            return 0
        rows = list(await self._conn.execute_fetchall(Q["schema_version"]))
        return int(rows[0][0])

    async def apply(self, migration: Migration) -> bool:
        # executescript would COMMIT before running, so the statements run one by one inside our
        # own BEGIN IMMEDIATE: the migration and its schema_migrations row land together or not at all.
        async with _transaction(self._conn):
            await self._conn.execute(Q["create_migrations_table"])
            current = await self.current_version()
            if current >= migration.version:
                return False
            if current != migration.version - 1:
                raise StoreError(
                    f"cannot apply {migration.name}: the schema is at version {current}, "
                    f"not {migration.version - 1}"
                )
            for statement in split_sqlite_script(migration.sql):
                await self._conn.execute(statement)
            await self._conn.execute(
                Q["record_migration"],
                {
                    "version": migration.version,
                    "name": migration.name,
                    "applied_at": sortable_time(datetime.now(UTC)),
                },
            )
            return True


@asynccontextmanager
async def _transaction(conn: aiosqlite.Connection) -> AsyncIterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error.

    Shielded from cancellation: aiosqlite runs each statement on its own thread, which a cancelled
    await does not stop, so a write abandoned halfway would leave the connection inside an open
    transaction (blocking every later write). A write is short; it finishes or rolls back.
    """
    with anyio.CancelScope(shield=True):
        await conn.execute(Q["begin_immediate"])
        try:
            yield
        except BaseException:
            await conn.rollback()
            raise
        else:
            await conn.commit()


async def migrate_sqlite(
    path: Path,
    *,
    check_only: bool = False,
    migrations: Sequence[Migration] | None = None,
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
) -> MigrationReport:
    """:func:`stores.migrate` for a SQLite file (creates the file unless ``check_only``)."""
    where = f"sqlite:///{path}"
    if check_only and not await anyio.Path(path).exists():
        # Checking must not create the file: a missing file is a schema at version 0.
        wanted = migrations[-1].version if migrations else head_version("sqlite")
        raise SchemaOutOfDate(f"the sqlite store {where}", 0, wanted)
    with _translated(where):
        await anyio.Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = await _connect(path, busy_timeout)
        try:
            return await run_migrations(
                _SqliteTarget(conn),
                store=where,
                backend="sqlite",
                check_only=check_only,
                migrations=migrations,
            )
        finally:
            await conn.close()


class SqliteStore(SqliteRetention, SqliteChainVersions):
    """A ``RunStore`` in one SQLite file. Open with :meth:`open`; safe to share between tasks and
    between processes that open the same file."""

    name = "sqlite"

    def __init__(self, path: Path, writer: aiosqlite.Connection, reader: aiosqlite.Connection) -> None:
        """Use :meth:`open`."""
        self.path = path
        self._where = f"sqlite store {path}"
        # Every call is one trip to a connection's thread (stores._sqlite_thread): a write is one
        # function holding its whole transaction; the writes of concurrent tasks are committed in
        # groups (one transaction and one fsync for the writes that arrive while one is on the
        # thread), and SQLite's own lock (BEGIN IMMEDIATE + busy timeout) orders them against
        # other processes.
        self._writer = writer
        self._writes = GroupCommit(writer)
        self._reader = reader
        self._closed = False

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
        auto_migrate: bool = True,
    ) -> SqliteStore:
        """Open (creating it if needed) the store file at ``path``.

        With ``auto_migrate`` (the default) pending migrations are applied first: the file is the
        server's own, and concurrent openers serialize on ``BEGIN IMMEDIATE``. Without it, a schema
        that is behind raises :class:`stores.SchemaOutOfDate`. Raises ``StoreUnavailable``
        when the file cannot be opened.
        """
        where = f"sqlite store {path}"
        with _translated(where):
            await anyio.Path(path).parent.mkdir(parents=True, exist_ok=True)
            writer = await _connect(path, busy_timeout)
            try:
                target = _SqliteTarget(writer)
                if auto_migrate:
                    await run_migrations(target, store=f"sqlite:///{path}", backend="sqlite")
                await check_schema(target, f"the {where}")
                reader = await _connect(path, busy_timeout)
            except BaseException:
                await writer.close()
                raise
        return cls(path, writer, reader)

    # ----------------------------------------------------------------------------------------
    # plumbing

    async def _write(
        self, work: Callable[[sqlite3.Connection], T], flushing: Callable[[], None] | None = None
    ) -> T:
        """Run ``work`` in a write transaction on the writer's thread (one trip, maybe shared with
        concurrent writes: see ``GroupCommit``), with errors translated."""
        self._check_open()
        with _translated(self._where):
            return await self._writes.run(work, flushing)

    async def _read(self, sql: str, params: dict[str, Any]) -> list[Any]:
        self._check_open()
        with _translated(self._where):
            return await on_thread(self._reader, fetch_all, sql, params)

    async def _read_with(self, work: Callable[..., T], *args: Any) -> T:
        """``work(connection, *args)`` on the reader's thread (one trip), with errors translated."""
        self._check_open()
        with _translated(self._where):
            return await on_thread(self._reader, work, *args)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable(f"{self._where} is closed")

    async def _read_run(self, run_id: str, sql: str, params: dict[str, Any]) -> list[Any]:
        """The rows of one of the run's reads, in one trip. The run is checked after the read: a run
        deleted meanwhile is its tombstone error, never part of it."""
        rows, exists = await self._read_with(_rows_of_run, run_id, sql, params)
        if not exists:
            raise await self._gone(run_id)
        return rows

    # ----------------------------------------------------------------------------------------
    # RunStore

    async def create(
        self, head: RunHead, facts: Sequence[Fact], *, flushing: Callable[[], None] | None = None
    ) -> CreateResult:
        """See ``RunStore.create``. The key lookup and the inserts share one ``BEGIN IMMEDIATE``
        transaction, so two concurrent creates with one key make one run; ``flushing`` is called
        when the ``COMMIT`` begins (also for a create that found its key taken)."""
        validate_run_id(head.run_id)
        check_create(head, facts)

        new_run = run_row(head)
        fact_rows = [fact_row(head.run_id, f) for f in facts]

        def work(conn: sqlite3.Connection) -> CreateResult:
            if head.idempotency_key is not None:
                key = {"idempotency_key": head.idempotency_key}
                found = fetch_one(conn, Q["head_by_idempotency_key"], key)
                if found is not None:
                    return CreateResult(decode_head(str(found[0]), found[1]), created=False)
            check_key_free(conn, head.idempotency_key)  # a deleted run's key stays reserved
            try:
                conn.execute(Q["insert_run"], new_run)
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"a run with id {head.run_id} already exists") from exc
            conn.executemany(Q["insert_fact"], fact_rows)
            return CreateResult(head, created=True)

        return await self._write(work, flushing)

    async def find_by_idempotency_key(self, key: str) -> RunHead | None:
        """See ``RunStore.find_by_idempotency_key``: one trip to the reader's thread."""
        found = await self._read_with(_run_with_key, key)
        return None if found is None else decode_head(*found)

    async def load(self, run_id: str) -> RunHead:
        validate_run_id(run_id)
        rows = await self._read(Q["load_head"], {"run_id": run_id})
        if not rows:
            raise await self._gone(run_id)
        return decode_head(run_id, rows[0][0])

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
        """See ``RunStore.append``: one transaction, one trip to the writer's thread, holding the
        compare-and-swap update of the head — which also checks the lease's token (when fenced) and
        that the first fact follows the log's last one — and one insert per fact; committed with
        ``synchronous = FULL`` before it returns, ``flushing`` called when its statements ran and
        the ``COMMIT`` begins (see ``GroupCommit``). Only a refused update reads on, to tell which
        check refused it (in the order: lease, version, log)."""
        check_append(run_id, expected_version, facts, head, lease)
        row = head_row(head) | {"expected_version": expected_version, "previous_seq": facts[0].seq - 1}
        chain = moved_chain(facts)
        update = Q["update_head"]
        if lease is not None:
            row["token"] = lease.token
            update = Q["update_head_fenced"]
        fact_rows = [fact_row(run_id, f) for f in facts]

        def work(conn: sqlite3.Connection) -> RunHead:
            if conn.execute(update, row).rowcount != 1:
                raise _refused(conn, run_id, expected_version, facts[0].seq, lease)
            if chain is not None:
                conn.execute(Q["update_chain"], {"run_id": run_id, "chain": chain})
            try:
                conn.executemany(Q["insert_fact"], fact_rows)
            except sqlite3.IntegrityError as exc:
                seqs = ", ".join(str(f.seq) for f in facts)
                raise InvalidArgument(f"run {run_id} already has a fact numbered one of {seqs}") from exc
            return head

        return await self._write(work, flushing)

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        validate_run_id(run_id)
        params = {"run_id": run_id, "after_seq": after_seq, "limit": -1 if limit is None else limit}
        rows = await self._read_run(run_id, Q["read_facts"], params)
        return [decode_fact(run_id, int(seq), body) for seq, body in rows]

    async def read_fact(self, run_id: str, seq: int) -> Fact:
        validate_run_id(run_id)
        rows = await self._read_run(run_id, Q["read_fact"], {"run_id": run_id, "seq": seq})
        if not rows:
            raise FactNotFound(run_id, seq)
        return decode_fact(run_id, int(rows[0][0]), rows[0][1])

    async def list_runs(
        self,
        statuses: frozenset[RunStatus] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        """See ``RunStore.list_runs``: a keyset page read through ``runs_created`` (or
        ``runs_status_created``); it reads ``limit + 1`` rows, never the whole table."""
        after = decode_cursor(cursor) or (CURSOR_START_KEY, "")
        limit = max(limit, 0)
        params: dict[str, Any] = {"after_created": after[0], "after_run_id": after[1], "limit": limit + 1}
        if statuses:
            params["statuses"] = json.dumps(sorted(s.value for s in statuses))
            rows = await self._read(Q["list_runs_by_status"], params)
        else:
            rows = await self._read(Q["list_runs"], params)
        page_rows = rows[:limit]
        runs: list[RunHead] = []
        for run_id, _created, raw in page_rows:
            try:
                runs.append(decode_head(run_id, raw))
            except CorruptRecord as exc:  # RecordTooNew too: a newer version's run is left to it
                log.warning(
                    "unreadable run skipped in list: %s",
                    exc,
                    extra={"action": "store.list_skipped_corrupt", "run_id": run_id, "code": exc.code},
                )
        more = len(rows) > limit
        next_cursor = cursor_for_key(page_rows[-1][1], page_rows[-1][0]) if more and page_rows else None
        return RunPage(runs, next_cursor)

    async def runnable(self, now: datetime, limit: int = 100) -> list[str]:
        rows = await self._read(Q["runnable"], {"now": sortable_time(now), "limit": limit})
        return [str(row[0]) for row in rows]

    async def claim_lease(self, run_id: str, owner: str, ttl_seconds: float, now: datetime) -> Lease | None:
        validate_run_id(run_id)
        expires_at = now + timedelta(seconds=ttl_seconds)

        def work(conn: sqlite3.Connection) -> Lease | None:
            if fetch_one(conn, Q["run_version"], {"run_id": run_id}) is None:
                raise missing(conn, run_id)
            return _claim(conn, run_id, owner, now, expires_at)

        return await self._write(work)

    async def renew_lease(self, lease: Lease, ttl_seconds: float, now: datetime) -> Lease:
        renewed = Lease(lease.run_id, lease.owner, now + timedelta(seconds=ttl_seconds), lease.token)

        params = {
            "run_id": lease.run_id,
            "token": lease.token,
            "expires_at": sortable_time(renewed.expires_at),
        }

        def work(conn: sqlite3.Connection) -> Lease:
            if conn.execute(Q["renew_lease"], params).rowcount != 1:
                raise lease_lost(lease)
            return renewed

        return await self._write(work)

    async def renew_leases(
        self, leases: Sequence[Lease], ttl_seconds: float, now: datetime
    ) -> dict[str, Lease | None]:
        """See ``RunStore.renew_leases``: one ``UPDATE`` for all of them (their ids and tokens
        passed as one JSON array), in one write transaction."""
        if not leases:
            return {}
        expires_at = now + timedelta(seconds=ttl_seconds)
        params = {
            "leases": json.dumps([[lease.run_id, lease.token] for lease in leases]),
            "expires_at": sortable_time(expires_at),
        }

        def work(conn: sqlite3.Connection) -> set[str]:
            return {str(row[0]) for row in fetch_all(conn, Q["renew_leases"], params)}

        kept = await self._write(work)
        return {
            lease.run_id: Lease(lease.run_id, lease.owner, expires_at, lease.token)
            if lease.run_id in kept
            else None
            for lease in leases
        }

    async def versions(self, run_ids: Sequence[str]) -> dict[str, int]:
        """See ``RunStore.versions``: one ``SELECT`` (the ids passed as one JSON array)."""
        for run_id in run_ids:
            validate_run_id(run_id)
        if not run_ids:
            return {}
        rows = await self._read(Q["run_versions"], {"run_ids": json.dumps(list(run_ids))})
        return {str(row[0]): int(row[1]) for row in rows}

    async def lease_of(self, run_id: str) -> Lease | None:
        """``ReadsLeases`` (:mod:`orchestration.store`): one ``SELECT`` of the run's lease row."""
        validate_run_id(run_id)
        rows = await self._read(Q["lease_of"], {"run_id": run_id})
        if not rows:
            return None
        owner, expires_at, token = rows[0]
        return Lease(run_id, str(owner), datetime.fromisoformat(str(expires_at)), str(token))

    async def release_lease(self, lease: Lease) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(Q["release_lease"], {"run_id": lease.run_id, "token": lease.token})

        await self._write(work)

    async def claim_runnable(
        self, owner: str, ttl_seconds: float, now: datetime, limit: int = 10
    ) -> list[Lease]:
        """``ClaimsRunnable`` (:mod:`orchestration.store`): claim up to ``limit`` runnable runs (as
        :meth:`runnable` defines them) whose lease is free or expired, oldest first, in one
        transaction; runs ``owner`` already holds are not returned again. Each lease gets a new
        token (see ``RunStore.claim_lease``). Of two concurrent claimers, in this or another
        process, no two get the same run: ``BEGIN IMMEDIATE`` serializes them."""
        expires_at = now + timedelta(seconds=ttl_seconds)

        def work(conn: sqlite3.Connection) -> list[Lease]:
            rows = fetch_all(conn, Q["claim_runnable"], {"now": sortable_time(now), "limit": limit})
            leases: list[Lease] = []
            for (run_id,) in rows:
                lease = _claim(conn, str(run_id), owner, now, expires_at)
                if lease is not None:
                    leases.append(lease)
            return leases

        return await self._write(work)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Wait for the writes queued or in flight, so that their commits are not cut off.
        with anyio.CancelScope(shield=True), _translated(self._where):
            await self._writes.drain()
            for conn in (self._reader, self._writer):
                await conn.close()


def _run_with_key(conn: sqlite3.Connection, key: str) -> tuple[str, str] | None:
    """The run id and stored head of the run holding idempotency key ``key``, or None; the
    tombstone's error when the key was a deleted run's."""
    found = fetch_one(conn, Q["head_by_idempotency_key"], {"idempotency_key": key})
    if found is not None:
        return str(found[0]), found[1]
    check_key_free(conn, key)
    return None


def _rows_of_run(
    conn: sqlite3.Connection, run_id: str, sql: str, params: dict[str, Any]
) -> tuple[list[Any], bool]:
    """(On the reader's thread.) The rows of ``sql``, then whether the run still exists."""
    rows = fetch_all(conn, sql, params)
    return rows, fetch_one(conn, Q["run_version"], {"run_id": run_id}) is not None


def _refused(
    conn: sqlite3.Connection, run_id: str, expected_version: int, first_seq: int, lease: Lease | None
) -> ConstructError:
    """(In the append's transaction.) Why its update changed no row: the run is gone, the lease was
    lost, the version moved on, or the first fact does not follow the log's last one."""
    found = fetch_one(conn, Q["run_version"], {"run_id": run_id})
    if found is None:
        return missing(conn, run_id)
    if lease is not None:
        held = {"run_id": run_id, "token": lease.token}
        if fetch_one(conn, Q["lease_held"], held) is None:
            return lease_lost(lease)
    if int(found[0]) != expected_version:
        return VersionConflict(run_id, expected_version, int(found[0]))
    return not_continuing(run_id, first_seq)


def _claim(
    conn: sqlite3.Connection, run_id: str, owner: str, now: datetime, expires_at: datetime
) -> Lease | None:
    token = new_lease_token()
    params = {
        "run_id": run_id,
        "owner": owner,
        "now": sortable_time(now),
        "expires_at": sortable_time(expires_at),
        "token": token,
    }
    claimed = fetch_one(conn, Q["claim_lease"], params)
    return Lease(run_id, owner, expires_at, token) if claimed is not None else None

"""The PostgreSQL ``RunStore`` (asyncpg): the store several server processes share.

Every write is one transaction, an append one statement: the compare-and-swap on the run row's
version, with the lease fence (the claim's token, kept on the run row) in the same WHERE. Claims
take batches with ``FOR NO KEY UPDATE SKIP LOCKED``; ``LISTEN/NOTIFY`` wakes other processes'
dispatchers. The schema is never changed here, only checked at open. Driver errors become
``StoreUnavailable`` or ``StoreError``, with any password scrubbed; U+0000 is escaped in stored JSON.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import anyio
import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information

from orchestration.core import RECORD_FORMAT, Fact, RunHead, RunStatus, validate_run_id
from orchestration.errors import (
    Conflict,
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
    sent,
    sortable_time,
)
from stores._jsonb import from_jsonb_text, to_jsonb_text
from stores._lease import lease_lost
from stores._migrations import MigrationReport, check_schema, run_migrations
from stores._postgres_pool import ConnectionPool, PooledConnection, translated
from stores._postgres_retention import PostgresRetention, gone_by_key, missing, refused_by_tombstone
from stores._postgres_rows import fact_columns, head_values, run_values, utc
from stores._sql import (
    CURSOR_START_KEY,
    SCHEMA_NAME,
    Dialect,
    Migration,
    cursor_for_key,
    decode_fact,
    decode_head,
    parse_sortable_time,
    queries,
)
from stores._sql_versions import PostgresChainVersions
from stores._urls import redact_url

log = logging.getLogger(__name__)

Q = queries("postgres")

#: The statuses of the runs not ended (the ones a server may yet drive).
_LIVE_STATUSES = sorted(status.value for status in RunStatus if not status.is_terminal)

#: The NOTIFY channel for the default schema; a store in schema ``s`` uses ``construct_runs_s`` so
#: that stores sharing a database but not a schema do not wake each other.
CHANNEL = "construct_runs"


def channel_for(schema: str) -> str:
    return CHANNEL if schema == "public" else f"{CHANNEL}_{schema}"


def _connect_kwargs(schema: str, connect_timeout: float) -> dict[str, Any]:
    return {
        "timeout": connect_timeout,
        "server_settings": {"search_path": schema, "application_name": "construct-mcp"},
    }


class _PostgresTarget:
    """:class:`stores._migrations.MigrationTarget` over one connection."""

    dialect: Dialect = "postgres"

    def __init__(self, conn: Any, schema: str) -> None:
        self._conn = conn
        self._schema = schema

    async def current_version(self) -> int:
        if not await self._conn.fetchval(Q["migrations_table_exists"]):
            return 0
        return int(await self._conn.fetchval(Q["schema_version"]))

    async def apply(self, migration: Migration) -> bool:
        async with self._conn.transaction():
            await self._conn.execute(Q["schema_lock"], self._schema)
            await self._conn.execute(Q["create_migrations_table"])
            current = await self.current_version()
            if current >= migration.version:
                return False
            if current != migration.version - 1:
                raise StoreError(
                    f"cannot apply {migration.name}: the schema is at version {current}, "
                    f"not {migration.version - 1}"
                )
            # No arguments: asyncpg sends the file with the simple protocol, several statements at once.
            await self._conn.execute(migration.sql)
            await self._conn.execute(Q["record_migration"], migration.version, migration.name)
            return True


async def migrate_postgres(
    dsn: str,
    *,
    schema: str = "public",
    check_only: bool = False,
    migrations: Sequence[Migration] | None = None,
    connect_timeout: float = 10.0,
) -> MigrationReport:
    """:func:`stores.migrate` for a PostgreSQL database (creates ``schema`` unless
    ``check_only``)."""
    if not SCHEMA_NAME.fullmatch(schema):
        raise InvalidArgument(
            f"schema {schema[:70]!r} must be a lowercase SQL identifier of at most 48 characters"
        )
    display = _display(dsn, schema)
    with translated(f"postgres store {display}", dsn):
        conn = await asyncpg.connect(dsn, **_connect_kwargs(schema, connect_timeout))
        try:
            if not check_only:
                async with conn.transaction():
                    await conn.execute(Q["schema_lock"], schema)
                    await conn.execute(await conn.fetchval(Q["create_schema_statement"], schema))
            return await run_migrations(
                _PostgresTarget(conn, schema),
                store=display,
                backend="postgres",
                check_only=check_only,
                migrations=migrations,
            )
        finally:
            await conn.close()


async def _initialize_if_empty(conn: Any, schema: str, display: str) -> bool:
    """Create the schema and apply every migration when ``schema`` has nothing in it (a fresh
    database: nothing to lose); True when it did. A schema with anything in it is left as it is: one
    that is behind still needs ``construct-mcp migrate``. Two processes opening one fresh database at
    once apply each migration once (the migration lock)."""
    await conn.execute(Q["initialize_lock"], schema)
    try:
        if await conn.fetchval(Q["schema_has_tables"], schema):
            return False
        async with conn.transaction():
            await conn.execute(Q["schema_lock"], schema)
            await conn.execute(await conn.fetchval(Q["create_schema_statement"], schema))
        report = await run_migrations(_PostgresTarget(conn, schema), store=display, backend="postgres")
    finally:
        await conn.execute(Q["initialize_unlock"], schema)
    log.info(
        "initialized the empty postgres schema %s at version %d",
        display,
        report.to_version,
        extra={"action": "store_initialized"},
    )
    return bool(report.applied)


async def _say_runs_need_newer(conn: Any, where: str, reads_format: int) -> None:
    """One warning when live runs state a record format newer than ``reads_format``: a store
    opened with it leaves them to a newer server (:meth:`PostgresStore.open`)."""
    newer = await conn.fetchval(Q["runs_need_newer"], _LIVE_STATUSES, reads_format)
    if newer:
        log.warning(
            "live runs left to a newer server: %d (their record format is newer than %d, "
            "the newest this server claims)",
            newer,
            reads_format,
            extra={
                "action": "store.runs_need_newer",
                "store": where,
                "count": newer,
                "reads_format": reads_format,
            },
        )


def _display(dsn: str, schema: str) -> str:
    shown = redact_url(dsn)
    return shown if schema == "public" else f"{shown} (schema {schema})"


class PostgresStore(PostgresRetention, PostgresChainVersions):
    """A ``RunStore`` in a PostgreSQL database. Open with :meth:`open`; share one instance per
    process (it holds a pool) and any number of processes per database."""

    name = "postgres"

    def __init__(
        self,
        pool: Any,
        *,
        dsn: str,
        schema: str,
        connect_timeout: float,
        reads_format: int = RECORD_FORMAT,
    ) -> None:
        """Use :meth:`open`."""
        self.schema = schema
        #: the highest record format of the runs this store claims (see :meth:`open`)
        self.reads_format = reads_format
        #: whether :meth:`open` found the schema empty and created it (``construct-mcp`` says so)
        self.created = False
        self.channel = channel_for(schema)
        self._pool = pool
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self._where = f"postgres store {_display(dsn, schema)}"
        self._listener: Any = None
        # callback -> its on_lost hook (a dict keeps registration order and makes listen idempotent)
        self._callbacks: dict[Callable[[str], None], Callable[[], None] | None] = {}
        self._lost_once = False
        self._listen_lock = anyio.Lock()
        self._closed = False

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        schema: str = "public",
        connect_timeout: float = 5.0,
        min_size: int = 1,
        max_size: int = 10,
        reads_format: int = RECORD_FORMAT,
    ) -> PostgresStore:
        """Connect a pool to ``dsn`` (an asyncpg DSN without the ``schema`` parameter; see
        :func:`stores.parse_store_spec`) and check the schema.

        ``reads_format``: the highest record format of the runs this store hands out to drive
        (:meth:`runnable`, :meth:`claim_runnable`), by default the one this code reads. Servers of
        two versions share the database during a rolling deploy: an older one leaves the runs that
        need a newer one to the newer servers, and says at open, in one warning, how many live
        runs it leaves so. Nothing else depends on it: what this store can read (list, load) is
        what this code reads, ``RECORD_FORMAT``.

        Raises ``StoreUnavailable`` when the server cannot be reached within ``connect_timeout``
        seconds or refuses the login, :class:`stores.SchemaOutOfDate` when a migration is
        pending (``construct-mcp migrate``), ``InvalidArgument`` for a ``reads_format`` outside
        1..``RECORD_FORMAT``."""
        if not SCHEMA_NAME.fullmatch(schema):
            raise InvalidArgument(
                f"schema {schema[:70]!r} must be a lowercase SQL identifier of at most 48 characters"
            )
        if not 1 <= reads_format <= RECORD_FORMAT:
            raise InvalidArgument(
                f"reads_format {reads_format} must be between 1 and {RECORD_FORMAT}, "
                "the newest record format this code reads"
            )
        where = f"postgres store {_display(dsn, schema)}"
        with translated(where, dsn):
            # fail_after bounds the whole pool start, not only each connection attempt.
            kwargs = _connect_kwargs(schema, connect_timeout)
            with anyio.fail_after(connect_timeout * 2 + 1):
                pool = await ConnectionPool.open(
                    lambda: asyncpg.connect(dsn, **kwargs), min_size=min_size, max_size=max_size
                )
            try:
                async with pool.acquire() as conn:
                    created = await _initialize_if_empty(conn, schema, _display(dsn, schema))
                    await check_schema(_PostgresTarget(conn, schema), f"the {where}")
                    await _say_runs_need_newer(conn, where, reads_format)
            except BaseException:
                await pool.close()
                raise
        store = cls(pool, dsn=dsn, schema=schema, connect_timeout=connect_timeout, reads_format=reads_format)
        store.created = created
        return store

    # ----------------------------------------------------------------------------------------
    # plumbing

    def _connection(self) -> PooledConnection:
        """``async with``: a pooled connection, the driver's errors translated."""
        if self._closed:
            raise StoreUnavailable(f"the {self._where} is closed")
        return PooledConnection(self._pool, self._where, self._dsn)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Any]:
        async with self._connection() as conn, conn.transaction():
            yield conn

    async def _notify_if_runnable(self, conn: Any, head: RunHead) -> None:
        if head.status == RunStatus.QUEUED:
            await conn.execute(Q["notify_runnable"], self.channel, head.run_id)

    # ----------------------------------------------------------------------------------------
    # RunStore

    async def create(
        self, head: RunHead, facts: Sequence[Fact], *, flushing: Callable[[], None] | None = None
    ) -> CreateResult:
        """See ``RunStore.create``. One statement (one round trip), which checks the key's
        tombstones after its insert when the run has an idempotency key (migration 0012); a
        concurrent create with the same key waits for the first to commit and then returns its run
        (``created=False``, one more statement reads it). ``flushing``: once the statement is sent."""
        return await self._create(head, facts, announce=True, flushing=flushing)

    async def create_claimed(
        self, head: RunHead, facts: Sequence[Fact], owner: str, ttl_seconds: float, now: datetime
    ) -> tuple[CreateResult, Lease | None]:
        """See ``CreatesClaimed``: :meth:`create` without the notification, with a lease for
        ``owner`` written in the same statement (the run row carries its token, as a claim writes
        it). No lease when nothing was created."""
        lease = Lease(head.run_id, owner, now + timedelta(seconds=ttl_seconds), new_lease_token())
        result = await self._create(head, facts, announce=False, lease=lease)
        return result, lease if result.created else None

    async def _create(
        self,
        head: RunHead,
        facts: Sequence[Fact],
        *,
        announce: bool,
        lease: Lease | None = None,
        flushing: Callable[[], None] | None = None,
    ) -> CreateResult:
        validate_run_id(head.run_id)
        check_create(head, facts)
        values = (
            *run_values(head),
            *fact_columns(facts),
            self.channel,
            announce and head.status == RunStatus.QUEUED,
            *((None, None, None) if lease is None else (lease.token, lease.owner, utc(lease.expires_at))),
        )
        # One statement, one round trip (autocommit), with an idempotency key too: the statement
        # checks the key's tombstones after its insert (migration 0012, refused_by_tombstone).
        async with self._connection() as conn:
            try:
                inserted = await sent(conn.fetchval(Q["create_run"], *values), flushing)
            except asyncpg.PostgresError as exc:
                refused = refused_by_tombstone(exc)
                if refused is None:
                    raise
                raise refused from exc
            if not inserted and head.idempotency_key is not None:
                row = await conn.fetchrow(Q["head_by_idempotency_key"], head.idempotency_key)
                if row is not None:
                    return CreateResult(decode_head(row[0], from_jsonb_text(row[1])), created=False)
        if not inserted:
            raise Conflict(f"a run with id {head.run_id} already exists")
        return CreateResult(head, created=True)

    async def find_by_idempotency_key(self, key: str) -> RunHead | None:
        """See ``RunStore.find_by_idempotency_key``: the run, else the key's tombstone, in one
        statement."""
        async with self._connection() as conn:
            run_id, head, gone, body = await conn.fetchrow(Q["find_by_idempotency_key"], key)
        if run_id is not None:
            return decode_head(run_id, from_jsonb_text(head))
        if gone is not None:
            raise gone_by_key(gone, body)
        return None

    async def load(self, run_id: str) -> RunHead:
        validate_run_id(run_id)
        async with self._connection() as conn:
            raw = await conn.fetchval(Q["load_head"], run_id)
        if raw is None:
            raise await self._gone(run_id)
        return decode_head(run_id, from_jsonb_text(raw))

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
        """See ``RunStore.append``: one statement, so one round trip, committed by autocommit's
        implicit transaction (the compare-and-swap, the lease fence on the run row's token, the
        insert of all facts, a notify when the run is left ``queued``: the ``append`` query says
        how). When it writes nothing, a second query reads why, and each reason keeps its own
        error: ``RunNotFound`` (or the run's tombstone), ``LeaseLost`` (also when the version moved
        too), ``VersionConflict``, or the facts not continuing the log. That reading comes after the
        refusal, so it may see a later state than the one that refused the write (a claim committed
        since): it then names the later reason, which is as true, and nothing was written either
        way."""
        check_append(run_id, expected_version, facts, head, lease)
        follows = facts[0].seq - 1
        async with self._connection() as conn:
            try:
                row = await self._appended(conn, run_id, expected_version, facts, head, lease, flushing)
            except asyncpg.UniqueViolationError as exc:
                seqs = ", ".join(str(f.seq) for f in facts)
                raise InvalidArgument(f"run {run_id} already has a fact numbered one of {seqs}") from exc
            inserted = row[0]
            if inserted == len(facts):
                return head
            if inserted:  # pragma: no cover - the update and the insert go together
                raise StoreError(f"{self._where}: run {run_id}: {inserted} of {len(facts)} facts written")
            refused = await conn.fetchrow(Q["append_refused"], run_id, follows)
            if refused is None:
                raise await missing(conn, run_id)  # its tombstone's error (pruned, moved), else not found
        actual, token, continues = int(refused[0]), refused[1], refused[2]
        if lease is not None and token != lease.token:
            raise lease_lost(lease)
        if actual != expected_version:
            raise VersionConflict(run_id, expected_version, actual)
        if not continues:
            raise not_continuing(run_id, follows + 1)
        # Refused, and yet every condition holds now: the run moved and came back to this version
        # between the two reads (only another writer's appends move it, and they raise it).
        raise VersionConflict(run_id, expected_version, actual)

    async def _appended(
        self,
        conn: Any,
        run_id: str,
        expected_version: int,
        facts: Sequence[Fact],
        head: RunHead,
        lease: Lease | None,
        flushing: Callable[[], None] | None,
    ) -> Any:
        """The ``append`` query's row (how many facts it inserted). An append that moves the run
        to another chain writes that chain too, in one transaction with it (every other append
        leaves the chain column as it is, and is the one statement alone)."""

        async def appended() -> Any:
            return await sent(
                conn.fetchrow(
                    Q["append"],
                    run_id,
                    expected_version,
                    *head_values(head),
                    lease.token if lease is not None else None,
                    *fact_columns(facts),
                    facts[0].seq - 1,
                    self.channel,
                ),
                flushing,
            )

        moved = moved_chain(facts)
        if moved is None:
            return await appended()
        async with conn.transaction():
            row = await appended()
            if row[0] == len(facts):
                await conn.execute(Q["update_chain"], run_id, to_jsonb_text(moved))
            return row

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        validate_run_id(run_id)
        async with self._connection() as conn:
            rows = await conn.fetch(Q["read_facts"], run_id, after_seq, limit)
            # Checked after the read: a run deleted meanwhile is its tombstone error, never part of it.
            if await conn.fetchval(Q["run_version"], run_id) is None:
                raise await missing(conn, run_id)
        return [decode_fact(run_id, int(row[0]), from_jsonb_text(row[1])) for row in rows]

    async def read_fact(self, run_id: str, seq: int) -> Fact:
        validate_run_id(run_id)
        async with self._connection() as conn:
            row = await conn.fetchrow(Q["read_fact"], run_id, seq)
            if await conn.fetchval(Q["run_version"], run_id) is None:
                raise await missing(conn, run_id)
        if row is None:
            raise FactNotFound(run_id, seq)
        return decode_fact(run_id, int(row[0]), from_jsonb_text(row[1]))

    async def list_runs(
        self,
        statuses: frozenset[RunStatus] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        """See ``RunStore.list_runs``: a keyset page read through ``runs_created`` (or
        ``runs_status_created``); it reads ``limit + 1`` rows, never the whole table."""
        after = decode_cursor(cursor) or (CURSOR_START_KEY, "")
        after_at = parse_sortable_time(after[0], cursor or "")
        limit = max(limit, 0)
        async with self._connection() as conn:
            if statuses:
                rows = await conn.fetch(
                    Q["list_runs_by_status"], after_at, after[1], limit + 1, sorted(s.value for s in statuses)
                )
            else:
                rows = await conn.fetch(Q["list_runs"], after_at, after[1], limit + 1)
        page_rows = rows[:limit]
        runs: list[RunHead] = []
        for run_id, _created, raw in page_rows:
            try:
                runs.append(decode_head(run_id, from_jsonb_text(raw)))
            except CorruptRecord as exc:  # RecordTooNew too: a newer version's run is left to it
                log.warning(
                    "unreadable run skipped in list: %s",
                    exc,
                    extra={"action": "store.list_skipped_corrupt", "run_id": run_id, "code": exc.code},
                )
        next_cursor = None
        if len(rows) > limit and page_rows:
            last_id, last_created, _ = page_rows[-1]
            next_cursor = cursor_for_key(sortable_time(last_created), last_id)
        return RunPage(runs, next_cursor)

    async def runnable(self, now: datetime, limit: int = 100) -> list[str]:
        """See ``RunStore.runnable``: of the runs this store reads (``reads_format``, :meth:`open`)."""
        async with self._connection() as conn:
            rows = await conn.fetch(Q["runnable"], utc(now), limit, self.reads_format)
        return [str(row[0]) for row in rows]

    async def claim_lease(self, run_id: str, owner: str, ttl_seconds: float, now: datetime) -> Lease | None:
        validate_run_id(run_id)
        expires_at = now + timedelta(seconds=ttl_seconds)
        token = new_lease_token()
        async with self._connection() as conn:
            found, claimed = await conn.fetchrow(
                Q["claim_lease"], run_id, owner, utc(expires_at), utc(now), token
            )
            if not found:
                raise await missing(conn, run_id)
        return Lease(run_id, owner, expires_at, token) if claimed else None

    async def renew_lease(self, lease: Lease, ttl_seconds: float, now: datetime) -> Lease:
        renewed = Lease(lease.run_id, lease.owner, now + timedelta(seconds=ttl_seconds), lease.token)
        async with self._connection() as conn:
            kept = await conn.fetchval(Q["renew_lease"], lease.run_id, lease.token, utc(renewed.expires_at))
        if kept is None:
            raise lease_lost(lease)
        return renewed

    async def renew_leases(
        self, leases: Sequence[Lease], ttl_seconds: float, now: datetime
    ) -> dict[str, Lease | None]:
        """See ``RunStore.renew_leases``: one ``UPDATE ... FROM unnest(...)`` for all of them."""
        if not leases:
            return {}
        expires_at = now + timedelta(seconds=ttl_seconds)
        run_ids = [lease.run_id for lease in leases]
        tokens = [lease.token for lease in leases]
        async with self._connection() as conn:
            rows = await conn.fetch(Q["renew_leases"], run_ids, tokens, utc(expires_at))
        kept = {str(row[0]) for row in rows}
        return {
            lease.run_id: Lease(lease.run_id, lease.owner, expires_at, lease.token)
            if lease.run_id in kept
            else None
            for lease in leases
        }

    async def versions(self, run_ids: Sequence[str]) -> dict[str, int]:
        """See ``RunStore.versions``: one ``SELECT ... WHERE run_id = ANY(...)`` (the primary key)."""
        for run_id in run_ids:
            validate_run_id(run_id)
        if not run_ids:
            return {}
        async with self._connection() as conn:
            rows = await conn.fetch(Q["run_versions"], list(run_ids))
        return {str(row[0]): int(row[1]) for row in rows}

    async def lease_of(self, run_id: str) -> Lease | None:
        """``ReadsLeases`` (:mod:`orchestration.store`): one ``SELECT`` of the run's lease row."""
        validate_run_id(run_id)
        async with self._connection() as conn:
            row = await conn.fetchrow(Q["lease_of"], run_id)
        if row is None:
            return None
        return Lease(run_id, str(row[0]), row[1], str(row[2]))

    async def release_lease(self, lease: Lease) -> None:
        async with self._connection() as conn:
            await conn.execute(Q["release_lease"], lease.run_id, lease.token, self.channel)

    async def claim_runnable(
        self, owner: str, ttl_seconds: float, now: datetime, limit: int = 10
    ) -> list[Lease]:
        """``ClaimsRunnable`` (:mod:`orchestration.store`): claim up to ``limit`` runnable runs (as
        :meth:`runnable` defines them) whose lease is free or expired, oldest first, in one
        statement; runs ``owner`` already holds are not returned again, nor runs of a record
        format newer than ``reads_format`` (:meth:`open`). Each lease gets a new
        token (see ``RunStore.claim_lease``). Concurrent claimers in any number of processes skip
        the runs another is claiming (``SKIP LOCKED``) and never get the same run."""
        expires_at = now + timedelta(seconds=ttl_seconds)
        async with self._connection() as conn:
            rows = await conn.fetch(
                Q["claim_runnable"], owner, utc(expires_at), utc(now), limit, self.reads_format
            )
        return [Lease(str(row[0]), owner, expires_at, str(row[1])) for row in rows]

    # ----------------------------------------------------------------------------------------
    # LISTEN / NOTIFY

    async def listen(
        self, callback: Callable[[str], None], on_lost: Callable[[], None] | None = None
    ) -> None:
        """Call ``callback(run_id)`` whenever any process commits a write that ``NotifiesRunnable``
        (:mod:`orchestration.store`) names: an announced new run, a write without a lease, the
        release of a lease on a run still due. Runs on the event
        loop; ``callback`` must not block. Uses one dedicated connection, opened by the first
        ``listen``.

        A hint, not a queue: nothing is replayed after the connection drops (the dispatcher keeps
        polling :meth:`runnable`). ``on_lost()`` is called when the connection drops, so that the
        subscriber can call ``listen`` again: that reconnects (and raises ``StoreUnavailable`` while
        the server is still away). Idempotent per ``callback``: listening again with a callback
        already registered only reconnects if needed."""
        async with self._listen_lock:
            if self._closed:
                raise StoreUnavailable(f"the {self._where} is closed")
            if self._listener is None or self._listener.is_closed():
                with translated(self._where, self._dsn):
                    conn = await asyncpg.connect(
                        self._dsn, **_connect_kwargs(self.schema, self._connect_timeout)
                    )
                    try:
                        await conn.add_listener(self.channel, self._on_notification)
                    except BaseException:
                        await conn.close()
                        raise
                    conn.add_termination_listener(self._on_listener_lost)
                self._listener = conn
                if self._lost_once:
                    log.info(
                        "notification connection re-established",
                        extra={"action": "store.listen_restored", "store": self._where},
                    )
            self._callbacks[callback] = on_lost

    @property
    def listening(self) -> bool:
        """Whether the notification connection is up (``listen`` was called and it has not dropped)."""
        return self._listener is not None and not self._listener.is_closed()

    async def unlisten(self, callback: Callable[[str], None]) -> None:
        """Stop calling ``callback``; the connection closes with the last listener."""
        async with self._listen_lock:
            self._callbacks.pop(callback, None)
            if not self._callbacks:
                await self._close_listener()

    def _on_notification(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        for callback in list(self._callbacks):
            try:
                callback(payload)
            except Exception:
                # One broken subscriber must not silence the others or the connection.
                log.exception("listener callback failed", extra={"action": "store.listen_callback_failed"})

    def _on_listener_lost(self, conn: Any) -> None:
        if self._closed or conn is not self._listener:
            return
        self._lost_once = True
        log.warning(
            "notification connection lost; wake-ups pause until the next listen()",
            extra={"action": "store.listen_lost", "store": self._where},
        )
        for on_lost in list(self._callbacks.values()):
            if on_lost is None:
                continue
            try:
                on_lost()
            except Exception:
                log.exception("on_lost callback failed", extra={"action": "store.listen_callback_failed"})

    async def _close_listener(self) -> None:
        conn, self._listener = self._listener, None
        if conn is not None and not conn.is_closed():
            with translated(self._where, self._dsn):
                await conn.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._listen_lock:
            self._callbacks.clear()
            await self._close_listener()
        with translated(self._where, self._dsn):
            await self._pool.close()

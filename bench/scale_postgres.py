"""What ``bench/scale.py`` reads of PostgreSQL while the servers run: a throwaway database of its
own (so that the database-wide counters count only the bench's servers, not the other users of the
cluster), the counters of ``pg_stat_database`` and ``pg_stat_user_tables``, statements seen
starting in ``pg_stat_activity``, and the CPU time of the postgres processes from ``/proc``.

``pg_stat_database`` (PostgreSQL 15 and later) is fed by each backend at most once a second, and an
idle backend holds what it has not reported for up to 10 s: a window of a few seconds after a busy
phase may count some of that phase. Sampling ``pg_stat_activity`` (where a backend's
``query_start`` moves at every statement, at once) sees the statements themselves, one per backend
per sample at most: exact at the low rates of a steady state. The bench prints both.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg  # type: ignore[import-untyped]

from bench.harness import cpu_seconds

#: the application name every construct-mcp store connection sets
APPLICATION = "construct-mcp"


def with_database(dsn: str, database: str) -> str:
    """``dsn`` (a ``postgresql://`` URL) naming ``database`` instead of its own."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


@dataclass(frozen=True)
class BenchDatabase:
    #: the DSN of the throwaway database, and of the database it was created from (for the
    #: cluster-wide views, read from there so that the reads are not counted in ours)
    dsn: str
    admin_dsn: str
    name: str


async def _execute(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@asynccontextmanager
async def bench_database(admin_dsn: str) -> AsyncIterator[BenchDatabase]:
    """A fresh database, dropped (with whatever is still connected to it) on exit."""
    name = f"construct_bench_{os.getpid()}_{secrets.token_hex(3)}"
    await _execute(admin_dsn, f'CREATE DATABASE "{name}"')  # a name of ours: safe to inline
    try:
        yield BenchDatabase(with_database(admin_dsn, name), admin_dsn, name)
    finally:
        await _execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def connection_room(admin_dsn: str) -> tuple[int, int]:
    """(``max_connections`` less the superuser reserve, connections open now)."""
    conn = await asyncpg.connect(admin_dsn, timeout=10)
    try:
        most = int(await conn.fetchval("SHOW max_connections"))
        reserved = int(await conn.fetchval("SHOW superuser_reserved_connections"))
        used = int(
            await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
        )
    finally:
        await conn.close()
    return most - reserved, used


@dataclass(frozen=True)
class Counters:
    """``pg_stat_database`` and ``pg_stat_user_tables`` of the bench database at one moment."""

    at: float
    transactions: int
    row_writes: int

    def rates(self, later: Counters) -> tuple[float, float]:
        """(transactions/s, row writes/s) from this reading to ``later``."""
        seconds = later.at - self.at
        return (later.transactions - self.transactions) / seconds, (
            later.row_writes - self.row_writes
        ) / seconds


class Observer:
    """Two connections: one to the database the bench started from (the cluster-wide views), one
    to the bench database (its tables' counters, the runs' statuses)."""

    def __init__(self, db: BenchDatabase, admin: Any, own: Any) -> None:
        self.db = db
        self._admin = admin
        self._own = own

    @classmethod
    @asynccontextmanager
    async def opened(cls, db: BenchDatabase) -> AsyncIterator[Observer]:
        admin = await asyncpg.connect(db.admin_dsn, timeout=10)
        try:
            own = await asyncpg.connect(db.dsn, timeout=10)
            try:
                yield cls(db, admin, own)
            finally:
                await own.close()
        finally:
            await admin.close()

    async def counters(self, schema: str) -> Counters:
        await self._admin.execute("SELECT pg_stat_clear_snapshot()")
        transactions = await self._admin.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", self.db.name
        )
        await self._own.execute("SELECT pg_stat_clear_snapshot()")
        writes = await self._own.fetchval(
            "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables "
            "WHERE schemaname = $1",
            schema,
        )
        return Counters(anyio.current_time(), int(transactions), int(writes))

    async def count_runs(self, schema: str, statuses: list[str]) -> int:
        # The schema is one of ours (tests/stores/sql_adapters.new_schema_name): safe to inline.
        value = await self._own.fetchval(
            f'SELECT count(*) FROM "{schema}".runs WHERE status = ANY($1::text[])', statuses
        )
        return int(value)

    async def backend_pids(self) -> set[int]:
        rows = await self._admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
            self.db.name,
            APPLICATION,
        )
        return {int(row[0]) for row in rows}

    async def sample_statements(self, seconds: float, every: float = 0.02) -> int:
        """Statements the servers' backends started during ``seconds`` (a backend's
        ``query_start`` moves at each), sampled every ``every`` seconds."""
        last: dict[int, Any] = {}
        started = 0
        deadline = anyio.current_time() + seconds
        first = True
        while anyio.current_time() < deadline:
            rows = await self._admin.fetch(
                "SELECT pid, query_start FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
                self.db.name,
                APPLICATION,
            )
            for pid, query_start in rows:
                if not first and query_start is not None and last.get(pid) != query_start:
                    started += 1
                last[pid] = query_start
            first = False
            await anyio.sleep(every)
        return started


# ---------------------------------------------------------------------------------------- /proc


def cpu_seconds_or_none(pid: int) -> float | None:
    """utime + stime of process ``pid`` (Linux), None when it is gone."""
    try:
        return cpu_seconds(pid)
    except OSError:
        return None


def postgres_pids() -> set[int]:
    """Every process named ``postgres`` on this machine (the whole cluster)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


def cpu_of(pids: set[int]) -> dict[int, float]:
    return {pid: s for pid in pids if (s := cpu_seconds_or_none(pid)) is not None}


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the processes spent between two readings (one started since counts whole; one
    that ended since is lost, its time with it)."""
    return sum(s - before.get(pid, 0.0) for pid, s in after.items())

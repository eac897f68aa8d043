"""``wake_at`` in the SQL stores: migration 0002 adds the column and backfills it from the heads that
were written before it, and the optional ``claim_runnable`` capability hands out due runs exactly as
``runnable`` lists them (the conformance suite covers ``runnable`` itself on every adapter)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.core.models import RunHead
from orchestration.store import Lease
from stores import migrate, open_store, parse_store_spec
from stores._common import sortable_time
from stores._sql import Dialect, migrations
from tests.stores.builders import (
    BASE_TIME,
    Write,
    cancel,
    fail_attempt,
    new_run,
    request_approval,
    run_id,
)
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url

DEADLINE = BASE_TIME + timedelta(hours=1, microseconds=123450)


class ClaimingStore(Protocol):
    async def create(self, head: RunHead, facts: Any) -> Any: ...
    async def append(self, run_id: str, expected_version: int, facts: Any, head: RunHead) -> RunHead: ...
    async def runnable(self, now: datetime, limit: int = 100) -> list[str]: ...
    async def claim_runnable(
        self, owner: str, ttl_seconds: float, now: datetime, limit: int = 10
    ) -> list[Lease]: ...
    async def close(self) -> None: ...


@dataclass
class Target:
    dialect: Dialect
    url: str
    home: Path

    async def execute(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        spec = parse_store_spec(self.url, home=self.home)
        if self.dialect == "sqlite":
            assert spec.path is not None
            conn = sqlite3.connect(spec.path)
            try:
                with conn:
                    return [tuple(r) for r in conn.execute(sql.replace("$", ":p"), _named(args))]
            finally:
                conn.close()
        pg = await asyncpg.connect(spec.dsn, server_settings={"search_path": spec.schema})
        try:
            return [tuple(r) for r in await pg.fetch(sql, *args)]
        finally:
            await pg.close()


def _named(args: tuple[Any, ...]) -> dict[str, Any]:
    return {f"p{n}": value for n, value in enumerate(args, start=1)}


@pytest.fixture(params=["sqlite", "postgres"])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    if request.param == "sqlite":
        yield Target("sqlite", "sqlite:///construct.db", tmp_path)
        return
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        yield Target("postgres", schema_url(dsn, schema), tmp_path)


async def _open(target: Target) -> ClaimingStore:
    store: Any = await open_store(target.url, home=target.home)
    return store  # type: ignore[no-any-return]


async def _commit(store: ClaimingStore, write: Write) -> RunHead:
    return await store.append(write.head.run_id, write.expected_version, write.facts, write.head)


async def _paused_runs(store: ClaimingStore) -> None:
    """1: awaiting approval with a deadline; 2: waiting for a retry past the deadline; 3: cancelled
    (terminal, never wakes); 4: awaiting approval without any deadline."""
    for n in (1, 2, 3):
        head, facts = new_run(run_id(n), at=BASE_TIME + timedelta(seconds=n), deadline_at=DEADLINE)
        await store.create(head, facts)
        if n == 1:
            await _commit(store, request_approval(head))
        elif n == 2:
            await _commit(store, fail_attempt(head, DEADLINE + timedelta(hours=1)))
        else:
            await _commit(store, cancel(head))
    head, facts = new_run(run_id(4), at=BASE_TIME + timedelta(seconds=4))
    await store.create(head, facts)
    await _commit(store, request_approval(head))


async def test_claim_runnable_hands_out_runs_whose_deadline_passed(target: Target) -> None:
    await migrate(target.url, home=target.home)
    store = await _open(target)
    try:
        await _paused_runs(store)
        early = DEADLINE - timedelta(microseconds=1)
        assert await store.claim_runnable("w1", 30, early) == []
        claimed = await store.claim_runnable("w1", 30, DEADLINE)
        assert [lease.run_id for lease in claimed] == [run_id(1), run_id(2)]
        # Held: not handed out again, to anyone, until the lease expires.
        assert await store.claim_runnable("w2", 30, DEADLINE) == []
        later = DEADLINE + timedelta(seconds=30)
        assert [lease.run_id for lease in await store.claim_runnable("w2", 30, later)] == [
            run_id(1),
            run_id(2),
        ]
    finally:
        await store.close()


async def test_a_terminal_head_never_stores_a_wake_at(target: Target) -> None:
    await migrate(target.url, home=target.home)
    store = await _open(target)
    try:
        await _paused_runs(store)
    finally:
        await store.close()
    rows = dict(await target.execute("SELECT run_id, wake_at FROM runs"))
    assert rows[run_id(3)] is None and rows[run_id(4)] is None
    assert rows[run_id(1)] is not None and rows[run_id(2)] is not None


async def test_migration_0002_backfills_wake_at_from_the_heads(target: Target) -> None:
    first = migrations(target.dialect)[0]
    await migrate(target.url, home=target.home, migrations=[first])
    # Rows as the 0001 schema held them: no wake_at column, the deadline only inside the head JSON.
    # Both forms pydantic writes: with microseconds ('...00.123450Z') and without ('...00Z').
    whole = BASE_TIME + timedelta(hours=2)
    heads: list[RunHead] = []
    for n in (1, 2, 3):
        deadline = whole if n == 2 else DEADLINE
        head, _ = new_run(run_id(n), at=BASE_TIME + timedelta(seconds=n), deadline_at=deadline)
        write = request_approval(head) if n != 3 else cancel(head)
        heads.append(write.head)
    for head in heads:
        created = _time_value(target, head.created_at)
        cast = "::jsonb" if target.dialect == "postgres" else ""
        await target.execute(
            "INSERT INTO runs (run_id, version, status, created_at, updated_at, head) "
            f"VALUES ($1, $2, $3, $4, $5, $6{cast})",
            head.run_id,
            head.version,
            head.status.value,
            created,
            created,
            head.model_dump_json(),
        )
    await migrate(target.url, home=target.home)

    rows = dict(await target.execute("SELECT run_id, wake_at FROM runs"))
    assert rows == {
        run_id(1): _time_value(target, DEADLINE),
        run_id(2): _time_value(target, whole),
        run_id(3): None,
    }
    store = await _open(target)
    try:
        assert await store.runnable(DEADLINE - timedelta(microseconds=1)) == []
        assert await store.runnable(DEADLINE) == [run_id(1)]
        assert await store.runnable(whole) == [run_id(1), run_id(2)]
    finally:
        await store.close()


def _time_value(target: Target, at: datetime) -> Any:
    return sortable_time(at) if target.dialect == "sqlite" else at

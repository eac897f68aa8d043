"""The postgres store's own connection pool (stores/_postgres_pool.py, issue 11): a connection is
reused only in a clean state, at most ``max_size`` are open, and a waiter always gets one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.errors import StoreError, StoreUnavailable
from stores import migrate, parse_store_spec
from stores._postgres_pool import ConnectionPool
from stores.postgres import PostgresStore
from tests.stores.builders import new_run, run_id
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url

pytestmark = pytest.mark.postgres


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[PostgresStore]:
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        await migrate(schema_url(dsn, schema), home=tmp_path)
        opened = await PostgresStore.open(parse_store_spec(dsn, home=tmp_path).dsn or dsn, schema=schema)
        try:
            yield opened
        finally:
            await opened.close()


@pytest.fixture
async def pool() -> AsyncIterator[ConnectionPool]:
    dsn = await postgres_dsn()
    opened = await ConnectionPool.open(lambda: asyncpg.connect(dsn), min_size=1, max_size=2)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_released_connection_is_reused_and_a_failed_statement_keeps_it(pool: ConnectionPool) -> None:
    async with pool.acquire() as conn:
        first = conn
    async with pool.acquire() as conn:
        assert conn is first
    with pytest.raises(asyncpg.PostgresError):
        async with pool.acquire() as conn:
            await conn.execute("SELECT 1 / 0")
    async with pool.acquire() as conn:
        assert conn is first
        assert await conn.fetchval("SELECT 1") == 1
    assert pool.size == 1


async def test_a_cancelled_query_or_a_dead_connection_is_not_reused(pool: ConnectionPool) -> None:
    async with pool.acquire() as conn:
        first = conn
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2), pool.acquire() as conn:
            await conn.execute("SELECT pg_sleep(5)")
    assert first.is_closed()
    async with pool.acquire() as conn:
        assert conn is not first
        second = conn
        assert await conn.fetchval("SELECT 1") == 1
    # A connection whose session the server ended (as a restart does) is dropped, not handed out.
    async with pool.acquire() as conn:
        killer = await asyncpg.connect(await postgres_dsn())
        try:
            await killer.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())
        finally:
            await killer.close()
    await asyncio.sleep(0.1)
    # Noticed closed while idle (the server said goodbye): not handed out. Otherwise its first
    # statement fails, and it is dropped then.
    try:
        async with pool.acquire() as conn:
            await conn.fetchval("SELECT 1")
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        assert conn is second
    else:
        assert conn is not second
    async with pool.acquire() as conn:
        assert conn is not second
        assert await conn.fetchval("SELECT 1") == 1
    assert pool.size == 1


async def test_a_connection_left_in_a_transaction_is_not_reused(pool: ConnectionPool) -> None:
    async with pool.acquire() as conn:
        first = conn
        await conn.execute("BEGIN")
    async with pool.acquire() as conn:
        assert conn is not first
        assert not conn.is_in_transaction()


async def test_get_and_put_keep_a_clean_connection_and_terminate_a_dirty_one(pool: ConnectionPool) -> None:
    """The public pair under ``acquire``: ``put(clean=True)`` keeps the connection for the next
    ``get``, ``put(clean=False)`` terminates it; ``max_size`` is what the pool was opened with."""
    assert pool.max_size == 2
    first = await pool.get()
    pool.put(first, clean=True)
    again = await pool.get()
    assert again is first and pool.size == 1
    pool.put(again, clean=False)
    assert first.is_closed() and pool.size == 0
    fresh = await pool.get()
    try:
        assert fresh is not first and await fresh.fetchval("SELECT 1") == 1
    finally:
        pool.put(fresh, clean=True)
    assert pool.size == 1


async def test_waiters_beyond_max_size_each_get_a_connection(pool: ConnectionPool) -> None:
    """Ten tasks on two connections: each gets one in turn, never more than two are open, and a
    waiter cancelled on the way does not swallow the wake-up meant for the others."""
    in_use = 0
    most = 0

    async def use() -> None:
        nonlocal in_use, most
        async with pool.acquire() as conn:
            in_use += 1
            most = max(most, in_use)
            try:
                await conn.fetchval("SELECT pg_sleep(0.01)")
            finally:
                in_use -= 1

    doomed = asyncio.ensure_future(use())
    tasks = [asyncio.ensure_future(use()) for _ in range(10)]
    await asyncio.sleep(0)
    doomed.cancel()
    async with asyncio.timeout(10):
        await asyncio.gather(*tasks)
    assert most == 2 and pool.size <= 2


async def test_a_closed_pool_refuses_and_closes_what_comes_back(pool: ConnectionPool) -> None:
    async with pool.acquire() as conn:
        await pool.close()
    assert conn.is_closed() and pool.size == 0
    with pytest.raises(asyncpg.InterfaceError):
        async with pool.acquire():
            pass


async def test_a_store_whose_connection_died_answers_store_unavailable_then_recovers(
    store: PostgresStore,
) -> None:
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    async with store._pool.acquire() as conn:
        pid = conn.get_server_pid()
    killer = await asyncpg.connect(await postgres_dsn())
    try:
        await killer.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        await killer.close()
    await asyncio.sleep(0.1)
    try:
        assert await store.load(run_id(1)) == head  # the dead connection was noticed and dropped
    except (StoreUnavailable, StoreError):
        assert await store.load(run_id(1)) == head  # or its failure dropped it

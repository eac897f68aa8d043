"""What stores/_aiosqlite.py relies on in aiosqlite: ``Connection._execute`` queues a function on
the connection's thread, in order with aiosqlite's own calls, and ``Connection._conn`` is the
``sqlite3`` connection (``ValueError`` once closed). Fails when an upgrade changes one."""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
import threading
from pathlib import Path

import aiosqlite
import pytest

from stores._aiosqlite import run_on_thread


def test_the_private_queue_and_connection_are_there() -> None:
    execute = aiosqlite.Connection._execute
    assert inspect.iscoroutinefunction(execute)
    assert list(inspect.signature(execute).parameters) == ["self", "fn", "args", "kwargs"]
    assert isinstance(inspect.getattr_static(aiosqlite.Connection, "_conn"), property)


async def test_a_function_runs_on_the_connections_thread_in_order_with_its_own_calls(tmp_path: Path) -> None:
    conn = await aiosqlite.connect(tmp_path / "t.db")
    try:
        await conn.create_function("thread_id", 0, threading.get_ident)
        async with conn.execute("SELECT thread_id()") as cursor:
            row = await cursor.fetchone()
        assert row is not None
        its_thread = row[0]

        def read(raw: sqlite3.Connection, table: str) -> tuple[int, bool, list[tuple[int]]]:
            rows = raw.execute(f"SELECT n FROM {table}").fetchall()
            return threading.get_ident(), isinstance(raw, sqlite3.Connection), rows

        await conn.execute("CREATE TABLE t (n INTEGER)")
        # Queued after the insert (not awaited yet): the queue runs them in order.
        insert = asyncio.ensure_future(conn.execute("INSERT INTO t VALUES (1)"))
        await asyncio.sleep(0)
        thread, is_sqlite3, rows = await run_on_thread(conn, read, "t")
        await (await insert).close()
        assert thread == its_thread != threading.get_ident()
        assert is_sqlite3 and rows == [(1,)]
        with pytest.raises(sqlite3.OperationalError):
            await run_on_thread(conn, read, "missing")
    finally:
        await conn.close()
    with pytest.raises(ValueError):
        await run_on_thread(conn, read, "t")

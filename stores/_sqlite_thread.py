"""One trip to a connection's thread per store call (the SQLite store, :mod:`stores.sqlite`).

aiosqlite runs every call on the connection's own thread and hands each result back to the event
loop: a round trip per statement, which cost more than the statements themselves (an append was
seven: ``BEGIN``, the lease check, the update, the cursor's close, the fact check, the inserts,
``COMMIT``). Here a whole store call — a write transaction from ``BEGIN IMMEDIATE`` to ``COMMIT``,
or a read of several statements — is one plain function that runs on that thread in one trip,
through the same queue aiosqlite's own calls take (``Connection._execute``; pinned by
tests/stores/test_sqlite.py).

The queue runs one function at a time, in order, so a write transaction can no longer interleave
with another call on its connection, and no lock is needed for that: writes from concurrent tasks
queue on the thread, and SQLite's own lock (``BEGIN IMMEDIATE`` and the busy timeout) orders them
against other processes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import aiosqlite
import anyio

from stores._sql import queries

Q = queries("sqlite")
T = TypeVar("T")


async def on_thread(conn: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """``fn(sqlite_connection, *args)`` on ``conn``'s thread, awaited to its end.

    Shielded from cancellation: a function queued on the thread runs to its end whatever happens
    to the await, so the caller waits for it (a cancelled write has then committed or rolled back,
    and a read that follows sees which)."""
    execute = cast(Callable[..., Awaitable[T]], conn._execute)
    raw = conn._conn  # ValueError on a closed connection, as aiosqlite's own calls
    with anyio.CancelScope(shield=True):
        result = await execute(fn, raw, *args)
    return result


def in_transaction(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    """``work(conn)`` in one ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction (runs on the connection's
    thread), rolled back on any error. The commit is on disk when this returns (``synchronous =
    FULL``)."""
    conn.execute(Q["begin_immediate"])
    try:
        result = work(conn)
        conn.execute("COMMIT")
    except BaseException:
        # A failed COMMIT (an I/O error) leaves the transaction open: never leave it so.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def fetch_all(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def fetch_one(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> Any:
    return conn.execute(sql, params).fetchone()

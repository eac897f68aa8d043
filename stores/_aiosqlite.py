"""aiosqlite's internals the SQLite store relies on, in one place: :func:`run_on_thread` queues a
function of our own on a connection's thread, through the queue aiosqlite's own calls take.
``tests/stores/test_aiosqlite_reliance.py`` pins the reliance; ``pyproject.toml`` bounds aiosqlite
to the versions it passed with.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import aiosqlite

T = TypeVar("T")


async def run_on_thread(conn: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """``fn(sqlite_connection, *args)`` queued on ``conn``'s thread; its result (or exception).
    ``ValueError`` when ``conn`` is closed."""
    raw: sqlite3.Connection = conn._conn
    execute = cast(Callable[..., Awaitable[T]], conn._execute)
    return await execute(fn, raw, *args)

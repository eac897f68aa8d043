"""aiosqlite's internals the SQLite store relies on, in one place (aiosqlite 0.21 and 0.22).

aiosqlite runs every call on the connection's own thread, one queued function at a time, but has
no public way to queue a function of one's own: :func:`run_on_thread` does it through the same
queue its own calls take (``Connection._execute``), handing the function the ``sqlite3``
connection (``Connection._conn``, which raises ``ValueError`` on a closed connection, as aiosqlite's
own calls do). :mod:`stores._sqlite_thread` builds its one-trip store calls on it.

``tests/stores/test_aiosqlite_reliance.py`` pins both (names, types, and that the function runs on
the connection's thread in order with aiosqlite's own calls); ``pyproject.toml`` bounds
``aiosqlite`` to the versions those tests passed with.
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

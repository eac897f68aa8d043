"""One trip to a connection's thread per store call of the SQLite store: a whole write transaction,
or a read of several statements, is one function run through aiosqlite's own queue
(:func:`stores._aiosqlite.run_on_thread`). The queue runs one function at a time, so a transaction
never interleaves with another call on its connection; SQLite's lock orders it against other
processes.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar, cast

import aiosqlite
import anyio

from stores._aiosqlite import run_on_thread
from stores._common import from_thread
from stores._sql import queries

Q = queries("sqlite")
T = TypeVar("T")


async def on_thread(conn: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """``fn(sqlite_connection, *args)`` on ``conn``'s thread, awaited to its end.

    Shielded from cancellation: a function queued on the thread runs to its end whatever happens
    to the await, so the caller waits for it (a cancelled write has then committed or rolled back,
    and a read that follows sees which)."""
    with anyio.CancelScope(shield=True):
        # ValueError on a closed connection, as aiosqlite's own calls
        result = await run_on_thread(conn, fn, *args)
    return result


def in_transaction(
    conn: sqlite3.Connection,
    work: Callable[[sqlite3.Connection], T],
    committing: Callable[[], None] | None = None,
) -> T:
    """``work(conn)`` in one ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction (runs on the connection's
    thread), rolled back on any error. The commit is on disk when this returns (``synchronous =
    FULL``). ``committing``: called once ``work`` ran, just before the ``COMMIT``."""
    conn.execute(Q["begin_immediate"])
    try:
        result = work(conn)
        if committing is not None:
            committing()
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


Work = Callable[[sqlite3.Connection], Any]


class _Write:
    """A write waiting in a :class:`GroupCommit`: its function, then what it returned or raised."""

    __slots__ = ("flushing", "outcome", "woken", "work")

    def __init__(self, work: Work, flushing: Callable[[], None] | None) -> None:
        self.work = work
        self.flushing = flushing
        self.woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.outcome: tuple[bool, Any] | None = None


class GroupCommit:
    """The writes of one connection, committed in groups: the writes that arrive while a
    transaction is on the thread go together in the next one, each inside its own savepoint (so a
    refused write rolls back alone, as if it had been a transaction of its own), with one ``COMMIT``
    — and one ``fsync`` — for the group. Each caller is answered only after that ``COMMIT`` is on
    disk; a group whose ``BEGIN`` or ``COMMIT`` fails fails every write in it (none landed). Writes
    run in arrival order, so the outcome is the one of running them one by one.

    No task of its own: the caller that finds no group in flight sends one (its own write and any
    that joined), and when it is answered, the first write that arrived meanwhile is woken to send
    the next group. One group in flight at a time, so one transaction on the connection at a time.
    """

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn
        self._pending: list[_Write] = []
        self._in_flight = False
        self._idle = asyncio.Event()
        self._idle.set()

    async def run(
        self, work: Callable[[sqlite3.Connection], T], flushing: Callable[[], None] | None = None
    ) -> T:
        """``work(conn)`` in a write transaction, committed before this returns (shielded from
        cancellation, like :func:`on_thread`). ``flushing``: called on the event loop once
        ``work`` ran without error and the group's ``COMMIT`` (its ``fsync``, made with the
        interpreter's lock released) is under way."""
        write = _Write(work, flushing)
        self._pending.append(write)
        with anyio.CancelScope(shield=True):
            if self._in_flight:
                await write.woken
            if write.outcome is None:  # not answered: woken to send the next group
                await self._send()
        assert write.outcome is not None
        ok, value = write.outcome
        if not ok:
            raise value
        return cast(T, value)

    async def drain(self) -> None:
        """Wait until no write is queued or in flight."""
        await self._idle.wait()

    async def _send(self) -> None:
        group, self._pending = self._pending, []
        self._in_flight = True
        self._idle.clear()
        works = [write.work for write in group]
        told = _teller([write.flushing for write in group])
        try:
            outcomes = await run_on_thread(self._conn, _commit_group, works, told)
        except BaseException as exc:  # BEGIN or COMMIT failed (or the connection is closed): none landed
            outcomes = [(False, exc)] * len(group)
        for write, outcome in zip(group, outcomes, strict=True):
            write.outcome = outcome
            if not write.woken.done():
                write.woken.set_result(None)
        if self._pending:
            self._pending[0].woken.set_result(None)  # in_flight stays set: the next group is its
        else:
            self._in_flight = False
            self._idle.set()


#: what tells a group's writers that its commit is under way (:func:`_teller`), on the thread:
#: handed the outcomes of the group's writes so far
Teller = Callable[[list[tuple[bool, Any]]], None]


def _teller(flushing: list[Callable[[], None] | None]) -> Teller | None:
    """(On the event loop.) What the thread calls before a group's ``COMMIT``: it schedules, on
    the event loop, the ``flushing`` callback of each write of the group that ran without error
    (None: no write of the group asked)."""
    if not any(flushing):
        return None
    tells = [None if f is None else from_thread(f) for f in flushing]

    def tell(outcomes: list[tuple[bool, Any]]) -> None:
        for told, (ok, _) in zip(tells, outcomes, strict=True):
            if ok and told is not None:
                told()

    return tell


def _commit_group(
    conn: sqlite3.Connection, works: list[Work], tell: Teller | None = None
) -> list[tuple[bool, Any]]:
    """(On the connection's thread.) ``works`` in one transaction, each in a savepoint of its own;
    what each returned or raised. ``tell``: called with those outcomes just before the ``COMMIT``."""
    if len(works) == 1:
        committing = None if tell is None else functools.partial(tell, [(True, None)])
        try:
            return [(True, in_transaction(conn, works[0], committing))]
        except Exception as exc:
            return [(False, exc)]
    outcomes: list[tuple[bool, Any]] = []

    def each(conn: sqlite3.Connection) -> None:
        for work in works:
            conn.execute("SAVEPOINT one_write")
            try:
                outcomes.append((True, work(conn)))
            except Exception as exc:
                conn.execute("ROLLBACK TO one_write")
                outcomes.append((False, exc))
            conn.execute("RELEASE one_write")

    in_transaction(conn, each, None if tell is None else lambda: tell(outcomes))
    return outcomes

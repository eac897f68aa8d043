"""The postgres store's connection pool: a stack of idle asyncpg connections, handed out as they are
(asyncpg's own pool cost tens of microseconds per append). A connection is kept only when known to
be in a clean state (its block ended normally, or with a server or project error, outside a
transaction); otherwise it is terminated. At most ``max_size`` are open.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information

from orchestration.errors import ConstructError, StoreError, StoreUnavailable
from stores._urls import scrub

Connect = Callable[[], Awaitable[Any]]


class ConnectionPool:
    """The stack of idle connections described above, at most ``max_size`` open. Open it with
    :meth:`open`; borrow with ``async with pool.acquire()`` (or :meth:`get` then :meth:`put`)."""

    def __init__(self, connect: Connect, max_size: int) -> None:
        self._connect = connect
        self._max_size = max(max_size, 1)
        self._idle: list[Any] = []
        self._size = 0  # connections open or being opened
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    @classmethod
    async def open(cls, connect: Connect, *, min_size: int, max_size: int) -> ConnectionPool:
        pool = cls(connect, max_size)
        try:
            for _ in range(max(min(min_size, pool.max_size), 1)):
                pool.put(await pool.get(), clean=True)
        except BaseException:
            await pool.close()
            raise
        return pool

    def acquire(self) -> _Acquired:
        """``async with pool.acquire() as conn``: a connection for the block's length."""
        return _Acquired(self)

    @property
    def size(self) -> int:
        """Connections open or being opened, idle or in use."""
        return self._size

    @property
    def max_size(self) -> int:
        """At most this many connections are open at once."""
        return self._max_size

    async def get(self) -> Any:
        """A connection for the caller alone, until it gives it back with :meth:`put` (exactly once):
        the most recently used idle one, else a new one while fewer than :attr:`max_size` are open,
        else it waits for a release (waiting callers are woken in turn). Raises the driver's error
        when a new connection cannot be opened, ``InterfaceError`` once the pool is closed.
        :meth:`acquire` pairs the two calls."""
        while True:
            if self._closed:
                raise asyncpg.InterfaceError("the connection pool is closed")
            while self._idle:
                conn = self._idle.pop()
                if not conn.is_closed():
                    return conn
                self._size -= 1
            if self._size < self._max_size:
                self._size += 1
                try:
                    return await self._connect()
                except BaseException:
                    self._size -= 1
                    self._wake()
                    raise
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if not waiter.done() or waiter.cancelled():
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
                else:
                    self._wake()  # woken, but leaving: pass the wake-up on
                raise

    def put(self, conn: Any, *, clean: bool) -> None:
        """Give back a connection :meth:`get` handed out. It is kept for the next caller only when
        ``clean`` (its block ended normally or with an error that leaves the session usable), the
        pool is open, and it is connected and outside a transaction; otherwise it is terminated.
        Never awaits."""
        if clean and not self._closed and not conn.is_closed() and not conn.is_in_transaction():
            self._idle.append(conn)
        else:
            self._size -= 1
            if not conn.is_closed():
                conn.terminate()
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Close the idle connections; the ones in use are closed when they are released."""
        self._closed = True
        idle, self._idle = self._idle, []
        self._size -= len(idle)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # it finds the pool closed
        for conn in idle:
            try:
                await conn.close()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                conn.terminate()


#: What a block may raise and leave its connection reusable: the statement failed on the server, or
#: the store raised one of its own errors after a statement completed; but not the server's errors
#: that end the session.
_CLEAN_ERRORS = (asyncpg.PostgresError, ConstructError)
_SESSION_ENDED = (asyncpg.PostgresConnectionError, asyncpg.OperatorInterventionError)


class _Acquired:
    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._conn: Any = None

    async def __aenter__(self) -> Any:
        self._conn = await self._pool.get()
        return self._conn

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        conn, self._conn = self._conn, None
        clean = exc is None or (isinstance(exc, _CLEAN_ERRORS) and not isinstance(exc, _SESSION_ENDED))
        self._pool.put(conn, clean=clean)


# Errors that mean "cannot reach or use the server", as opposed to "this statement failed".
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.InvalidCatalogNameError,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidPasswordError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.InterfaceError,
)


def _translation(exc: BaseException, where: str, dsn: str) -> StoreError | None:
    """An asyncpg error as the adapter raises it (None: the error passes as it is, the project's
    own errors among them)."""
    if isinstance(exc, ConstructError):
        return None
    if isinstance(exc, _UNAVAILABLE):
        text = scrub(str(exc) or type(exc).__name__, dsn)
        return StoreUnavailable(f"cannot use the {where}: {text}")
    if isinstance(exc, asyncpg.PostgresError):
        return StoreError(f"{where}: {type(exc).__name__}: {scrub(str(exc), dsn)}")
    return None


@contextmanager
def translated(where: str, dsn: str) -> Iterator[None]:
    """Translate asyncpg errors at the adapter edge; the project's own errors pass through."""
    try:
        yield
    except Exception as exc:
        translated = _translation(exc, where, dsn)
        if translated is None:
            raise
        raise translated from exc


class PooledConnection:
    """``async with``: a connection of the store's pool, asyncpg's errors translated (as
    :func:`translated`); a class rather than a generator, as it is entered at every call."""

    __slots__ = ("_acquired", "_dsn", "_where")

    def __init__(self, pool: ConnectionPool, where: str, dsn: str) -> None:
        self._acquired = pool.acquire()
        self._where = where
        self._dsn = dsn

    async def __aenter__(self) -> Any:
        try:
            return await self._acquired.__aenter__()
        except Exception as exc:
            translated = _translation(exc, self._where, self._dsn)
            if translated is None:
                raise
            raise translated from exc

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        await self._acquired.__aexit__(kind, exc, tb)  # judges the connection by the driver's error
        if exc is not None:
            translated = _translation(exc, self._where, self._dsn)
            if translated is not None:
                raise translated from exc

"""Watching a drive's provider calls for a write by anyone else (a cancel from another process or
client), with one task per drive instead of one per call (issue 11: a task group, a task and a
cancel per call were a fifth of a task boundary's interpreter time with an instant worker).

The rule is the one a task per call followed: a call's first check comes ``poll`` seconds after
it began, then every ``poll`` seconds while it lasts; a check reads the run and aborts the call
(cancels its scope) when the run's version is no longer the one the call was started on. A call
that ends before its first check costs no read. A check whose read returns after its call ended
changes nothing (it only ever cancels the call it was made for).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import anyio

#: the shortest sleep of an idle watcher (a check may come this much late when the poll is shorter)
IDLE_FLOOR_SECONDS = 0.01

#: ``check(version)``: read the run once; True when the call must be aborted (the run moved past
#: ``version``, or the store has been away past the drive's outage limit)
Check = Callable[[int], Awaitable[bool]]


@dataclass(slots=True)
class _Call:
    version: int
    scope: anyio.CancelScope
    #: when the next check is due (``anyio.current_time``); None once the call was aborted
    due: float | None


class CallWatch:
    """One drive's watcher of its calls in flight: :meth:`watching` around each call, and
    :meth:`run` in a task that lives as long as the drive (started with the first call)."""

    def __init__(self, poll_seconds: float, check: Check) -> None:
        self._poll = poll_seconds
        self._check = check
        self._call: _Call | None = None
        #: whether :meth:`run` was started (the drive starts it with its first call)
        self.started = False

    @contextmanager
    def watching(self, version: int, scope: anyio.CancelScope) -> Iterator[None]:
        """Watch the call made inside this block, started on the run's ``version``."""
        self.begin(version, scope, anyio.current_time())
        try:
            yield
        finally:
            self.end()

    def begin(self, version: int, scope: anyio.CancelScope, now: float) -> None:
        """Watch the call that starts now (``anyio.current_time()``, which the caller has read
        already) on the run's ``version``, until :meth:`end` (what :meth:`watching` does, without
        a generator and a second read of the time per call)."""
        self._call = _Call(version, scope, now + self._poll)

    def end(self) -> None:
        """The call watched since :meth:`begin` ended."""
        self._call = None

    async def run(self) -> None:
        """Check the call in flight when its checks are due; runs until cancelled.

        With no call due it sleeps one poll interval: a call that begins meanwhile is due a poll
        after it began, so no later than that tick, and is checked on time (the watcher then
        sleeps until its check is due). A call costs the watcher nothing until then (it used to
        wake the watcher through an event per call)."""
        poll = self._poll
        # (a poll of zero checks a call all the time, but must not spin while there is none)
        idle = max(poll, IDLE_FLOOR_SECONDS)
        while True:
            call = self._call
            if call is None or call.due is None:
                await anyio.sleep(idle)
                continue
            wait = call.due - anyio.current_time()
            if wait > 0:
                await anyio.sleep(wait)
                continue
            if await self._check(call.version):
                if self._call is call:
                    call.scope.cancel()
                # Aborted (or ended meanwhile): no more checks for it.
                call.due = None
            else:
                call.due = anyio.current_time() + poll

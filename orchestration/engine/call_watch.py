"""One watcher per runtime of the runs whose calls are in flight, so that a write by anyone else (a
cancel from another process or client) stops those calls.

It reads versions, never records: one batched :meth:`~orchestration.store.RunStore.versions` read
per ``cancel_poll_seconds`` for every watched run (one statement, whatever their number), at once for
the runs a store notification names, and none for this process's own writes. So a cancel reaches a
call within one interval, and the cost is one statement per server per interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import anyio

from orchestration.errors import CorruptRecord, StoreError
from orchestration.store import RunStore

#: the shortest interval between two batched checks (a poll of zero must not spin)
IDLE_FLOOR_SECONDS = 0.01


@dataclass(eq=False, slots=True)
class Watched:
    """One call (or a parallel run's calls) in flight, watched for writes by anyone else."""

    run_id: str
    #: the run's version its drive knows: a later one in the store is someone else's write
    version: int
    #: how often the run's version must at least be checked (the drive's ``cancel_poll_seconds``)
    poll_seconds: float
    #: ``moved(version)``: the run is at ``version`` now, past :attr:`version`
    moved: Callable[[int], None]
    #: ``failed(error)``: the batched check failed with a store error
    failed: Callable[[StoreError], None]
    #: the batched check was answered
    answered: Callable[[], None]


class RunWatch:
    """The runtime's watcher of the runs with calls in flight (see the module docstring):
    :meth:`add` / :meth:`remove` around each call, :meth:`run` in one task of the runtime (its
    :class:`~orchestration.engine.leased_run.LeaseRenewer` runs it beside the renewals)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        #: the entries by run id
        self._watched: dict[str, list[Watched]] = {}
        #: runs the store notified of since the last check (checked at once)
        self._notified: set[str] = set()
        self._wake = anyio.Event()
        #: when the next batched check of every watched run is due (``anyio.current_time``); it
        #: outlives the last entry's removal, so that the calls of a run driven step after step
        #: (each added and removed in turn) do not wake the watcher each (see :meth:`add`)
        self._due: float | None = None
        #: until when the watcher sleeps (``math.inf``: until woken), ``None`` while it checks
        self._sleep_until: float | None = None
        #: how many batched ``versions`` reads were made (what a test or a bench counts)
        self.checks = 0
        #: how many times the watcher's sleep ended (a deadline or a wake-up; what a test counts)
        self.wakeups = 0

    @property
    def watched(self) -> int:
        """How many runs are watched now."""
        return len(self._watched)

    def add(self, entry: Watched) -> None:
        """Watch ``entry`` until :meth:`remove`; its first check comes at most one
        ``entry.poll_seconds`` from now."""
        fresh = not self._watched
        self._watched.setdefault(entry.run_id, []).append(entry)
        due = anyio.current_time() + entry.poll_seconds
        if fresh or self._due is None or due < self._due:
            # The first call of a quiet spell gets its full interval (a call shorter than that is
            # never checked), even if that moves the deadline later: the watcher, asleep until
            # the earlier one, then only wakes to sleep on, once per interval, not once per call.
            self._due = due
        if self._sleep_until is not None and self._due < self._sleep_until:
            self._wake.set()  # the watcher sleeps past the deadline (or until woken): wake it

    def remove(self, entry: Watched) -> None:
        entries = self._watched.get(entry.run_id)
        if entries is None or entry not in entries:
            return
        entries.remove(entry)
        if not entries:
            del self._watched[entry.run_id]
            self._notified.discard(entry.run_id)

    def wrote(self, run_id: str, version: int) -> None:
        """The drive of ``run_id`` wrote (or read) ``version``: not a move for its entries."""
        for entry in self._watched.get(run_id, ()):
            entry.version = max(entry.version, version)

    def changed(self, run_id: str, version: int) -> None:
        """A write of this process left ``run_id`` at ``version`` (no statement needed)."""
        self._report(run_id, version)

    def notify(self, run_id: str) -> None:
        """The store says ``run_id`` was written to: check its version now (if it is watched).
        Safe to call from any task on the event loop (it does not block)."""
        if run_id in self._watched:
            self._notified.add(run_id)
            self._wake.set()

    async def run(self) -> None:
        """Check the watched runs' versions: all of them once per interval, the notified ones at
        once. Runs until cancelled."""
        while True:
            now = anyio.current_time()
            if not self._watched and (self._due is None or now >= self._due):
                self._due = None  # nothing to check: sleep until a call is added
            due = self._due
            if not self._notified and (due is None or now < due):
                self._wake = anyio.Event()
                self._sleep_until = math.inf if due is None else due
                try:
                    with anyio.move_on_after(self._sleep_until - now):
                        await self._wake.wait()
                finally:
                    self._sleep_until = None
                    self.wakeups += 1
                continue
            if due is not None and now >= due:
                run_ids = list(self._watched)
                self._due = now + self._interval()
            else:
                run_ids = [run_id for run_id in self._notified if run_id in self._watched]
            self._notified.clear()
            await self.check(run_ids)

    def _interval(self) -> float:
        polls = (entry.poll_seconds for entries in self._watched.values() for entry in entries)
        return max(min(polls, default=IDLE_FLOOR_SECONDS), IDLE_FLOOR_SECONDS)

    async def check(self, run_ids: Iterable[str]) -> None:
        """One ``versions`` read of ``run_ids``; each entry of a run that moved is told."""
        ids = list(run_ids)
        if not ids:
            return
        self.checks += 1
        try:
            versions = await self.store.versions(ids)
        except CorruptRecord:
            return  # an unreadable run is not an outage: its drive finds out by itself
        except StoreError as exc:
            for entry in self._entries(ids):
                entry.failed(exc)
            return
        for entry in self._entries(ids):
            entry.answered()
        for run_id in ids:
            version = versions.get(run_id)
            if version is not None:
                self._report(run_id, version)

    def _entries(self, run_ids: Iterable[str]) -> list[Watched]:
        return [entry for run_id in run_ids for entry in self._watched.get(run_id, ())]

    def _report(self, run_id: str, version: int) -> None:
        for entry in list(self._watched.get(run_id, ())):
            if version > entry.version:
                entry.version = version
                entry.moved(version)


__all__ = ["IDLE_FLOOR_SECONDS", "RunWatch", "Watched"]

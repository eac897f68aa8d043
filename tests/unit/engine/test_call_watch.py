"""One watcher per runtime for the calls in flight of all its drives
(orchestration.engine.call_watch.RunWatch, issue 24): one batched ``versions`` read per interval
whatever the number of calls, never a record read; a move reaches its call within one interval; a
notification or a write of this process is acted on at once; a call shorter than the interval
costs no read; a store error is told to every call it was for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import anyio

from orchestration.engine.call_watch import RunWatch, Watched
from orchestration.errors import StoreError, StoreUnavailable
from orchestration.store import RunStore

POLL = 0.05


class Versions:
    """What RunWatch uses of a store: ``versions``, answered from :attr:`current`, every read
    recorded (when, which runs)."""

    def __init__(self, current: dict[str, int], delay: float = 0.0) -> None:
        self.current = current
        self.delay = delay
        self.reads: list[tuple[float, list[str]]] = []
        self.down = False

    async def versions(self, run_ids: Sequence[str]) -> dict[str, int]:
        self.reads.append((anyio.current_time(), list(run_ids)))
        await anyio.sleep(self.delay)
        if self.down:
            raise StoreUnavailable("the store is away")
        return {r: self.current[r] for r in run_ids if r in self.current}


class Call:
    """A watched call: its scope is cancelled when the run moves or the store fails."""

    def __init__(self, watch: RunWatch, run_id: str, version: int, poll: float = POLL) -> None:
        self.scope = anyio.CancelScope()
        self.moves: list[int] = []
        self.failures: list[StoreError] = []
        self.answers = 0
        self.entry = Watched(run_id, version, poll, self._moved, self.failures.append, self._answered)
        self.watch = watch

    def _moved(self, version: int) -> None:
        self.moves.append(version)
        self.scope.cancel()

    def _answered(self) -> None:
        self.answers += 1

    async def lasting(self, seconds: float) -> None:
        self.watch.add(self.entry)
        try:
            with self.scope:
                await anyio.sleep(seconds)
        finally:
            self.watch.remove(self.entry)


def watch_on(store: Versions) -> RunWatch:
    return RunWatch(cast(RunStore, store))


async def test_a_long_call_is_checked_every_interval_and_stopped_when_the_run_moved() -> None:
    store = Versions({"r1": 7})
    watch = watch_on(store)
    call = Call(watch, "r1", 7)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        began = anyio.current_time()
        tg.start_soon(call.lasting, 10)
        while len(store.reads) < 3:  # noqa: ASYNC110 (counts the reads)
            await anyio.sleep(POLL / 5)
        moved_at = anyio.current_time()
        store.current["r1"] = 8  # a cancel, written by another process
        with anyio.fail_after(5):
            while not call.scope.cancel_called:  # noqa: ASYNC110
                await anyio.sleep(POLL / 10)
        stopped_at = anyio.current_time()
        tg.cancel_scope.cancel()
    assert call.moves == [8]
    # The first read a full interval after the call began, then one per interval.
    assert store.reads[0][0] - began >= POLL * 0.9
    assert store.reads[2][0] - store.reads[0][0] >= 2 * POLL * 0.9
    # The move reached the call within one interval (and some scheduling slack).
    assert stopped_at - moved_at <= POLL * 3


async def test_many_calls_cost_one_read_per_interval() -> None:
    runs = {f"r{n}": 1 for n in range(200)}
    store = Versions(dict(runs))
    watch = watch_on(store)
    calls = [Call(watch, run_id, 1) for run_id in runs]
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        for call in calls:
            tg.start_soon(call.lasting, 10)
        await anyio.sleep(POLL * 5.5)
        tg.cancel_scope.cancel()
    assert 3 <= len(store.reads) <= 6, "one read per interval, not one per call"
    assert all(sorted(ids) == sorted(runs) for _, ids in store.reads)
    assert all(not call.moves for call in calls)
    assert all(call.answers == len(store.reads) for call in calls)


async def test_calls_shorter_than_the_interval_are_never_checked() -> None:
    store = Versions({"r1": 1})
    watch = watch_on(store)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        for _ in range(20):
            await Call(watch, "r1", 1).lasting(POLL / 10)
        await anyio.sleep(POLL * 2)
        tg.cancel_scope.cancel()
    assert store.reads == []


async def test_calls_one_after_another_do_not_wake_the_watcher_each() -> None:
    # A run driven step after step adds and removes one entry per provider call: the watcher
    # wakes about once per interval for them all, not once per call (the provider path's cost).
    store = Versions({"r1": 1})
    watch = watch_on(store)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        await anyio.sleep(POLL / 10)
        woken = watch.wakeups
        for _ in range(50):
            await Call(watch, "r1", 1).lasting(POLL / 100)
        tg.cancel_scope.cancel()
    assert watch.wakeups - woken <= 4, watch.wakeups - woken
    assert store.reads == []


async def test_a_read_that_returns_after_its_call_ended_stops_no_later_call() -> None:
    # The first call's read answers "moved" only after that call ended and the next began.
    store = Versions({"r1": 2}, delay=POLL)
    watch = watch_on(store)
    first, second = Call(watch, "r1", 1), Call(watch, "r1", 2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        await first.lasting(POLL * 1.5)  # read, and still reading, when the call ends
        await second.lasting(POLL)
        tg.cancel_scope.cancel()
    assert store.reads
    assert not first.scope.cancel_called and not second.scope.cancel_called


async def test_a_notification_is_checked_at_once_and_a_local_write_needs_no_read() -> None:
    store = Versions({"r1": 1, "r2": 1})
    watch = watch_on(store)
    notified, local = Call(watch, "r1", 1, poll=3600), Call(watch, "r2", 1, poll=3600)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        tg.start_soon(notified.lasting, 10)
        tg.start_soon(local.lasting, 10)
        await anyio.sleep(POLL)
        store.current["r1"] = 2
        watch.notify("r1")
        watch.notify("not-watched")  # ignored: no read for a run nobody watches here
        with anyio.fail_after(5):
            while not notified.scope.cancel_called:  # noqa: ASYNC110
                await anyio.sleep(0.001)
        watch.changed("r2", 1)  # a write we made ourselves: not a move
        watch.changed("r2", 3)
        tg.cancel_scope.cancel()
    assert notified.moves == [2] and [ids for _, ids in store.reads] == [["r1"]]
    assert local.moves == [3]


async def test_own_writes_are_not_moves() -> None:
    store = Versions({"r1": 1})
    watch = watch_on(store)
    call = Call(watch, "r1", 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        tg.start_soon(call.lasting, 10)
        await anyio.sleep(POLL / 2)
        store.current["r1"] = 2
        watch.wrote("r1", 2)  # the drive's own write, before the watcher reads it
        await anyio.sleep(POLL * 3)
        tg.cancel_scope.cancel()
    assert len(store.reads) >= 2 and call.moves == []


async def test_a_store_error_is_told_to_every_call_it_was_for() -> None:
    store = Versions({"r1": 1, "r2": 1})
    store.down = True
    watch = watch_on(store)
    calls = [Call(watch, "r1", 1), Call(watch, "r2", 1)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        for call in calls:
            tg.start_soon(call.lasting, 10)
        await anyio.sleep(POLL * 2.5)
        store.down = False
        await anyio.sleep(POLL * 2)
        tg.cancel_scope.cancel()
    for call in calls:
        assert call.failures and all(isinstance(f, StoreUnavailable) for f in call.failures)
        assert call.answers >= 1 and call.moves == []

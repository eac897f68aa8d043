"""One watcher per drive for its provider calls (orchestration.engine.call_watch): the checks come when a
task per call made them, a late check aborts no other call, and a call shorter than the poll
interval costs no check at all."""

from __future__ import annotations

import anyio

from orchestration.engine.call_watch import CallWatch

POLL = 0.05


class Checks:
    """A check that records when it was made and answers from a script."""

    def __init__(self, answers: list[bool], delay: float = 0.0) -> None:
        self.answers = answers
        self.delay = delay
        self.made: list[tuple[int, float]] = []

    async def __call__(self, version: int) -> bool:
        self.made.append((version, anyio.current_time()))
        await anyio.sleep(self.delay)
        return self.answers.pop(0) if self.answers else False


async def test_a_long_call_is_checked_every_poll_and_aborted_when_the_run_moved() -> None:
    checks = Checks([False, False, True])
    watch = CallWatch(POLL, checks)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        scope = anyio.CancelScope()
        began = anyio.current_time()
        with anyio.fail_after(5), scope, watch.watching(7, scope):
            await anyio.sleep(10)
        tg.cancel_scope.cancel()
    assert scope.cancelled_caught
    assert [version for version, _ in checks.made] == [7, 7, 7]
    # The first check a full interval after the call began, then one per interval.
    assert checks.made[0][1] - began >= POLL * 0.9
    assert checks.made[2][1] - checks.made[0][1] >= 2 * POLL * 0.9


async def test_calls_shorter_than_the_poll_interval_are_never_checked() -> None:
    checks = Checks([])
    watch = CallWatch(POLL, checks)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        for version in range(20):
            scope = anyio.CancelScope()
            with scope, watch.watching(version, scope):
                await anyio.sleep(POLL / 10)
        tg.cancel_scope.cancel()
    assert checks.made == []


async def test_a_check_that_returns_after_its_call_ended_aborts_no_later_call() -> None:
    # The check of the first call answers "moved" only after that call ended and the next began.
    checks = Checks([True], delay=POLL)
    watch = CallWatch(POLL, checks)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        first = anyio.CancelScope()
        with first, watch.watching(1, first):
            await anyio.sleep(POLL * 1.5)  # the check is made, and still reading, when the call ends
        second = anyio.CancelScope()
        with second, watch.watching(2, second):
            await anyio.sleep(POLL)
        tg.cancel_scope.cancel()
    assert checks.made and checks.made[0][0] == 1
    assert not first.cancel_called and not second.cancel_called


async def test_a_call_that_begins_while_the_watcher_idles_is_checked_on_time() -> None:
    """The idle watcher sleeps a poll interval at a time; a call that begins in the middle of one is
    still first checked a poll after it began, not later. (The poll is long so that the 0.4 poll
    between on time and late stays far above a loaded machine's scheduling delays.)"""
    poll = 1.0
    checks = Checks([True])
    watch = CallWatch(poll, checks)
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        await anyio.sleep(poll * 0.6)
        scope = anyio.CancelScope()
        began = anyio.current_time()
        with anyio.fail_after(5), scope, watch.watching(3, scope):
            await anyio.sleep(10)
        tg.cancel_scope.cancel()
    assert scope.cancelled_caught and [version for version, _ in checks.made] == [3]
    # (an idle tick after the check was due would make it 0.4 poll late)
    assert poll * 0.9 <= checks.made[0][1] - began <= poll * 1.25

"""The runtime's change notification: the listeners and waiters told of every write
(:class:`ChangeFeed`), and waiting for a run to settle (:func:`wait_until`, :func:`is_settled`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import anyio

from orchestration.core.facts import Fact
from orchestration.core.models import RunHead
from orchestration.core.vocabulary import RunStatus

log = logging.getLogger("construct.runtime")


@dataclass
class Waiters:
    """One event per run that callers waiting in this process are woken by (see
    ``Runtime.wait_settled``); a write fires it."""

    events: dict[str, anyio.Event] = field(default_factory=dict)

    def event(self, run_id: str) -> anyio.Event:
        ev = self.events.get(run_id)
        if ev is None:
            ev = self.events[run_id] = anyio.Event()
        return ev

    def fire(self, run_id: str) -> None:
        ev = self.events.pop(run_id, None)
        if ev is not None:
            ev.set()


def is_settled(head: RunHead, now: datetime) -> bool:
    """A run is settled when it needs someone outside the server (a host, an approver), has
    ended, or waits durably until a time in the future — unless a time that decides without
    anyone (its ``wake_at``: a deadline, a gate's expiry) has passed: then the server acts."""
    if head.status.is_terminal:
        return True
    if head.wake_at is not None and head.wake_at <= now:
        return False
    if head.status.kind == "paused":
        return True  # awaiting approval, the host, children or an agent
    return head.status == RunStatus.QUEUED and head.not_before is not None and head.not_before > now


ChangeListener = Callable[[RunHead], Awaitable[None]]


class ChangeFeed:
    """Who hears of a runtime's writes: the callers waiting in this process for a run to move
    (:attr:`waiters`) and the listeners (:meth:`add_listener`). The runtime, its drives and its
    child runs report every write here (:meth:`recorded`, or :meth:`changed` for a write that needs
    no log line of its own)."""

    def __init__(self) -> None:
        self.waiters = Waiters()
        self._listeners: list[ChangeListener] = []

    def add_listener(self, listener: ChangeListener) -> None:
        """``listener(head)`` is awaited after every write reported here (errors are logged)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: ChangeListener) -> None:
        """Stop calling ``listener`` (one that :meth:`add_listener` added; else ``ValueError``)."""
        self._listeners.remove(listener)

    async def changed(self, head: RunHead) -> None:
        """After a write that made ``head``: wake the waiters of its run, call the listeners."""
        self.waiters.fire(head.run_id)
        for listener in self._listeners:
            try:
                await listener(head)
            except Exception:
                log.exception("listener failed", extra={"action": "listener_failed", "run_id": head.run_id})

    async def recorded(self, facts: Sequence[Fact], stored: RunHead) -> None:
        """After a write of ``facts`` (an external event's or a drive's): log it, then :meth:`changed`."""
        log.info(
            "recorded %s",
            ",".join(f.type for f in facts),
            extra={"action": "facts_recorded", "run_id": stored.run_id, "version": stored.version},
        )
        await self.changed(stored)


async def wait_until(
    load: Callable[[str], Awaitable[RunHead]],
    waiters: Waiters,
    stopping: Callable[[], bool],
    run_id: str,
    done: Callable[[RunHead], bool],
    timeout_seconds: float,
    on_progress: Callable[[RunHead], Awaitable[None]] | None,
    poll_seconds: float,
) -> RunHead:
    """Run ``run_id``'s head (``load``) once ``done(head)``, or at the timeout. Woken at once by
    this process's writes (``waiters``); polls the store for other processes' writes. Returns the
    current state early when ``stopping()`` (a server shutting down must not be held up by callers
    waiting). ``on_progress`` is called with each new version seen meanwhile."""
    head = await load(run_id)
    deadline = anyio.current_time() + max(0.0, timeout_seconds)
    last_version = head.version
    while not stopping() and not done(head):
        remaining = deadline - anyio.current_time()
        if remaining <= 0:
            break
        event = waiters.event(run_id)
        with anyio.move_on_after(min(remaining, poll_seconds)):
            await event.wait()
        head = await load(run_id)
        if on_progress is not None and head.version != last_version:
            last_version = head.version
            await on_progress(head)
    return head


__all__ = ["ChangeFeed", "ChangeListener", "Waiters", "is_settled", "wait_until"]

"""Small pieces of the runtime's bookkeeping: waking callers that wait for a run to settle, and
giving drives' leases back."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

import anyio

from orchestration.core.models import RunHead
from orchestration.core.vocabulary import RunStatus
from orchestration.errors import ConstructError
from orchestration.store import Lease, RunStore

log = logging.getLogger("construct.runtime")

#: How long a drive waits to release its lease before leaving it to expire (short: a server shutting
#: down with its store away must not be held up by it).
_RELEASE_SECONDS = 2.0


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
    if head.status in (RunStatus.AWAITING_APPROVAL, RunStatus.AWAITING_HOST, RunStatus.AWAITING_CHILDREN):
        return True
    return head.status == RunStatus.QUEUED and head.not_before is not None and head.not_before > now


class LeaseReleases:
    """Gives leases back to the store, and remembers those it could not give back (the store was
    away) so that the dispatcher can release them once the store answers again."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._unreleased: dict[str, Lease] = {}

    async def release(self, lease: Lease) -> None:
        # Shielded (a cancelled drive must still give its lease up) but bounded: with the store
        # away, waiting for it would hold up a shutdown, and the lease expires anyway. Until the
        # release is known to have happened, the lease is kept for release_unreleased.
        self._unreleased[lease.run_id] = lease
        with anyio.CancelScope(shield=True), anyio.move_on_after(_RELEASE_SECONDS):
            try:
                await self.store.release_lease(lease)
            except ConstructError as exc:
                # The store is down: the lease simply expires; the run is picked up again then.
                log.warning(
                    "cannot release lease: %s",
                    exc,
                    extra={"action": "lease_release_failed", "run_id": lease.run_id},
                )
            else:
                if self._unreleased.get(lease.run_id) is lease:
                    del self._unreleased[lease.run_id]

    async def release_unreleased(self, run_id: str) -> None:
        """Release the lease a drive of ``run_id`` could not release (the store was away), if any,
        so that the run can be claimed at once rather than when the lease expires. Raises the
        store's error while it is still away. A lease claimed again since is not touched (the
        release matches the token)."""
        lease = self._unreleased.get(run_id)
        if lease is None:
            return
        await self.store.release_lease(lease)
        if self._unreleased.get(run_id) is lease:
            del self._unreleased[run_id]


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

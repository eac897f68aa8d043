"""One leased run: what a drive holds while it advances a run (DESIGN §1), and what the linear loop
(:mod:`orchestration.engine.drive`), the parallel one (:mod:`orchestration.engine.fanout`) and agent
calls (:mod:`orchestration.engine.delegation`) read and write the run through, importing none of
each other.

:class:`LeasedRun` fences every write with the lease (``LeaseLost`` once another claim replaced it)
and rides out a short store outage. The runtime's :class:`LeaseRenewer` renews the leases of all its
drives in ONE store call per interval, yet each drive learns of its own lease alone: a lease another
claim replaced stops that drive and no other, a store error counts against every held run's outage,
and the fencing token of appends is the lease's, unchanged by renewals.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import anyio

from orchestration.core.clock import Clock
from orchestration.core.decide import Action
from orchestration.core.facts import Fact, TaskCompleted
from orchestration.core.fold import apply_write
from orchestration.core.models import RunHead
from orchestration.engine.backoff import Backoff, Outage
from orchestration.engine.call_watch import RunWatch, Watched
from orchestration.errors import ConstructError, CorruptRecord, LeaseLost, StoreError, VersionConflict
from orchestration.store import Lease, RunStore
from orchestration.tracing import DriveTrace

# The drive's events keep the logger they had when the loop lived in the runtime module.
log = logging.getLogger("construct.runtime")

#: ``recorded(facts, head)`` is awaited after every write a drive makes (logs it, notifies listeners)
Recorded = Callable[[Sequence[Fact], RunHead], Awaitable[None]]

#: How long a drive waits to release its lease before leaving it to expire (short: a server shutting
#: down with its store away must not be held up by it).
_RELEASE_SECONDS = 2.0


class Cancellable(Protocol):
    """What the runtime's cancel stops: a provider call's cancel scope, or a parallel run's calls
    (:class:`~orchestration.engine.fanout.ScopeSet`)."""

    def cancel(self) -> None: ...


class CallControl:
    """What a runtime shares with every drive it makes: the cancel scope of each run's calls in
    flight (by run id; :meth:`cancel` — the runtime's cancel — stops them), and whether the runtime
    is stopping (:meth:`stop`; drives then start nothing new)."""

    def __init__(self) -> None:
        self._scopes: dict[str, Cancellable] = {}
        self._stopping = False

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        self._stopping = True

    def track(self, run_id: str, scope: Cancellable) -> None:
        """``scope`` stops ``run_id``'s calls in flight from now on."""
        self._scopes[run_id] = scope

    def untrack(self, run_id: str, scope: Cancellable) -> None:
        """``scope``'s calls have ended; nothing is done when another scope took its place."""
        if self._scopes.get(run_id) is scope:
            del self._scopes[run_id]

    def cancel(self, run_id: str) -> None:
        """Stop ``run_id``'s calls in flight in this process, if any."""
        scope = self._scopes.get(run_id)
        if scope is not None:
            scope.cancel()


class DriveActions(Protocol):
    """What the parts of a drive (:mod:`~orchestration.engine.fanout`) ask of the drive itself."""

    async def act(self, head: RunHead, action: Action) -> RunHead | None:
        """Do ``action``; the head its last write recorded, or None when the run must be read again."""
        ...

    async def child_moved(self, head: RunHead, task_id: str) -> bool:
        """Make sure the child of ``task_id`` exists and record its end if it ended; True when the
        run changed."""
        ...


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """How a :class:`~orchestration.engine.runtime.Runtime` and its drives hold leases and wait."""

    #: who holds the leases this runtime takes (one name per process)
    owner: str = "runtime"
    lease_ttl_seconds: float = 30.0
    #: the longest backoff a drive waits in memory; a longer one is a durable wait
    in_memory_wait_cap_seconds: float = 30.0
    #: how often a call in flight checks whether its run was cancelled elsewhere
    cancel_poll_seconds: float = 0.5
    #: how long a drive rides out a store outage (writes wait, calls go on)
    store_outage_seconds: float = 30.0
    #: how long giving up awaited remote runs waits for their cancels, in all
    remote_cancel_seconds: float = 10.0


class LeasedRun:
    """One run under the lease a drive holds (:attr:`lease`): its reads and fenced writes, the
    renewal of the lease, the store outage being ridden out, and the services shared with the
    runtime that made it (the store, the clock, ``recorded`` — its log and change notification —
    and its :class:`CallControl`)."""

    def __init__(
        self,
        lease: Lease,
        *,
        store: RunStore,
        clock: Clock,
        settings: RuntimeSettings,
        recorded: Recorded,
        calls: CallControl,
        renewer: LeaseRenewer | None = None,
    ) -> None:
        self.run_id = lease.run_id
        #: the lease the drive holds, and the one to release once the drive returns. Renewal
        #: replaces it (same token, later expiry); a claim the runtime made again on the run meanwhile
        #: is handed over here (:meth:`hand_over`), so that the next write carries the current token.
        self.lease = lease
        #: set when a renewal found the lease replaced by another claim (the drive then stops)
        self.lost = False
        self.outage = Outage(settings.store_outage_seconds)
        self.store = store
        self.clock = clock
        self.settings = settings
        self.calls = calls
        self._recorded = recorded
        #: the runtime's renewer of all its drives' leases (None: this run's own)
        self._renewer = renewer or LeaseRenewer(store, clock, settings.lease_ttl_seconds)
        #: the runtime's watcher of the runs with calls in flight (see :meth:`watch`)
        self.watcher = self._renewer.watch
        #: task outputs of this run read or committed by this drive, by sequence number: a
        #: recorded fact never changes, so a prompt reads each earlier output from the store at
        #: most once per drive (see :func:`~orchestration.engine.reading.read_outputs`)
        self.known: dict[int, Fact] = {}
        #: the drive's spans (observes only: see orchestration.tracing)
        self.trace = DriveTrace(lease.run_id)

    def hand_over(self, lease: Lease) -> None:
        """Carry ``lease`` (a newer claim of the run by the same owner) from now on."""
        self.lease = lease

    @property
    def stopping(self) -> bool:
        """Whether the runtime is shutting down (start nothing new)."""
        return self.calls.stopping

    def track_call(self, scope: Cancellable) -> None:
        """``scope`` stops the run's calls in flight (the runtime's cancel) until :meth:`untrack_call`."""
        self.calls.track(self.run_id, scope)

    def untrack_call(self, scope: Cancellable) -> None:
        self.calls.untrack(self.run_id, scope)

    def watch(self, version: int, moved: Callable[[int], None], stop: Callable[[], None]) -> Watched:
        """Watch the run for writes by anyone else while calls are in flight, from ``version`` (the
        one the caller holds; this drive's own writes and reads move it on), until
        :meth:`unwatch`: ``moved(version)`` once the run moved past it (within one
        ``cancel_poll_seconds``: the runtime's :class:`~orchestration.engine.call_watch.RunWatch`),
        ``stop()`` once the store has been away past the outage limit (an outcome could not be
        recorded)."""

        def failed(exc: StoreError) -> None:
            if self.outage_over(exc):
                stop()

        entry = Watched(
            self.run_id, version, self.settings.cancel_poll_seconds, moved, failed, self.outage.recovered
        )
        self.watcher.add(entry)
        return entry

    def unwatch(self, entry: Watched) -> None:
        self.watcher.remove(entry)

    # -- the lease -------------------------------------------------------------------------------

    @contextmanager
    def kept_renewed(self, scope: anyio.CancelScope) -> Iterator[None]:
        """Keep the lease (:attr:`lease`: same token, later expiry) while the drive runs inside
        this block, through the runtime's :class:`LeaseRenewer` (one store call per interval for
        all its drives; no task of the drive's own). Stops the drive (cancels ``scope``, sets
        :attr:`lost`) when another claim replaced the lease, or when the store has been failing
        past the outage limit."""
        self._renewer.hold(self, scope)
        try:
            yield
        finally:
            self._renewer.let_go(self, scope)

    def outage_over(self, exc: StoreError) -> bool:
        """Count a store failure against the outage; True (and logged) once it is too long, or at
        once when the runtime is stopping (a shutdown does not wait for the store)."""
        if self.stopping:
            return True
        outage = self.outage
        if not outage.ongoing:
            log.warning(
                "store error during a drive; waiting up to %g s for the store: %s",
                outage.limit_seconds,
                exc,
                extra={"action": "drive_store_error", "run_id": self.run_id, "code": exc.code},
            )
        outage.failed()
        if outage.over:
            log.warning(
                "store unavailable for %.1f s: stopping the drive",
                outage.seconds,
                extra={"action": "drive_store_outage", "run_id": self.run_id},
            )
            return True
        return False

    # -- reads and fenced writes -------------------------------------------------------------------

    async def load(self) -> RunHead:
        """The run, read through a store outage up to its limit."""
        backoff = Backoff(cap=2.0)
        while True:
            try:
                head = await self.store.load(self.run_id)
            except CorruptRecord:
                # Unreadable is not unavailable: waiting would not help.
                raise
            except StoreError as exc:
                if self.outage_over(exc):
                    raise
                await anyio.sleep(backoff.next_delay())
                continue
            self.outage.recovered()
            self.held(head)
            return head

    def held(self, head: RunHead) -> None:
        """The drive holds ``head`` as the run's recorded state (read, or written by this lease's
        holder): the trace and the watcher of calls in flight learn of it, as of a read."""
        self.trace.saw(head)
        self.watcher.wrote(self.run_id, head.version)

    async def append(self, head: RunHead, facts: Sequence[Fact], new_head: RunHead | None = None) -> RunHead:
        """Record ``facts`` on top of ``head`` (compare-and-swap), fenced by the lease
        (``LeaseLost`` once another claim replaced it); a store error does not end it: see
        :meth:`_append_through_outage`. ``new_head``: ``apply_write(head, facts)`` when the caller
        has it already."""
        if new_head is None:
            new_head = apply_write(head, facts)
        stored = await self._append_through_outage(head, facts, new_head)
        # Our own write: not a move for the calls watched (told before the change feed hears of it).
        self.watcher.wrote(self.run_id, stored.version)
        self.trace.recorded(facts, stored)
        for fact in facts:
            if isinstance(fact, TaskCompleted):
                # Committed: this is the fact the store holds at that sequence number.
                self.known[fact.seq] = fact
        await self._recorded(facts, stored)
        return stored

    async def _fenced_append(self, head: RunHead, facts: Sequence[Fact], new_head: RunHead) -> RunHead:
        """``store.append`` fenced by the lease. ``LeaseLost`` ends the drive, unless a claim of
        this runtime was handed over during the write: then it is made with that one."""
        while True:
            lease = self.lease
            try:
                return await self.store.append(head.run_id, head.version, facts, new_head, lease=lease)
            except LeaseLost:
                if self.lease is lease:
                    raise

    async def _append_through_outage(
        self, head: RunHead, facts: Sequence[Fact], new_head: RunHead
    ) -> RunHead:
        """``store.append`` fenced by the lease, riding out a store outage up to its limit.

        After a failed append nobody knows whether it committed (the connection may have died
        during COMMIT), so it is never simply sent again: the run is re-read first. Still at the
        version we wrote on: nothing was written, append again (fenced again). Our facts at their
        sequence numbers: it committed, and that is the result. Anything else: another writer
        moved the run (``VersionConflict``; the drive decides again from the record). The
        compare-and-swap makes every path safe: a fact is never lost and never written twice.

        ``LeaseLost`` is not an outage: the store answered, and the answer is that another worker
        holds the run. It is raised at once, whichever append gets it, and nothing is retried."""
        run_id = head.run_id
        outage = self.outage
        try:
            stored = await self._fenced_append(head, facts, new_head)
        except CorruptRecord:
            raise
        except StoreError as exc:
            if self.outage_over(exc):
                raise
        else:
            outage.recovered()
            return stored
        backoff = Backoff(cap=2.0)
        while True:
            await anyio.sleep(backoff.next_delay())
            try:
                current = await self.store.load(run_id)
                if current.version == head.version:
                    stored = await self._fenced_append(head, facts, new_head)
                    outage.recovered()
                    return stored
                outage.recovered()
                if current.version >= new_head.version and await self._has_facts(facts):
                    log.info(
                        "an append interrupted by a store error had committed",
                        extra={"action": "append_reconciled", "run_id": run_id, "version": new_head.version},
                    )
                    return new_head
                raise VersionConflict(run_id, head.version, current.version)
            except CorruptRecord:
                raise
            except StoreError as exc:
                if self.outage_over(exc):
                    raise

    async def _has_facts(self, facts: Sequence[Fact]) -> bool:
        stored = await self.store.read_facts(self.run_id, facts[0].seq - 1, len(facts))
        return [f.model_dump(mode="json") for f in stored] == [f.model_dump(mode="json") for f in facts]


class LeaseRenewer:
    """Renews the leases of all the drives of one runtime (one process): every renewal interval
    (TTL/3), ONE store call (:meth:`RunStore.renew_leases`, one statement on SQLite and Postgres)
    renews every lease it holds, whatever their number, instead of one write per drive. Beside the
    renewals the same task runs the runtime's :class:`~orchestration.engine.call_watch.RunWatch`
    (:attr:`watch`: one batched version check per interval for the runs with calls in flight).

    Each drive's :meth:`LeasedRun.kept_renewed` registers its run here (:meth:`hold`) for as long
    as it runs, without a task of its own: the renewer's one task (started by the first run held,
    stopped when none is left) runs the renewal loop. (A task per drive waiting its turn to run the
    loop cost each live run a task and a task group, and woke them all whenever the loop's drive
    ended.) Each lease is judged as its own
    renewal was: one replaced by another claim stops its drive (``LeaseLost``), unless a claim of
    this runtime was handed over meanwhile (:meth:`LeasedRun.hand_over`: the batch is sent again
    at once, with the new lease). A store error counts against every held run's outage (each
    drive stops past its ``store_outage_seconds``) and the batch is retried sooner than the
    interval, backing off."""

    def __init__(self, store: RunStore, clock: Clock, ttl_seconds: float) -> None:
        self.store = store
        self.clock = clock
        self.ttl_seconds = ttl_seconds
        self.interval = ttl_seconds / 3
        #: the runs being kept, by run id (one drive per run in a runtime), with their drive's scope
        self._held: dict[str, tuple[LeasedRun, anyio.CancelScope]] = {}
        #: the task renewing them (:meth:`_serve`), while any is held
        self._task: asyncio.Task[None] | None = None
        #: when the next renewal is due (``anyio.current_time``)
        self._due = 0.0
        self._backoff = Backoff(base=min(0.1, self.interval), cap=self.interval)
        #: the watcher of the runs whose calls are in flight, run beside the renewals
        self.watch = RunWatch(store)

    @property
    def held(self) -> int:
        """How many leases it keeps now."""
        return len(self._held)

    def hold(self, run: LeasedRun, scope: anyio.CancelScope) -> None:
        """Keep ``run``'s lease renewed until :meth:`let_go`; cancel ``scope`` when the lease is
        lost or the store stayed away too long (see the class). The first run held starts the
        renewer's task."""
        if not self._held:
            self._due = anyio.current_time() + self.interval
        self._held[run.run_id] = (run, scope)
        if self._task is None or self._task.done():
            # A task of its own, in an empty context: not the first drive's (its trace, its
            # cancel scope), and one per runtime whatever the number of drives.
            self._task = asyncio.get_running_loop().create_task(self._serve(), context=contextvars.Context())

    def let_go(self, run: LeasedRun, scope: anyio.CancelScope) -> None:
        """Stop keeping ``run``'s lease (its drive ended); the last one stops the renewer's task."""
        if self._held.get(run.run_id, (None, None))[1] is scope:
            del self._held[run.run_id]
        if not self._held and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _serve(self) -> None:
        """The renewals, and the watch of calls in flight beside them, while runs are held. A bug
        here stops every held drive (their leases would lapse unseen), logged."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.watch.run)
                await self._run()
        except Exception:
            log.exception("the lease renewer failed; its drives stop", extra={"action": "renewer_failed"})
            for run, scope in list(self._held.values()):
                self._drop(run, scope)

    async def _run(self) -> None:
        while True:
            await anyio.sleep(max(0.0, self._due - anyio.current_time()))
            self._due = anyio.current_time() + await self._renew_all()

    async def _renew_all(self) -> float:
        """One renewal of every held lease; the delay until the next one."""
        held = list(self._held.values())
        if not held:
            return self.interval
        leases = [run.lease for run, _ in held]
        try:
            renewed = await self.store.renew_leases(leases, self.ttl_seconds, self.clock.now())
        except CorruptRecord:
            return self.interval
        except StoreError as exc:
            for run, scope in held:
                if run.outage_over(exc):
                    self._drop(run, scope)
            # Retry sooner than the renewal interval: the leases may run out meanwhile.
            return self._backoff.next_delay()
        again = False
        for (run, scope), lease in zip(held, leases, strict=True):
            kept = renewed.get(lease.run_id)
            if kept is None:
                if run.lease is not lease:
                    again = True  # a new claim was handed over meanwhile: renew that one at once
                    continue
                run.lost = True
                self._drop(run, scope)
                continue
            if run.lease is lease:
                run.lease = kept
            run.outage.recovered()
        self._backoff.reset()
        return 0.0 if again else self.interval

    def _drop(self, run: LeasedRun, scope: anyio.CancelScope) -> None:
        """Stop keeping ``run``'s lease and stop its drive."""
        if self._held.get(run.run_id, (None, None))[0] is run:
            del self._held[run.run_id]
        scope.cancel()


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


__all__ = [
    "CallControl",
    "Cancellable",
    "DriveActions",
    "LeaseReleases",
    "LeaseRenewer",
    "LeasedRun",
    "Recorded",
    "RuntimeSettings",
]

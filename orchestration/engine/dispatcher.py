"""The dispatcher: drives runnable runs in the background with bounded concurrency, inside the
server's lifespan, looking for work at start, every ``poll_seconds`` and when woken.

Where the store can claim runs in a batch (``claim_runnable``), one statement hands each run to one
claimer and a claimed lease never waits for a slot (the ones beyond the free slots are given back);
otherwise it scans, and :meth:`Runtime.drive` claims each lease. Either way a run is driven by one
drive at a time in this process, a store fault never stops the dispatcher (it backs off, then
releases the leases a failed drive could not), and a lost lease is the fence doing its job, not a
failure. With ``recover`` on, it also sweeps the runs awaiting children or agents, the safety net
for a crash.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

import anyio
from anyio.abc import TaskGroup, TaskStatus

from orchestration.core.decide import WaitUntil
from orchestration.core.models import RunHead
from orchestration.engine.backoff import Backoff
from orchestration.engine.changes import is_settled
from orchestration.engine.runtime import Runtime
from orchestration.errors import ConstructError, CorruptRecord, LeaseLost, StoreError
from orchestration.store import ClaimsRunnable, Lease, NotifiesRunnable

log = logging.getLogger("construct.dispatcher")

ClaimRunnable = Callable[[str, float, datetime, int], Awaitable[list[Lease]]]

#: How long stopping waits for the store to drop the notification subscription.
_UNLISTEN_SECONDS = 2.0


class Dispatcher:
    def __init__(
        self,
        runtime: Runtime,
        *,
        concurrency: int = 4,
        poll_seconds: float = 1.0,
        recover: bool = True,
        batch: int = 100,
        backoff: Backoff | None = None,
        child_poll_seconds: float | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.runtime = runtime
        self.concurrency = concurrency
        self.poll_seconds = poll_seconds
        self.recover = recover
        self.batch = batch
        self.backoff = backoff or Backoff(base=0.1, cap=5.0)
        self.child_poll_seconds = poll_seconds * 5 if child_poll_seconds is None else child_poll_seconds
        self._next_sweep = 0.0
        store = runtime.store
        # The store's optional abilities (orchestration.store), checked once.
        self._claim_runnable: ClaimRunnable | None = None
        if recover and isinstance(store, ClaimsRunnable):
            self._claim_runnable = store.claim_runnable
            # A run this process creates with a slot free is created leased to it and driven
            # here at once (CreatesClaimed): no claim, and the others need not hear of it.
            runtime.drive_new_runs_with(self)
        self._listen: Callable[..., Awaitable[None]] | None = None
        self._unlisten: Callable[..., Awaitable[None]] | None = None
        if isinstance(store, NotifiesRunnable):
            self._listen, self._unlisten = store.listen, store.unlisten
        self._limiter = anyio.CapacityLimiter(concurrency)
        #: the task group the drives run in, while :meth:`run` runs
        self._tg: TaskGroup | None = None
        #: the context drives start in (the dispatcher's own, not a request's: see drive_claimed)
        self._context: contextvars.Context | None = None
        self._active: set[str] = set()
        self._again: set[str] = set()
        self._woken: set[str] = set()
        #: runs whose drive a store error stopped: their lease is released once the store is back
        self._interrupted: set[str] = set()
        #: whether the last batch claim got as many runs as it asked for (more may be waiting)
        self._backlog = True
        self._wake = anyio.Event()
        self._stopping = False
        self._store_down_since: float | None = None
        self.on_idle: Callable[[], None] | None = None
        #: set when :meth:`run` has returned (after :meth:`stop`, every drive finished)
        self.stopped = anyio.Event()

    def wake(self, run_id: str | None = None) -> None:
        """Look for work now (``run_id``: at least at this run). Safe from any task.

        A run being driven here is only marked to be looked at again when its drive ends
        (:meth:`_needs_another_pass`): its change (every write of its own drive is one) needs no
        pass, whose claim would look for other work that nothing made claimable — a slot freed
        or a run made runnable elsewhere wakes the dispatcher by itself."""
        if run_id is not None:
            if run_id in self._active:
                self._again.add(run_id)
                return
            self._woken.add(run_id)
        self._wake.set()

    def has_room(self) -> bool:
        return not self._stopping and self._free() > 0

    def _free(self) -> int:
        return self.concurrency - len(self._active)

    async def drive_claimed(self, lease: Lease, head: RunHead) -> None:
        """A run this process has just created leased to itself (``Runtime.drive_new_runs_with``), ``head``
        as created: driven in a free slot at once, as a claimed one is, from that head. When none
        is free any more (taken while the run was created) or the dispatcher is not running, the
        lease is given back, and the run is claimed at a dispatcher's next pass, here or
        elsewhere."""
        if self._tg is None or self._context is None or not self.has_room() or lease.run_id in self._active:
            await self._release_unused(lease)
            return
        # Called from the task of the request that created the run: the drive is started in the
        # dispatcher's context, as every other drive, not in that request's (its MCP request
        # context, its current span), which would outlive the request in the drive.
        self._context.run(self._start, self._tg, lease.run_id, lease, head)

    def stop(self) -> None:
        """Stop taking new work; runs being driven stop at their next step boundary, and
        :meth:`run` returns once they have (await :attr:`stopped`; bound the wait yourself)."""
        self._stopping = True
        self.runtime.stop()
        self._wake.set()

    @property
    def active(self) -> frozenset[str]:
        return frozenset(self._active)

    @property
    def store_healthy(self) -> bool:
        """False from a failed scan, claim or listen until the next one that succeeds."""
        return self._store_down_since is None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled, or until :meth:`stop` and the drives in progress have returned."""
        self.runtime.add_listener(self._on_change)
        try:
            await self._run(task_status)
        finally:
            await self._stop_listening()
            self.stopped.set()

    async def _run(self, task_status: TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            # The followers of runs awaiting agents run beside the drives, in no slot.
            await tg.start(self.runtime.agent_waits.run)
            self._tg, self._context = tg, contextvars.copy_context()
            task_status.started()
            try:
                while not self._stopping:
                    self._wake = anyio.Event()
                    healthy = await self._pass(tg)
                    if self.on_idle is not None and not self._active:
                        self.on_idle()
                    delay = self.poll_seconds if healthy else self.backoff.next_delay()
                    with anyio.move_on_after(delay):
                        await self._wake.wait()
            finally:
                self._tg = self._context = None  # no drive starts from here on
            # Leaving the task group waits for the drives in progress: each returns at its next
            # step boundary because the runtime is stopping.

    # -- one pass ------------------------------------------------------------------------------

    async def _pass(self, tg: TaskGroup) -> bool:
        """Look for work once. False when the store failed (the caller backs off)."""
        woken = list(self._woken)
        self._woken.clear()
        for run_id in woken:
            if run_id in self._active:
                # It changed while being driven: look at it again when the current pass ends.
                self._again.add(run_id)
        woken = [r for r in woken if r not in self._active]
        try:
            await self._ensure_listening()
            await self._release_interrupted()
            await self._sweep_children()
            if self._claim_runnable is not None:
                await self._claim(tg)
            else:
                await self._scan(tg, woken)
        except CorruptRecord as exc:
            # A scan does not read run records; should a store do it anyway, one unreadable run
            # must not be mistaken for an outage.
            log.warning("dispatch pass failed: %s", exc, extra={"action": "dispatch_scan_failed"})
            return True
        except StoreError as exc:
            # Woken runs are not forgotten: the next pass that reaches the store looks at them.
            self._woken.update(woken)
            self._store_failed(exc)
            return False
        self._store_answered()
        return True

    async def _claim(self, tg: TaskGroup) -> None:
        """Claim as many runs as there are free slots, and drive each with its lease. Never more:
        a claimed run must be driven at once, or its lease would run out while it waits. Runs
        created claimed while the claim is in flight (:meth:`drive_claimed`) may have taken
        slots it asked for: the leases it got beyond the slots still free are given back (their
        runs are claimed at the next pass, here or elsewhere), never left waiting for a slot
        with a lease nobody renews yet. Promising the claim its slots instead would make every
        run started meanwhile a plain create, whose notification wakes every server's claim."""
        assert self._claim_runnable is not None
        free = self._free()
        if free <= 0:
            # Woken with every slot taken: what woke it may be waiting, for the next freed slot.
            self._backlog = True
            return
        runtime = self.runtime
        leases = await self._claim_runnable(
            runtime.settings.owner, runtime.settings.lease_ttl_seconds, runtime.clock.now(), free
        )
        # Fewer than asked for: nothing else was claimable. Until something wakes this
        # dispatcher for new work (a run made runnable here, a notification, the poll), a freed
        # slot needs no claim (see _drive).
        self._backlog = len(leases) >= free
        unused: list[Lease] = []
        for lease in leases:
            if lease.run_id in self._active:
                # Our own lease had run out (a stalled loop) and was claimed anew, which replaced
                # its token: the drive in progress goes on with the new lease (a second drive
                # would call twice). Between two drives of the run, the next one claims anew.
                self._again.add(lease.run_id)
                if not runtime.hand_over(lease):
                    unused.append(lease)
                continue
            if not self.has_room():
                # Taken meanwhile by runs created claimed (or the dispatcher is stopping): a
                # freed slot claims again.
                unused.append(lease)
                self._backlog = True
                continue
            self._start(tg, lease.run_id, lease)
        # Only once every drive of the batch has its slot (nothing else can take one meanwhile).
        for lease in unused:
            await self._release_unused(lease)

    async def _release_unused(self, lease: Lease) -> None:
        """Give up a claimed lease no drive will use. Best effort: the other claims of the batch
        must still be driven, and a lease that could not be released expires."""
        try:
            await self.runtime.store.release_lease(lease)
        except ConstructError as exc:
            log.info(
                "cannot release an unused lease: %s",
                exc,
                extra={"action": "lease_release_failed", "run_id": lease.run_id},
            )

    async def _scan(self, tg: TaskGroup, woken: list[str]) -> None:
        candidates = list(woken)
        if self.recover:
            candidates += await self.runtime.store.runnable(self.runtime.clock.now(), self.batch)
        for run_id in dict.fromkeys(candidates):
            if run_id in self._active:
                self._again.add(run_id)
                continue
            self._start(tg, run_id, None)

    def _start(self, tg: TaskGroup, run_id: str, lease: Lease | None, head: RunHead | None = None) -> None:
        self._active.add(run_id)
        tg.start_soon(self._drive, run_id, lease, head)

    async def _sweep_children(self) -> None:
        """Every ``child_poll_seconds``: the child runs' safety net (see the module docstring)."""
        now = anyio.current_time()
        if not self.recover or now < self._next_sweep:
            return
        self._next_sweep = now + self.child_poll_seconds
        await self.runtime.children.sweep()
        await self.runtime.agent_waits.sweep()

    async def _release_interrupted(self) -> None:
        """Release the leases that interrupted drives could not release while the store was away,
        so that their runs can be claimed at once rather than when the leases expire."""
        for run_id in sorted(self._interrupted):
            if run_id in self._active:
                # Driven again already (with a lease of its own, which must not be released here).
                self._interrupted.discard(run_id)
                continue
            await self.runtime.release_unreleased(run_id)
            self._interrupted.discard(run_id)
            self._woken.add(run_id)

    # -- store health ----------------------------------------------------------------------------

    def _store_failed(self, exc: StoreError) -> None:
        now = anyio.current_time()
        if self._store_down_since is None:
            self._store_down_since = now
            log.warning(
                "store unavailable; retrying with backoff: %s",
                exc,
                extra={"action": "dispatch_store_unavailable", "code": exc.code},
            )
        else:
            log.debug(
                "store still unavailable after %.1f s: %s",
                now - self._store_down_since,
                exc,
                extra={"action": "dispatch_store_unavailable", "code": exc.code},
            )

    def _store_answered(self) -> None:
        self.backoff.reset()
        if self._store_down_since is not None:
            log.info(
                "store is back after %.1f s",
                anyio.current_time() - self._store_down_since,
                extra={"action": "dispatch_store_back"},
            )
            self._store_down_since = None

    # -- notifications ---------------------------------------------------------------------------

    async def _ensure_listening(self) -> None:
        """Subscribe to the store's notifications (a no-op while subscribed; reconnects after the
        connection dropped). Raises the store's error while it is unreachable."""
        if self._listen is not None and not self._stopping:
            await self._listen(self._on_notification, self._on_notifications_lost)

    def _on_notification(self, run_id: str) -> None:
        self.runtime.renewer.watch.notify(run_id)
        self.wake(run_id)

    def _on_notifications_lost(self) -> None:
        # Listen again (and scan: what was sent meanwhile is lost) without waiting for the poll.
        self._wake.set()

    async def _stop_listening(self) -> None:
        if self._unlisten is None:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(_UNLISTEN_SECONDS):
            try:
                await self._unlisten(self._on_notification)
            except ConstructError as exc:
                log.info("cannot unsubscribe: %s", exc, extra={"action": "dispatch_unlisten_failed"})

    async def _on_change(self, head: RunHead) -> None:
        self.runtime.renewer.watch.changed(head.run_id, head.version)
        if head.status.kind == "active":
            self.wake(head.run_id)

    # -- driving -------------------------------------------------------------------------------

    async def _drive(self, run_id: str, lease: Lease | None, head: RunHead | None = None) -> None:
        """Drive the run in a slot, again while it changes meanwhile and still needs driving,
        until a drive fails or the dispatcher stops; then free the slot."""
        try:
            if lease is None:
                await self._limiter.acquire()
            elif not self._slot_now():
                # Not expected (a drive with a lease is only started in a slot counted free): a
                # lease must not wait for a slot, it would run out unrenewed meanwhile and the
                # run be taken over mid-call.
                log.warning(
                    "no slot for a claimed run; its lease is given back",
                    extra={"action": "claim_without_slot", "run_id": run_id},
                )
                await self._release_unused(lease)
                return
            try:
                while not self._stopping:
                    self._again.discard(run_id)
                    if not await self._drive_once(run_id, lease, head):
                        break
                    # A later pass claims the lease itself (this one was released with the drive)
                    # and reads the run.
                    lease, head = None, None
                    if not await self._needs_another_pass(run_id):
                        break
            finally:
                self._limiter.release()
        finally:
            self._active.discard(run_id)
            if self._claim_runnable is not None and self._backlog:
                # A slot is free and the last claim filled every slot it had: there may be more
                # runnable runs waiting, so claim now rather than at the next poll.
                self._wake.set()

    def _slot_now(self) -> bool:
        try:
            self._limiter.acquire_nowait()
        except anyio.WouldBlock:
            return False
        return True

    async def _drive_once(self, run_id: str, lease: Lease | None, head: RunHead | None = None) -> bool:
        """One :meth:`Runtime.drive` of the run. False when it failed (logged; the run is left
        until something wakes it); a lost lease is not a failure."""
        try:
            action = await self.runtime.drive(run_id, lease=lease, head=head)
        except LeaseLost:
            # Another worker claimed the run while this drive stalled; the drive recorded
            # nothing more. Not a failure: the run is the holder's now.
            log.info(
                "run %s is held by another worker; left to it",
                run_id,
                extra={"action": "drive_lease_lost", "run_id": run_id},
            )
            return True
        except CorruptRecord as exc:
            _log_failed(run_id, exc)
            return False
        except StoreError as exc:
            # The drive stopped cleanly at a store outage; its lease is released (or expires)
            # and the run is resumed from its facts once the store is back.
            self._interrupted.add(run_id)
            log.warning(
                "run %s interrupted by the store: %s",
                run_id,
                exc,
                extra={"action": "drive_interrupted", "run_id": run_id, "code": exc.code},
            )
            return False
        except ConstructError as exc:
            _log_failed(run_id, exc)
            return False
        except Exception:
            log.exception("drive crashed", extra={"action": "drive_crashed", "run_id": run_id})
            return False
        if isinstance(action, WaitUntil):
            log.info(
                "run %s waits until %s",
                run_id,
                action.not_before.isoformat(),
                extra={"action": "durable_wait", "run_id": run_id},
            )
        return True

    async def _needs_another_pass(self, run_id: str) -> bool:
        """Whether something woke the run while it was being driven, and it still needs driving.

        Every write wakes the run (this process's own writes too), so a wake alone says little; the
        run's state decides. The check repeats while wakes keep arriving, so a change that lands
        after the read is not missed: its wake arrives before this run leaves the active set."""
        while run_id in self._again and not self._stopping:
            self._again.discard(run_id)
            try:
                head = await self.runtime.store.load(run_id)
            except ConstructError:
                # Let the drive find out what is wrong (and report it the usual way).
                return True
            if not is_settled(head, self.runtime.clock.now()):
                return True
        return False


def _log_failed(run_id: str, exc: ConstructError) -> None:
    """Log a drive that could not advance the run (an error other than a store outage)."""
    log.warning(
        "run %s could not be advanced: %s",
        run_id,
        exc,
        extra={"action": "drive_failed", "run_id": run_id, "code": exc.code},
    )

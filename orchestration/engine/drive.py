"""The decide → act → record loop that advances a run (DESIGN §1): one :class:`Drive` per drive of one
run, made by :meth:`Runtime.drive <orchestration.engine.runtime.Runtime.drive>` once it holds the
run's lease; the run under that lease is a :class:`~orchestration.engine.leased_run.LeasedRun`.

Every decision is made from the recorded state, so a restarted process makes exactly the decision
the crashed one would have: after a successful compare-and-swap the head it wrote *is* the recorded
state, so the loop decides from it without reading back; after a failed one (``VersionConflict``), a
wait, or a call that ended without an outcome, it reads the run again. Every write carries the
lease: a run claimed again meanwhile stops the drive at its next write or renewal (``LeaseLost``,
nothing more recorded); a store failing past ``store_outage_seconds`` stops it (``StoreUnavailable``).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

import anyio

from orchestration.chains.prompts import TaskPrompt
from orchestration.core.action_facts import outcome_fact, recorded_fact
from orchestration.core.decide import (
    PAUSING_ACTIONS,
    Action,
    AwaitChild,
    PrepareHostTask,
    StartAttempt,
    StartChild,
    WaitUntil,
    next_action,
)
from orchestration.core.facts import AttemptStarted, Fact, TaskCompleted
from orchestration.core.fold import apply, apply_write
from orchestration.core.graph import is_parallel
from orchestration.core.models import ChainStep, RunHead
from orchestration.engine.agent_waits import giving_up
from orchestration.engine.delegation import agent_attempt
from orchestration.engine.fanout import Fanout
from orchestration.engine.leased_run import LeasedRun
from orchestration.engine.reading import read_prompt
from orchestration.errors import (
    ConstructError,
    InvalidState,
    LeaseLost,
    StoreUnavailable,
    VersionConflict,
)
from orchestration.store import Lease
from orchestration.workers.host import host_task_prepared
from orchestration.workers.port import DeltaSink, TaskWorker

if TYPE_CHECKING:
    from orchestration.engine.children import ChildRuns

# The drive's events keep the logger they had when the loop lived in the runtime module.
log = logging.getLogger("construct.runtime")


class Drive:
    """One drive of one run: it advances the run until it pauses or ends (:meth:`run`). It holds
    the loop's state and the services it uses: :attr:`leased` — the run under its lease, read and
    written through it, with the services shared with the runtime that made it (the store, the
    clock, the change notification, the cancel scopes of calls in flight and the stopping flag) —
    the worker, and the runtime's child runs. Releasing the lease afterwards is the caller's part:
    see :attr:`lease`."""

    def __init__(
        self,
        leased: LeasedRun,
        *,
        worker: TaskWorker | None,
        children: ChildRuns | None = None,
        head: RunHead | None = None,
        sink: DeltaSink | None = None,
    ) -> None:
        #: the run under the drive's lease (:mod:`orchestration.engine.leased_run`)
        self.leased = leased
        self.run_id = leased.run_id
        self.worker = worker
        #: where the worker's calls hand their output as it is written
        self.sink = sink
        #: creates a step's child run and records its end (:mod:`orchestration.engine.children`)
        self.children = children
        #: the run as the lease's holder wrote it last (a run it created claimed), to start from
        #: without reading it; None: the drive reads it first
        self._first = head

    @property
    def lease(self) -> Lease:
        """The lease the drive holds, and the one to release once :meth:`run` returns (see
        :attr:`LeasedRun.lease <orchestration.engine.leased_run.LeasedRun.lease>`)."""
        return self.leased.lease

    def hand_over(self, lease: Lease) -> None:
        """Carry ``lease`` (a newer claim of the run by the same owner) from now on."""
        self.leased.hand_over(lease)

    async def run(self) -> Action | None:
        """Advance the run until it pauses or ends, and return the pausing action; None when the
        runtime is stopping. Raises ``LeaseLost`` once another claim replaced the lease,
        ``StoreUnavailable`` once the store has been failing past the outage limit, and what else
        the loop met (``CorruptRecord`` for an unreadable record) as itself."""
        with self.leased.trace.drive():
            return await self._drive()

    async def _drive(self) -> Action | None:
        leased = self.leased
        result: Action | None = None
        error: ConstructError | None = None
        with anyio.CancelScope() as scope, leased.kept_renewed(scope):
            try:
                result = await self._loop()
            except ConstructError as exc:
                error = exc
        if error is None and result is None and leased.lost:
            # The lease keeper found the lease taken by another claim and stopped the drive.
            error = LeaseLost(
                f"the lease on run {self.run_id} was claimed by another worker while "
                f"{leased.settings.owner} held it; this drive stopped and leaves the run to the new holder"
            )
        elif error is None and result is None and leased.outage.over:
            # The lease keeper stopped the drive: the store stayed away too long.
            error = StoreUnavailable(
                f"the store did not answer for {leased.outage.seconds:.0f} s (store_outage_seconds is "
                f"{leased.settings.store_outage_seconds:g}); run {self.run_id} stopped and resumes from "
                "its facts"
            )
        if isinstance(error, LeaseLost):
            log.info(
                "lease lost: another worker holds the run; this drive stops",
                extra={"action": "lease_lost", "run_id": self.run_id},
            )
        if error is not None:
            raise error
        return result

    # -- decide -> act -> record ---------------------------------------------------------------

    async def _loop(self) -> Action | None:
        # The run as recorded: read from the store, or the head our last compare-and-swap wrote
        # (a successful one proves that head is the recorded state); None: read it again.
        leased = self.leased
        head, self._first = self._first, None
        if head is not None:
            leased.held(head)
        while not leased.stopping:
            if head is None:
                head = await leased.load()
            if is_parallel(head.chain):
                # Several steps may be ready at once: see orchestration.engine.fanout.
                return await Fanout(leased, self, self.worker, self.sink).run()
            action = next_action(head, leased.clock.now())
            if isinstance(action, WaitUntil):
                delay = (action.not_before - leased.clock.now()).total_seconds()
                if delay <= leased.settings.in_memory_wait_cap_seconds:
                    await anyio.sleep(max(0.0, delay))
                    head = None
                    continue
                return action
            if isinstance(action, AwaitChild) and await self.child_moved(head, action.task_id):
                head = None
                continue
            if isinstance(action, PAUSING_ACTIONS):
                return action
            try:
                head = await self.act(head, action)
            except VersionConflict:
                # Someone else wrote (an approval, a cancel): re-read and decide again.
                head = None
                continue
        return None

    async def act(self, head: RunHead, action: Action) -> RunHead | None:
        """Do ``action``; the head its last write recorded, or None when the run must be read
        again (a provider call that ended without an outcome to record)."""
        leased = self.leased
        now = leased.clock.now()
        fact = recorded_fact(head, action, now)
        if fact is not None:
            # A fact that ends a wait for remote runs (a deadline) cancels them first.
            seconds = leased.settings.remote_cancel_seconds
            stored = await leased.append(head, await giving_up(self.worker, head, [fact], seconds))
            if isinstance(action, StartChild):
                return None if await self.child_moved(stored, action.task_id) else stored
            return stored
        if isinstance(action, PrepareHostTask):
            prompt = await read_prompt(leased.store, head, action.task_id, leased.known)
            return await leased.append(head, [host_task_prepared(head, prompt, action.attempt, now)])
        if isinstance(action, StartAttempt):
            if head.step_of(action.task_id).agent is not None:
                return await agent_attempt(leased, self.worker, head, action)
            return await self._attempt(head, action)
        raise AssertionError(action)  # pragma: no cover - pausing actions never reach here

    async def child_moved(self, head: RunHead, task_id: str) -> bool:
        """Make sure the child of ``task_id`` exists and record its end if it ended; True when the
        run changed (decide again from the store)."""
        if self.children is None:
            raise InvalidState(f"run {head.run_id}: this runtime does not run child chains")
        return await self.children.ensure(head, task_id)

    async def _attempt(self, head: RunHead, action: StartAttempt) -> RunHead | None:
        """Provider attempts: record ``attempt_started`` *before* the call, call, record the
        outcome; returns the head the last write recorded (None when a call ended without an
        outcome: cancelled, out of time). A crash in between leaves a ``running`` task: an orphan
        the next worker retries. Every write is fenced by the drive's lease: a drive that lost it
        meanwhile records no outcome (``LeaseLost``), and the worker that holds the run decides
        about the task.

        **One write per boundary.** When the decision on the run with the outcome folded in is
        again :class:`StartAttempt` (the next task, or a retry without a wait), that decision is
        made from recorded facts plus the outcome alone, so the outcome and the next
        ``attempt_started`` are recorded together in one atomic write, and the next call follows.
        A crash leaves either neither fact (the call's outcome is lost: its attempt is an orphan,
        as before) or both (the next attempt is the orphan). Anything else the run needs next (a
        gate, a host task, the end, a wait) is decided by the loop after the outcome's own write."""
        if self.worker is None:
            raise InvalidState(
                f"run {head.run_id} uses the provider backend, which this server has not configured"
            )
        leased = self.leased
        prompt = await read_prompt(leased.store, head, action.task_id, leased.known)
        started = self._started(head, action, leased.clock.now(), head.step_of(action.task_id))
        head = await leased.append(head, [started])
        while True:
            fact = await self._call(head, action, prompt, started.executor)
            if fact is None:
                return None
            after = apply_write(head, [fact])
            now = leased.clock.now()
            following = None if leased.stopping else next_action(after, now)
            if not isinstance(following, StartAttempt):
                return await leased.append(head, [fact])
            step = after.step_of(following.task_id)
            if step.agent is not None:
                return await leased.append(head, [fact])
            if isinstance(fact, TaskCompleted):
                # For the next prompt; dropped again below unless the write commits.
                leased.known[fact.seq] = fact
            try:
                prompt = await read_prompt(leased.store, after, following.task_id, leased.known)
                started = self._started(after, following, now, step)
                # apply_write(head, [fact, started]) without folding the outcome again: ``after`` is
                # it folded, with the version this write gives the run.
                head = await leased.append(head, [fact, started], apply(after, started))
            except BaseException:
                leased.known.pop(fact.seq, None)
                raise
            action = following

    def _started(self, head: RunHead, action: StartAttempt, now: datetime, step: ChainStep) -> AttemptStarted:
        """The ``attempt_started`` fact of ``action`` on top of ``head`` (``step``: its task's)."""
        return AttemptStarted(
            seq=head.last_seq + 1,
            at=now,
            task_id=action.task_id,
            attempt=action.attempt,
            executor=head.contract.executor_for(step),
            possible_duplicate_call=action.possible_duplicate_call,
        )

    async def _call(
        self, head: RunHead, action: StartAttempt, prompt: TaskPrompt, executor: str
    ) -> Fact | None:
        """The call of the attempt ``head`` records as started (by ``executor``); the outcome's fact
        (not yet recorded), or None when the call ended without an outcome."""
        leased = self.leased
        task = head.task(action.task_id)
        step = head.chain.step(task.step_name)
        previous = tuple(a.error for a in task.attempts if a.error is not None)
        run_id = head.run_id
        scope = anyio.CancelScope()
        leased.track_call(scope)
        outcome = None
        began = anyio.current_time()
        # The call may not outlive the run's or the task's deadline.
        limit = head.wake_at
        if limit is not None:
            scope.deadline = began + max(0.0, (limit - leased.clock.now()).total_seconds())

        def moved(_version: int) -> None:
            # Written to by anyone else since the call began (in practice: cancelled from another
            # process or another client): the outcome could not be recorded on top of it.
            log.info("run changed during a call", extra={"action": "call_aborted", "run_id": run_id})
            scope.cancel()

        # Watched by the runtime's one watcher (orchestration.engine.call_watch), not by a task here.
        watched = leased.watch(head.version, moved, scope.cancel)
        try:
            with (
                scope,
                leased.trace.attempt(
                    head, action.task_id, action.attempt, action.possible_duplicate_call
                ) as traced,
            ):
                outcome = await self.worker.execute(  # type: ignore[union-attr]
                    head.contract, step, prompt, action.attempt, previous, self.sink
                )
                traced.ended(outcome)
        finally:
            leased.unwatch(watched)
            leased.untrack_call(scope)
        if outcome is None:
            if leased.outage.over:
                # Stopped by the store outage: the attempt is left as an orphan, retried later.
                raise StoreUnavailable(
                    f"the store did not answer for {leased.outage.seconds:.0f} s; the call for task "
                    f"{action.task_id} of run {run_id} was cancelled and will be retried"
                )
            # Cancelled by orchestrate_cancel (the cancel fact is already recorded) or out of time.
            # In the second case, let the injected clock reach the deadline too, so that the next
            # decision records deadline_exceeded instead of seeing an orphaned attempt.
            if limit is not None and anyio.current_time() >= scope.deadline:
                await anyio.sleep(max(0.0, (limit - leased.clock.now()).total_seconds()))
            return None
        # The outcome is recorded against the head our attempt_started write produced: if anything
        # was written since (a cancel), the compare-and-swap fails and the loop decides again.
        return outcome_fact(head, action, executor, outcome, leased.clock.now())


__all__ = ["Drive"]

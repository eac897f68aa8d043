"""The drive of a run of a parallel chain (:mod:`orchestration.core.graph`): several ready steps at once,
still decide → act → record, with :func:`~orchestration.core.decide.next_actions`.

``attempt_started`` is recorded before each call, and a call's outcome is recorded against the run
as it is when the call ends (re-read, fold, append, again on a conflict), dropped only when the run
ended or the task left that attempt. Writes go one at a time per run through one lock, each fenced
by the lease; only a cancel, a deadline or a lost lease stops a call, never a sibling.
"""

from __future__ import annotations

import logging
from datetime import datetime

import anyio
import anyio.abc

from orchestration.chains.prompts import TaskPrompt
from orchestration.core.action_facts import outcome_fact
from orchestration.core.decide import (
    PAUSING_ACTIONS,
    Action,
    AwaitChild,
    AwaitHost,
    FailTask,
    PrepareHostTask,
    RequestBudget,
    StartAttempt,
    WaitUntil,
    next_actions,
)
from orchestration.core.models import RunHead
from orchestration.core.outcomes import AttemptOutcome
from orchestration.core.vocabulary import TaskStatus
from orchestration.core.wake import task_deadline
from orchestration.engine.call_watch import Watched
from orchestration.engine.delegation import attempt_started, parallel_agent_call
from orchestration.engine.leased_run import DriveActions, LeasedRun
from orchestration.engine.reading import read_prompt
from orchestration.errors import (
    ConstructError,
    CorruptRecord,
    InvalidState,
    StoreError,
    StoreUnavailable,
    VersionConflict,
)
from orchestration.workers.port import DeltaSink, TaskWorker

log = logging.getLogger("construct.runtime")


def _task_of(action: Action) -> str | None:
    # A budget refusal names its task: for a call in flight in this drive it is the rule counting
    # the call's own reservation (decide cannot tell it from an orphan), and is left out.
    if isinstance(action, (StartAttempt, PrepareHostTask, AwaitHost, FailTask, RequestBudget)):
        return action.task_id
    return None


class ScopeSet:
    """The cancel scopes of a run's calls in flight; :meth:`cancel` (the runtime's cancel) stops
    them all."""

    def __init__(self) -> None:
        self.scopes: set[anyio.CancelScope] = set()
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        for scope in list(self.scopes):
            scope.cancel()


class Fanout:
    """The parallel loop of one :class:`~orchestration.engine.drive.Drive`: it reads and writes the
    run through the drive's :class:`~orchestration.engine.leased_run.LeasedRun` (its lease fence and
    outage handling), has the drive act on what it records (:class:`DriveActions`), and calls
    ``worker``."""

    def __init__(
        self, leased: LeasedRun, drive: DriveActions, worker: TaskWorker | None, sink: DeltaSink | None = None
    ) -> None:
        self.leased = leased
        self.drive = drive
        self.worker = worker
        self.sink = sink
        self.in_flight: set[str] = set()
        self.lock = anyio.Lock()
        self.changed = anyio.Event()
        self.calls = ScopeSet()
        #: the error that stopped a call's recording (a lost lease, the store gone): ends the drive
        self.error: ConstructError | None = None
        #: the run watched while calls are in flight (None when none is)
        self._watched: Watched | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        #: a read of the run after a move is in flight / another move came meanwhile
        self._checking = False
        self._recheck = False

    def _wake(self) -> None:
        self.changed.set()

    async def _wait_for_change(self, seconds: float | None) -> None:
        with anyio.move_on_after(seconds):
            await self.changed.wait()
        self.changed = anyio.Event()

    async def run(self) -> Action | None:
        leased = self.leased
        leased.track_call(self.calls)
        try:
            result: Action | None = None
            error: ConstructError | None = None
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                try:
                    result = await self._loop(tg)
                except ConstructError as exc:
                    # Raised outside the task group, so that the caller gets the error itself.
                    error = exc
                finally:
                    self.calls.cancel()
                    tg.cancel_scope.cancel()
            error = error or self.error
            if error is not None:
                raise error
            return result
        finally:
            self._unwatch()
            leased.untrack_call(self.calls)

    async def _loop(self, tg: anyio.abc.TaskGroup) -> Action | None:
        leased = self.leased
        while True:
            if self.error is not None:
                raise self.error
            if leased.outage.over:
                raise StoreUnavailable(
                    f"the store did not answer for {leased.outage.seconds:.0f} s; the calls of run "
                    f"{leased.run_id} were stopped and will be retried"
                )
            if leased.stopping:
                # A graceful shutdown starts nothing more, and lets the calls in flight end and
                # their outcomes be recorded, as a linear drive finishes its one call.
                if not self.in_flight:
                    return None
                await self._wait_for_change(None)
                continue
            async with self.lock:
                head = await leased.load()
                now = leased.clock.now()
                every = next_actions(head, now)
                if head.status.is_terminal:
                    return every[0]
                actions = [a for a in every if _task_of(a) not in self.in_flight]
                record = [a for a in actions if not isinstance(a, (*PAUSING_ACTIONS, StartAttempt))]
                starts = [a for a in actions if isinstance(a, StartAttempt)]
                try:
                    if record:
                        await self.drive.act(head, record[0])
                        continue
                    if starts and len(self.in_flight) < head.chain.max_parallel:
                        await self._start(tg, head, starts[0])
                        continue
                except VersionConflict:
                    continue
            if self.in_flight:
                await self._wait_for_change(self._wait_seconds(actions, now))
                continue
            if not actions:  # pragma: no cover - next_actions always names something
                return None
            if await self._children_moved(head, actions):
                continue
            pause = actions[0]
            if isinstance(pause, WaitUntil):
                delay = (pause.not_before - leased.clock.now()).total_seconds()
                if delay <= leased.settings.in_memory_wait_cap_seconds:
                    await anyio.sleep(max(0.0, delay))
                    continue
            # A durable wait first: the dispatcher schedules the run's wake-up from it.
            return next((a for a in actions if isinstance(a, WaitUntil)), pause)

    async def _children_moved(self, head: RunHead, actions: list[Action]) -> bool:
        """Before pausing: make sure every child the run waits for exists, and record those that
        ended (:mod:`orchestration.engine.children`); True when that changed the run."""
        moved = False
        for action in actions:
            if isinstance(action, AwaitChild):
                moved = await self.drive.child_moved(head, action.task_id) or moved
        return moved

    def _wait_seconds(self, actions: list[Action], now: datetime) -> float | None:
        """How long to wait for a call's end before deciding again: until the earliest
        retry-after among the actions, if it is short enough to wait for in memory."""
        waits = [a.not_before for a in actions if isinstance(a, WaitUntil)]
        if not waits:
            return None
        delay = (min(waits) - now).total_seconds()
        return max(0.0, delay) if delay <= self.leased.settings.in_memory_wait_cap_seconds else None

    async def _start(self, tg: anyio.abc.TaskGroup, head: RunHead, action: StartAttempt) -> None:
        """Record ``attempt_started`` for ``action`` and start its call in the background."""
        leased = self.leased
        if self.worker is None:
            raise InvalidState(
                f"run {head.run_id} uses the provider backend, which this server has not configured"
            )
        step = head.step_of(action.task_id)
        executor = head.contract.executor_for(step)
        # A step that delegates has no prompt: its call is built from the record when it is made.
        prompt = None if step.agent else await read_prompt(leased.store, head, action.task_id, leased.known)
        started = attempt_started(head, action, executor, leased.clock.now())
        head = await leased.append(head, [started])
        if started.waits:
            return  # a recorded remote run, followed outside the drive (awaiting_agent)
        if self._watched is None:
            self._watched = leased.watch(head.version, self._moved, self._stop)
        self.in_flight.add(action.task_id)
        tg.start_soon(self._call, head, action, executor, prompt)

    async def _call(
        self, head: RunHead, action: StartAttempt, executor: str, prompt: TaskPrompt | None
    ) -> None:
        """One call in flight, then its outcome recorded (see the module's docstring)."""
        leased = self.leased
        task_id = action.task_id
        task = head.task(task_id)
        step = head.step_of(task_id)
        previous = tuple(a.error for a in task.attempts if a.error is not None)
        limits = [t for t in (head.deadline_at, task_deadline(head, task)) if t is not None]
        limit = min(limits) if limits else None
        scope = anyio.CancelScope()
        if limit is not None:
            scope.deadline = anyio.current_time() + max(0.0, (limit - leased.clock.now()).total_seconds())
        outcome: AttemptOutcome | None = None
        self.calls.scopes.add(scope)
        try:
            with scope:
                if not self.calls.cancelled:
                    with leased.trace.attempt(
                        head, task_id, action.attempt, action.possible_duplicate_call
                    ) as traced:
                        if prompt is None:  # an agent step (orchestration.engine.delegation)
                            outcome = await parallel_agent_call(
                                leased, self.worker, self.lock, head, action, previous
                            )
                        else:
                            assert self.worker is not None
                            outcome = await self.worker.execute(
                                head.contract, step, prompt, action.attempt, previous, self.sink
                            )
                        if outcome is not None:  # None: awaited outside the drive
                            traced.ended(outcome)
            if outcome is None:
                if limit is not None and not self.calls.cancelled and anyio.current_time() >= scope.deadline:
                    # Out of time: let the injected clock reach the deadline too, so that the next
                    # decision records deadline_exceeded instead of seeing an orphaned attempt.
                    await anyio.sleep(max(0.0, (limit - leased.clock.now()).total_seconds()))
                return
            try:
                await self._record(action, executor, outcome)
            except ConstructError as exc:
                # A lost lease or a store gone past its outage limit: the drive stops, and the
                # attempt is left to whoever holds the run next (an orphan, retried).
                self.error = self.error or exc
                self.calls.cancel()
        finally:
            self.calls.scopes.discard(scope)
            self.in_flight.discard(task_id)
            if not self.in_flight:
                self._unwatch()
            self._wake()

    async def _record(self, action: StartAttempt, executor: str, outcome: AttemptOutcome) -> None:
        """Record the outcome of ``action``'s call against the run as it is now."""
        leased = self.leased
        while True:
            async with self.lock:
                head = await leased.load()
                if head.status.is_terminal:
                    return
                task = head.task(action.task_id)
                last = task.attempts[-1] if task.attempts else None
                if task.status != TaskStatus.RUNNING or last is None or last.number != action.attempt:
                    log.info(
                        "a call's outcome no longer applies: the task moved on",
                        extra={
                            "action": "outcome_dropped",
                            "run_id": leased.run_id,
                            "task_id": action.task_id,
                        },
                    )
                    return
                try:
                    await leased.append(
                        head, [outcome_fact(head, action, executor, outcome, leased.clock.now())]
                    )
                except VersionConflict:
                    continue
                return

    def _unwatch(self) -> None:
        if self._watched is not None:
            self.leased.unwatch(self._watched)
            self._watched = None

    def _stop(self) -> None:
        """The store has been away past the outage limit: stop every call."""
        self.calls.cancel()
        self._wake()

    def _moved(self, _version: int) -> None:
        """Someone else (or a sibling's write not yet returned) moved the run: read it once."""
        self._recheck = True
        if not self._checking and self._task_group is not None:
            self._checking = True
            self._task_group.start_soon(self._check_ended)

    async def _check_ended(self) -> None:
        """Stop the calls in flight once the run has ended (a cancel from anywhere, a sibling's
        failure), or once the store has been away past the outage limit."""
        leased = self.leased
        try:
            while self._recheck and self.in_flight:
                self._recheck = False
                try:
                    head = await leased.store.load(leased.run_id)
                except CorruptRecord:
                    continue
                except StoreError as exc:
                    if leased.outage_over(exc):
                        self._stop()
                    continue
                except ConstructError:
                    continue
                leased.outage.recovered()
                if head.status.is_terminal:
                    log.info(
                        "run ended during its calls",
                        extra={"action": "call_aborted", "run_id": leased.run_id},
                    )
                    self.calls.cancel()
                    return
        finally:
            self._checking = False


__all__ = ["Fanout", "ScopeSet"]

"""The drive's part of an agent step (the step's rules: :mod:`orchestration.core.agent_steps`; the MCP
client: :mod:`orchestration.workers.mcp_agents`): one attempt as decide → act → record, with
``remote_run_started`` recorded as soon as the answer names a remote run, before it is followed.

So a crash at any point leaves a ``running`` task whose next attempt follows the same remote run
(never starts a second), and a remote run that has not ended is recorded with ``waits`` and left to
:mod:`orchestration.engine.agent_waits`, the drive giving back its lease and its slot.
"""

from __future__ import annotations

import logging
from datetime import datetime

import anyio

from orchestration.core.action_facts import outcome_fact
from orchestration.core.agent_steps import idempotency_key, render_arguments, template_steps
from orchestration.core.decide import StartAttempt
from orchestration.core.facts import AttemptStarted, Fact, RemoteRunStarted
from orchestration.core.models import RunHead, TypedError
from orchestration.core.outcomes import AttemptOutcome
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.leased_run import LeasedRun
from orchestration.engine.reading import read_outputs
from orchestration.errors import (
    ConstructError,
    InvalidState,
    StoreUnavailable,
    VersionConflict,
)
from orchestration.store import RunStore
from orchestration.workers.agent_calls import AgentCall, AgentDelegate
from orchestration.workers.port import TaskWorker

log = logging.getLogger("construct.runtime")

#: the record format of a fact that makes a run ``awaiting_agent``
WAITS_FORMAT = 6


def agent_worker(worker: TaskWorker | None) -> AgentDelegate | None:
    """The agent worker ``worker`` (a drive's) carries: its ``agents`` (see
    :class:`~orchestration.workers.mcp_agents.Workers`), or the worker itself when it delegates."""
    agents = getattr(worker, "agents", worker)
    return agents if callable(getattr(agents, "delegate", None)) else None  # type: ignore[return-value]


def _delegate_for(worker: TaskWorker | None, head: RunHead) -> AgentDelegate:
    """The agent worker of ``worker``, or ``InvalidState`` for a run with an agent step."""
    delegate = agent_worker(worker)
    if delegate is None:
        raise InvalidState(f"run {head.run_id} has an agent step, and this server has no agent worker")
    return delegate


async def build_call(
    store: RunStore, head: RunHead, action: StartAttempt, known: dict[int, Fact] | None = None
) -> AgentCall:
    """The call of ``action``'s attempt, from the record only (``known``: facts read already)."""
    step = head.step_of(action.task_id)
    assert step.agent is not None
    latest: dict[str, str] = {}
    for task in head.tasks:
        if task.status == TaskStatus.DONE and task.step_name in template_steps(step.agent.arguments):
            latest[task.step_name] = task.task_id
    outputs = await read_outputs(store, head, list(latest.values()), known)
    arguments = render_arguments(
        step.agent,
        request=head.request,
        outputs={name: outputs[tid] for name, tid in latest.items()},
        run_id=head.run_id,
        task_id=action.task_id,
    )
    return AgentCall(
        run_id=head.run_id,
        task_id=action.task_id,
        attempt=action.attempt,
        agent=step.agent,
        arguments=arguments,
        idempotency_key=idempotency_key(head.run_id, action.task_id, action.follows or action.attempt),
        remote_run_id=action.remote_run_id,
        output_schema=step.output_schema,
        delegation=head.delegation,
    )


async def agent_attempt(
    leased: LeasedRun, worker: TaskWorker | None, head: RunHead, action: StartAttempt
) -> RunHead | None:
    """One attempt of an agent step in a linear drive (see the module's docstring); the head the
    last write recorded (``awaiting_agent`` once the remote run is awaited outside the drive),
    or None when the call ended without an outcome (cancelled, out of time)."""
    delegate = _delegate_for(worker, head)
    executor = head.contract.executor_for(head.step_of(action.task_id))
    started = attempt_started(head, action, executor, leased.clock.now())
    if started.waits:
        # A recorded remote run is followed outside the drive: the run awaits the agent.
        return await leased.append(head, [started])
    call = await build_call(leased.store, head, action, leased.known)
    attempt = _AgentCall(leased, action, call, await leased.append(head, [started]))
    outcome = await attempt.run(delegate)
    if attempt.detached:
        return attempt.current  # awaiting_agent: the drive pauses (AwaitAgent)
    if outcome is None:
        await attempt.ended_without_outcome(delegate)
        return None
    fact = outcome_fact(attempt.current, action, executor, outcome, leased.clock.now())
    return await leased.append(attempt.current, [fact])


def attempt_started(head: RunHead, action: StartAttempt, executor: str, now: datetime) -> AttemptStarted:
    """The ``attempt_started`` fact of an agent step's ``action``: one that follows a recorded
    remote run of another construct-mcp waits for it outside the drive (``waits``, record
    format 6: :mod:`orchestration.engine.agent_waits`)."""
    step = head.step_of(action.task_id)
    waits = action.remote_run_id is not None and step.agent is not None and step.agent.follows_runs
    return AttemptStarted(
        seq=head.last_seq + 1,
        at=now,
        task_id=action.task_id,
        attempt=action.attempt,
        executor=executor,
        possible_duplicate_call=action.possible_duplicate_call,
        follows=action.follows,
        remote_run_id=action.remote_run_id,
        waits=waits,
        format=WAITS_FORMAT if waits else 1,
    )


def remote_run_started(
    head: RunHead, action: StartAttempt, agent: str, remote_run_id: str, ended: bool, now: datetime
) -> RemoteRunStarted:
    """The ``remote_run_started`` fact of ``action``'s call: a remote run that had not ended when
    its id came back is followed outside the drive (``waits``, record format 6)."""
    return RemoteRunStarted(
        seq=head.last_seq + 1,
        at=now,
        task_id=action.task_id,
        attempt=action.attempt,
        agent=agent,
        remote_run_id=remote_run_id,
        waits=not ended,
        format=4 if ended else WAITS_FORMAT,
    )


class _AgentCall:
    """The call of one agent attempt in a linear drive, once ``attempt_started`` is recorded:
    the head its last write recorded, the remote run it started or follows, and the cancel scope
    that stops it (a write by anyone else, the store gone, the deadline)."""

    def __init__(self, leased: LeasedRun, action: StartAttempt, call: AgentCall, current: RunHead) -> None:
        self.leased = leased
        self.action = action
        self.call = call
        #: the head the attempt's last write recorded
        self.current = current
        #: while our own mid-call write is in flight, a newer version in the store is ours
        self.writing = False
        #: the remote run this call started or follows, once known (recorded or not)
        self.remote_id = call.remote_run_id
        #: the remote run was recorded as awaited outside the drive, and the call stopped
        self.detached = False
        self.scope = anyio.CancelScope()
        #: the call may not outlive the run's or the task's deadline
        self.limit = current.wake_at
        if self.limit is not None:
            delay = (self.limit - leased.clock.now()).total_seconds()
            self.scope.deadline = anyio.current_time() + max(0.0, delay)

    async def run(self, delegate: AgentDelegate) -> AttemptOutcome | None:
        """Make the call, watched; its outcome, or None when it was stopped. A ``VersionConflict``
        of the mid-call write (a cancel) stops it too, and is raised: the drive decides again."""
        task = self.current.task(self.action.task_id)
        previous = tuple(a.error for a in task.attempts if a.error is not None)
        self.leased.track_call(self.scope)
        # Watched by the runtime's one watcher (orchestration.engine.call_watch); our own mid-call
        # writes move the version it compares with.
        watched = self.leased.watch(self.current.version, self._moved, self.scope.cancel)
        outcome: AttemptOutcome | None = None
        try:
            with self.scope:
                outcome = await delegate.delegate(self.current.contract, self.call, previous, self._remember)
        except VersionConflict:
            await _cancel_remote_run(self.leased, delegate, self.call, self.remote_id)
            raise
        finally:
            self.leased.unwatch(watched)
            self.leased.untrack_call(self.scope)
        return outcome

    async def _remember(self, remote_run_id: str, ended: bool = True) -> None:
        """Record ``remote_run_started`` as soon as the answer names the remote run; one that has
        not ended is awaited outside the drive, so the call stops here."""
        self.remote_id = remote_run_id
        fact = remote_run_started(
            self.current, self.action, self.call.agent.agent, remote_run_id, ended, self.leased.clock.now()
        )
        # A VersionConflict (someone else wrote: a cancel) ends the call: the drive decides again.
        self.writing = True
        try:
            self.current = await self.leased.append(self.current, [fact])
        finally:
            self.writing = False
        if fact.waits:
            self.detached = True
            self.scope.cancel()

    def _moved(self, version: int) -> None:
        """Abort the call once anyone else wrote to the run (a cancel); a version seen while our
        own mid-call write is in flight may be that write's."""
        if version > self.current.version and not self.writing:
            log.info(
                "run changed during a call", extra={"action": "call_aborted", "run_id": self.leased.run_id}
            )
            self.scope.cancel()

    async def ended_without_outcome(self, delegate: AgentDelegate) -> None:
        """After the call stopped without an outcome: cancel the remote run when the run was
        cancelled; ``StoreUnavailable`` when the store outage stopped it; when it ran out of time,
        let the injected clock reach the deadline too (see ``Drive._call``)."""
        leased = self.leased
        await _cancel_remote_run(leased, delegate, self.call, self.remote_id)
        if leased.outage.over:
            raise StoreUnavailable(
                f"the store did not answer for {leased.outage.seconds:.0f} s; the call for task "
                f"{self.action.task_id} of run {leased.run_id} was cancelled and will be followed up"
            )
        if self.limit is not None and anyio.current_time() >= self.scope.deadline:
            await anyio.sleep(max(0.0, (self.limit - leased.clock.now()).total_seconds()))


async def _cancel_remote_run(
    leased: LeasedRun, delegate: AgentDelegate, call: AgentCall, remote_id: str | None
) -> None:
    """After a call stopped without an outcome: when the run was cancelled, cancel the remote run
    it started or followed too (best effort: a remote that cannot be reached keeps its run, and a
    process that dies first leaves it; the parent's record is cancelled either way)."""
    if remote_id is None or not call.agent.follows_runs:
        return
    try:
        head = await leased.store.load(call.run_id)
    except ConstructError:
        return
    if head.status == RunStatus.CANCELLED:
        await delegate.cancel_remote(call.agent.agent, remote_id, f"run {call.run_id} was cancelled")


async def parallel_agent_call(
    leased: LeasedRun,
    worker: TaskWorker | None,
    lock: anyio.Lock,
    head: RunHead,
    action: StartAttempt,
    previous: tuple[TypedError, ...],
) -> AttemptOutcome | None:
    """The call of an agent step's attempt in a parallel run (:class:`~orchestration.engine.fanout.Fanout`
    recorded ``attempt_started`` and records the outcome, against the run as it is then): the
    remote run's id is recorded under the drive's write lock, against the run as it is then, while
    the task is still in this attempt (a run that moved on, a cancel, leaves it unrecorded: the
    call is stopped by the fan-out's watcher). None when the remote run had not ended: it is
    recorded as awaited outside the drive and the call stops (the fan-out records nothing)."""
    delegate = _delegate_for(worker, head)
    call = await build_call(leased.store, head, action, leased.known)
    scope = anyio.CancelScope()
    detached = False

    async def remember(remote_run_id: str, ended: bool = True) -> None:
        nonlocal detached
        while True:
            async with lock:
                current = await leased.load()
                task = current.task(action.task_id)
                last = task.attempts[-1] if task.attempts else None
                if current.status.is_terminal or last is None or last.number != action.attempt:
                    return
                now = leased.clock.now()
                fact = remote_run_started(current, action, call.agent.agent, remote_run_id, ended, now)
                try:
                    await leased.append(current, [fact])
                except VersionConflict:
                    continue
                if fact.waits:
                    # Followed outside the drive from now on (orchestration.engine.agent_waits).
                    detached = True
                    scope.cancel()
                return

    outcome: AttemptOutcome | None = None
    with scope:
        outcome = await delegate.delegate(head.contract, call, previous, remember)
    return None if detached else outcome


__all__ = [
    "WAITS_FORMAT",
    "agent_attempt",
    "agent_worker",
    "attempt_started",
    "build_call",
    "parallel_agent_call",
    "remote_run_started",
]

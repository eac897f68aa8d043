"""The drive's part of an agent step (the step itself: :mod:`orchestration.core.agent_steps`; the MCP
client: :mod:`orchestration.workers.mcp_agents`).

:func:`agent_attempt` does one attempt, as a provider attempt is done (decide → act → record),
with one more write in the middle:

1. ``attempt_started`` is recorded before anything is sent (with ``follows`` and
   ``remote_run_id`` when the decision was to follow an earlier attempt's call);
2. the call: its arguments are rendered from the record, its idempotency key is the one of the
   attempt that made the first call (:func:`~orchestration.core.agent_steps.idempotency_key`);
3. as soon as the answer names a remote run, ``remote_run_started`` is recorded — before the run
   is followed, so that a process that dies from then on leaves a record from which the next one
   follows the same remote run (a call stopped because the run was cancelled cancels the remote
   run too, best effort: ``orchestrate_cancel`` there);
4. the outcome (``task_completed`` or ``attempt_failed``) is recorded against the head the last
   write produced.

Every write is fenced by the drive's lease, and a watcher aborts the call as soon as anyone else
writes to the run (a cancel), as for a provider call. A crash anywhere leaves a ``running`` task:
an orphan, whose next attempt :func:`~orchestration.core.agent_steps.agent_attempt` (the pure rule)
turns into a follow-up of the same remote call. A call that outlives the task's or the run's
deadline is cancelled, and the next decision records ``deadline_exceeded``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from orchestration.core.action_facts import outcome_fact
from orchestration.core.agent_steps import idempotency_key, render_arguments, template_steps
from orchestration.core.decide import StartAttempt
from orchestration.core.facts import AttemptStarted, RemoteRunStarted
from orchestration.core.models import RunHead, TypedError
from orchestration.core.outcomes import AttemptOutcome
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.reading import read_outputs
from orchestration.errors import (
    ConstructError,
    CorruptRecord,
    InvalidState,
    StoreError,
    StoreUnavailable,
    VersionConflict,
)
from orchestration.workers.agent_calls import AgentCall, AgentDelegate

if TYPE_CHECKING:
    from orchestration.engine.drive import Drive

log = logging.getLogger("construct.runtime")


def agent_worker(drive: Drive) -> AgentDelegate | None:
    """The agent worker the drive's worker carries: its ``agents`` (see
    :class:`~orchestration.workers.mcp_agents.Workers`), or the worker itself when it delegates."""
    worker = drive.worker
    agents = getattr(worker, "agents", worker)
    return agents if callable(getattr(agents, "delegate", None)) else None  # type: ignore[return-value]


async def build_call(drive: Drive, head: RunHead, action: StartAttempt) -> AgentCall:
    """The call of ``action``'s attempt, from the record only."""
    step = head.step_of(action.task_id)
    assert step.agent is not None
    latest: dict[str, str] = {}
    for task in head.tasks:
        if task.status == TaskStatus.DONE and task.step_name in template_steps(step.agent.arguments):
            latest[task.step_name] = task.task_id
    outputs = await read_outputs(drive.store, head, list(latest.values()), drive.known)
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
    )


async def agent_attempt(drive: Drive, head: RunHead, action: StartAttempt) -> RunHead | None:
    """One attempt of an agent step (see the module's docstring); the head the last write recorded,
    or None when the call ended without an outcome (cancelled, out of time)."""
    worker = agent_worker(drive)
    if worker is None:
        raise InvalidState(f"run {head.run_id} has an agent step, and this server has no agent worker")
    call = await build_call(drive, head, action)
    step = head.step_of(action.task_id)
    started = AttemptStarted(
        seq=head.last_seq + 1,
        at=drive.clock.now(),
        task_id=action.task_id,
        attempt=action.attempt,
        executor=head.contract.executor_for(step),
        possible_duplicate_call=action.possible_duplicate_call,
        follows=action.follows,
        remote_run_id=action.remote_run_id,
    )
    current = await drive._append(head, [started])
    previous = tuple(a.error for a in current.task(action.task_id).attempts if a.error is not None)
    scope = anyio.CancelScope()
    limit = current.wake_at
    if limit is not None:
        scope.deadline = anyio.current_time() + max(0.0, (limit - drive.clock.now()).total_seconds())
    drive._cancel_scopes[head.run_id] = scope
    outcome: AttemptOutcome | None = None
    #: while our own mid-call write is in flight, a newer version in the store is ours
    writing = False
    #: the remote run this call started or follows, once known (recorded or not)
    remote_id = call.remote_run_id

    async def remember(remote_run_id: str) -> None:
        nonlocal current, writing, remote_id
        remote_id = remote_run_id
        fact = RemoteRunStarted(
            seq=current.last_seq + 1,
            at=drive.clock.now(),
            task_id=action.task_id,
            attempt=action.attempt,
            agent=call.agent.agent,
            remote_run_id=remote_run_id,
        )
        # A VersionConflict (someone else wrote: a cancel) ends the call: the drive decides again.
        writing = True
        try:
            current = await drive._append(current, [fact])
        finally:
            writing = False

    async def watch() -> None:
        """Abort the call once anyone else wrote to the run (a cancel), or the store stayed away."""
        while True:
            await anyio.sleep(drive.settings.cancel_poll_seconds)
            try:
                seen = await drive.store.load(head.run_id)
            except CorruptRecord:
                continue
            except StoreError as exc:
                if drive._outage_over(exc):
                    scope.cancel()
                    return
                continue
            except ConstructError:
                continue
            drive.outage.recovered()
            if seen.version > current.version and not writing:
                log.info("run changed during a call", extra={"action": "call_aborted", "run_id": head.run_id})
                scope.cancel()
                return

    try:
        with scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                outcome = await worker.delegate(current.contract, call, previous, remember)
                tg.cancel_scope.cancel()
    except VersionConflict:
        await _cancel_remote_run(drive, worker, call, remote_id)
        raise
    finally:
        drive._cancel_scopes.pop(head.run_id, None)
    if outcome is None:
        await _cancel_remote_run(drive, worker, call, remote_id)
        if drive.outage.over:
            raise StoreUnavailable(
                f"the store did not answer for {drive.outage.seconds:.0f} s; the call for task "
                f"{action.task_id} of run {head.run_id} was cancelled and will be followed up"
            )
        if limit is not None and anyio.current_time() >= scope.deadline:
            # Let the injected clock reach the deadline too (see Drive._call).
            await anyio.sleep(max(0.0, (limit - drive.clock.now()).total_seconds()))
        return None
    executor = head.contract.executor_for(step)
    fact = outcome_fact(current, action, executor, outcome, drive.clock.now())
    return await drive._append(current, [fact])


async def _cancel_remote_run(
    drive: Drive, worker: AgentDelegate, call: AgentCall, remote_id: str | None
) -> None:
    """After a call stopped without an outcome: when the run was cancelled, cancel the remote run
    it started or followed too (best effort: a remote that cannot be reached keeps its run, and a
    process that dies first leaves it; the parent's record is cancelled either way)."""
    if remote_id is None or not call.agent.follows_runs:
        return
    try:
        head = await drive.store.load(call.run_id)
    except ConstructError:
        return
    if head.status == RunStatus.CANCELLED:
        await worker.cancel_remote(call.agent.agent, remote_id, f"run {call.run_id} was cancelled")


async def parallel_agent_call(
    drive: Drive, lock: anyio.Lock, head: RunHead, action: StartAttempt, previous: tuple[TypedError, ...]
) -> AttemptOutcome:
    """The call of an agent step's attempt in a parallel run (:class:`~orchestration.engine.fanout.Fanout`
    recorded ``attempt_started`` and records the outcome, against the run as it is then): the
    remote run's id is recorded under the drive's write lock, against the run as it is then, while
    the task is still in this attempt (a run that moved on, a cancel, leaves it unrecorded: the
    call is stopped by the fan-out's watcher)."""
    worker = agent_worker(drive)
    if worker is None:
        raise InvalidState(f"run {head.run_id} has an agent step, and this server has no agent worker")
    call = await build_call(drive, head, action)

    async def remember(remote_run_id: str) -> None:
        while True:
            async with lock:
                current = await drive._load()
                task = current.task(action.task_id)
                last = task.attempts[-1] if task.attempts else None
                if current.status.is_terminal or last is None or last.number != action.attempt:
                    return
                fact = RemoteRunStarted(
                    seq=current.last_seq + 1,
                    at=drive.clock.now(),
                    task_id=action.task_id,
                    attempt=action.attempt,
                    agent=call.agent.agent,
                    remote_run_id=remote_run_id,
                )
                try:
                    await drive._append(current, [fact])
                except VersionConflict:
                    continue
                return

    return await worker.delegate(head.contract, call, previous, remember)


__all__ = ["agent_attempt", "agent_worker", "build_call", "parallel_agent_call"]

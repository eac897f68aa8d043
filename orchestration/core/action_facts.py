"""What an action records (pure: the head, the action, the time): the one fact a bookkeeping
decision such as "fail this task" or "ask for this gate" becomes (:func:`recorded_fact`), and the
fact an attempt's outcome becomes (:func:`outcome_fact`, for the drive, the parallel fan-out and
agent steps alike). The drive does the rest of acting (calls, host prompts) itself."""

from __future__ import annotations

from datetime import datetime

from orchestration.core.decide import (
    Action,
    ExpireGate,
    FailTask,
    FinishRun,
    RequestApproval,
    RequestBudget,
    RouteTask,
    StartAttempt,
    StartChild,
)
from orchestration.core.facts import (
    ApprovalRequested,
    AttemptFailed,
    ChildStarted,
    Fact,
    RunFinished,
    TaskCompleted,
    TaskFailed,
    gate_expired,
    route_decided,
)
from orchestration.core.models import RunHead, text_hash
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded


def recorded_fact(head: RunHead, action: Action, now: datetime) -> Fact | None:
    """The fact ``action`` records on top of ``head`` at ``now``; None for an action that is not
    bookkeeping. A child's start is recorded before the child exists (its run id and key come from
    the task instance, so a crash in between never leaves two children, or none)."""
    seq = head.last_seq + 1
    if isinstance(action, RequestApproval):
        return ApprovalRequested(seq=seq, at=now, gate_id=action.gate_id)
    if isinstance(action, FinishRun):
        return RunFinished(seq=seq, at=now, status=action.status, error=action.error)
    if isinstance(action, FailTask):
        return TaskFailed(seq=seq, at=now, task_id=action.task_id, error=action.error)
    if isinstance(action, RouteTask):
        return route_decided(action.plan, seq, now)
    if isinstance(action, StartChild):
        return ChildStarted(
            seq=seq, at=now, task_id=action.task_id, child_run_id=action.child_run_id, chain=action.chain
        )
    if isinstance(action, ExpireGate):
        return gate_expired(head, action.gate_id, action.decision, seq, now)
    if isinstance(action, RequestBudget):
        return ApprovalRequested(seq=seq, at=now, format=4, gate_id=action.gate_id, budget=action.ask)
    return None


def outcome_fact(
    head: RunHead, action: StartAttempt, executor: str, outcome: AttemptOutcome, now: datetime
) -> Fact:
    """The fact ``action``'s attempt ended with, on top of ``head`` (the head its
    ``attempt_started`` write produced): ``task_completed`` or ``attempt_failed``, marked a
    possible duplicate call when the attempt or its outcome says so."""
    telemetry = outcome.telemetry
    if action.possible_duplicate_call and not telemetry.possible_duplicate_call:
        # (Otherwise the worker's telemetry already says it: frozen, it is recorded as it is.)
        telemetry = telemetry.model_copy(update={"possible_duplicate_call": True})
    if isinstance(outcome, AttemptSucceeded):
        return TaskCompleted(
            seq=head.last_seq + 1,
            at=now,
            task_id=action.task_id,
            attempt=action.attempt,
            executor=executor,
            output=outcome.output,
            output_sha256=text_hash(outcome.output),
            value=outcome.value,
            telemetry=telemetry,
        )
    return AttemptFailed(
        seq=head.last_seq + 1,
        at=now,
        task_id=action.task_id,
        attempt=action.attempt,
        error=outcome.error,
        telemetry=telemetry,
        not_before=outcome.not_before,
    )

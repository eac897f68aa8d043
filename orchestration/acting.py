"""What a bookkeeping action records: the one fact a decision such as "fail this task" or "ask
for this gate" becomes (pure: the head, the action and the time). The drive appends it; actions
that call a worker or prepare a host task (:class:`~orchestration.decide.StartAttempt`,
:class:`~orchestration.decide.PrepareHostTask`) are acted on by the drive itself."""

from __future__ import annotations

from datetime import datetime

from orchestration.decide import (
    Action,
    ExpireGate,
    FailTask,
    FinishRun,
    RequestApproval,
    RequestBudget,
    RouteTask,
    StartChild,
)
from orchestration.facts import (
    ApprovalRequested,
    ChildStarted,
    Fact,
    RunFinished,
    TaskFailed,
    gate_expired,
    route_decided,
)
from orchestration.models import RunHead


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

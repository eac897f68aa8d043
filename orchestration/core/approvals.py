"""Who may decide a gate, and what a decision on a gate already decided means: pure checks the
runtime makes before it records an ``approval_decided`` fact (see ``Runtime.approve``)."""

from __future__ import annotations

from orchestration.core.costs import BudgetLimits
from orchestration.core.models import GATE_STATUS_OF, GateState, RunHead
from orchestration.errors import Conflict, Forbidden, InvalidArgument, quoted


def check_approver(head: RunHead, gate: GateState, approver: str | None, verified: bool) -> None:
    """``Forbidden`` unless the gate's step names no ``approvers`` or ``approver`` is one of them
    (verified over HTTP with a token, claimed over stdio and the CLI)."""
    allowed = head.step_of(gate.task_id).approvers
    if allowed is None or approver in allowed:
        return
    who = f"{quoted(approver)} ({'verified' if verified else 'claimed'})" if approver else "nobody named"
    raise Forbidden(
        f"gate {gate.gate_id} of run {head.run_id} may be decided only by {', '.join(allowed)}; "
        f"the decision came from {who}: ask one of them to decide it"
    )


def check_repeat(
    head: RunHead, gate: GateState, decision: str, comment: str | None, approver: str | None
) -> None:
    """For a gate already decided: nothing (the call repeats the decision exactly: a no-op), or
    ``Conflict`` (another decision, or the same one with another comment or approver: the record
    is immutable)."""
    if gate.status != GATE_STATUS_OF[decision]:
        how = " by expiry" if gate.channel == "expiry" else ""
        raise Conflict(
            f"gate {gate.gate_id} of run {head.run_id} was already {gate.status}{how}; "
            "a decided gate cannot be changed"
        )
    if (gate.comment, gate.approver) != (comment, approver):
        raise Conflict(
            f"gate {gate.gate_id} of run {head.run_id} was already {gate.status} with "
            f"comment {quoted(gate.comment)} by approver {quoted(gate.approver)}; "
            "a decision's record cannot be changed (repeat it exactly, or leave it)"
        )


def check_budget_raise(gate: GateState, decision: str, budget_raise: BudgetLimits | None) -> None:
    """``InvalidArgument`` for a budget raise (what an approver adds to a budget, see
    :func:`~orchestration.core.budget.raise_budget`) with anything but approving a ``budget`` gate."""
    if budget_raise is not None and (gate.position != "budget" or decision != "approve"):
        raise InvalidArgument(
            f"a budget raise goes only with approving a budget gate (budget:<n>), not with {decision} "
            f"of gate {gate.gate_id}"
        )

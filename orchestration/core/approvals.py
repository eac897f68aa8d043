"""A caller's gate decision (:class:`Decision`), who may decide a gate, and what a decision on a gate
already decided means: pure checks the runtime makes before it records ``approval_decided``.
A gate is a person's unless its policy (:func:`gate_approvers`) lists ``"agent"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from orchestration.core.costs import BudgetLimits
from orchestration.core.facts import ApprovalDecided, decision_format
from orchestration.core.graph import parked_question
from orchestration.core.inputs import Limits, check_id
from orchestration.core.models import AGENT_APPROVER, GATE_STATUS_OF, DecisionChannel, GateState, RunHead
from orchestration.errors import Conflict, Forbidden, InvalidArgument, InvalidState, TooLarge, quoted


def gate_approvers(head: RunHead, gate: GateState) -> tuple[str, ...] | None:
    """Who may decide ``gate``: identities, and :data:`~orchestration.core.models.AGENT_APPROVER`
    for the calling agent itself; None: any person (never the agent).

    A step's gates (``before``, ``after``, and the ``exhausted`` gate of its routing step, whose
    ``on_exhausted = "ask"`` is the step's setting) take the step's ``approvers``, else the chain's.
    A ``budget`` gate is the run's, not the step's whose call hit the budget: raising a budget is
    spending, so it takes the chain's policy; a chain without one leaves it to the persons that
    step names (the rule before chains had a policy, so older runs read back unchanged), never
    to the agent on the strength of a step's policy alone."""
    step = head.step_of(gate.task_id)
    chain = head.chain.approvers
    if gate.position != "budget":
        return step.approvers if step.approvers is not None else chain
    if chain is not None:
        return chain
    persons = tuple(a for a in step.approvers or () if a != AGENT_APPROVER)
    return persons or None


def agent_may_decide(head: RunHead, gate: GateState) -> bool:
    """Whether the calling agent may decide ``gate`` itself (``approver = "agent"``)."""
    return AGENT_APPROVER in (gate_approvers(head, gate) or ())


def check_approver(head: RunHead, gate: GateState, approver: str | None, verified: bool) -> None:
    """``Forbidden`` unless ``approver`` may decide the gate (:func:`gate_approvers`): the agent
    (``approver = "agent"``) only where the policy lists it, a person where the policy is None or
    names them (verified over HTTP with a token, claimed over stdio and the CLI). The agent's
    refusal says the gate is a person's: an autonomous runner that follows it asks, never guesses."""
    allowed = gate_approvers(head, gate)
    if approver == AGENT_APPROVER:
        if allowed is not None and AGENT_APPROVER in allowed:
            return
        who = "" if allowed is None else f" ({', '.join(allowed)})"
        raise Forbidden(
            f"gate {gate.gate_id} of run {head.run_id} is a person's{who}, not the agent's: ask the "
            "user, then send their decision without approver 'agent'"
        )
    if allowed is None or approver in allowed:
        return
    who = f"{quoted(approver)} ({'verified' if verified else 'claimed'})" if approver else "nobody named"
    names = ", ".join("the calling agent (approver 'agent')" if a == AGENT_APPROVER else a for a in allowed)
    raise Forbidden(
        f"gate {gate.gate_id} of run {head.run_id} may be decided only by {names}; "
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


def check_repeated_raise(
    head: RunHead, gate: GateState, recorded: BudgetLimits | None, asked: BudgetLimits | None
) -> None:
    """For a budget gate already approved, with ``recorded`` the raise its decision recorded:
    nothing when a repeat asks that raise again (None: the original budget again), else
    ``Conflict``, as :func:`check_repeat` for the rest of the decision: an answer that would
    raise the budget by another amount must not be told it did."""
    if asked == recorded:
        return
    raise Conflict(
        f"gate {gate.gate_id} of run {head.run_id} was already approved with {_raise_words(recorded)}, "
        f"not {_raise_words(asked)}; a decision's record cannot be changed (repeat it exactly, or "
        "leave it)"
    )


def _raise_words(limits: BudgetLimits | None) -> str:
    if limits is None:
        return "no budget_raise (the original budget again)"
    return f"budget_raise {limits.model_dump_json(exclude_none=True)}"


def check_budget_raise(gate: GateState, decision: str, budget_raise: BudgetLimits | None) -> None:
    """``InvalidArgument`` for a budget raise (what an approver adds to a budget, see
    :func:`~orchestration.core.budget.raise_budget`) with anything but approving a ``budget`` gate."""
    if budget_raise is not None and (gate.position != "budget" or decision != "approve"):
        raise InvalidArgument(
            f"a budget raise goes only with approving a budget gate (budget:<n>), not with {decision} "
            f"of gate {gate.gate_id}"
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """A gate decision as a caller gives it (:meth:`orchestration.engine.Runtime.approve`)."""

    decision: Literal["approve", "reject", "revise"]
    gate_id: str
    comment: str | None
    approver: str | None
    channel: DecisionChannel | None
    verified: bool
    budget_raise: BudgetLimits | None

    def fact(self, seq: int, at: datetime) -> ApprovalDecided:
        """The decision as the fact that records it at ``seq``."""
        return ApprovalDecided(
            seq=seq,
            at=at,
            format=decision_format(self.decision),
            gate_id=self.gate_id,
            decision=self.decision,
            comment=self.comment,
            approver=self.approver,
            channel=self.channel,
            verified=self.verified,
            budget_raise=self.budget_raise,
        )


def check_answer(head: RunHead, gate: GateState, asked: Decision) -> None:
    """For a ``question`` gate (a remote A2A agent's question: see
    :mod:`orchestration.engine.agent_questions`): ``InvalidState`` when its task is no longer
    parked at it (the step ended meanwhile, out of time: the question is moot);
    ``InvalidArgument`` for ``revise`` (nothing of this run to redo) and for ``approve`` without
    a comment (the comment is the answer sent)."""
    if gate.position != "question":
        return
    if parked_question(head.task(gate.task_id)) != gate.gate_id:
        raise InvalidState(
            f"gate {gate.gate_id} of run {head.run_id} is moot: task {gate.task_id} no longer waits "
            "for the answer (it ended meanwhile)"
        )
    if asked.decision == "revise":
        raise InvalidArgument(
            f"gate {gate.gate_id} is agent {gate.agent}'s question: approve with the answer as "
            "comment, or reject to decline it (the step fails)"
        )
    if asked.decision == "approve" and not (asked.comment or "").strip():
        raise InvalidArgument(
            f"gate {gate.gate_id} is agent {gate.agent}'s question: approve it with the answer as "
            "comment (sent to the agent as the next message), or reject to decline it"
        )


def check_decision(asked: Decision, limits: Limits) -> None:
    """Refuse a decision malformed whatever the run: an unknown verb, a bad gate id, text over
    the limits."""
    if asked.decision not in ("approve", "reject", "revise"):
        raise InvalidArgument(
            f"decision must be 'approve', 'reject' or 'revise', not {quoted(asked.decision)}"
        )
    check_id("gate_id", asked.gate_id, limits)
    if asked.comment is not None and len(asked.comment) > limits.max_comment_chars:
        raise TooLarge(f"comment is over {limits.max_comment_chars} characters")
    if asked.approver is not None and len(asked.approver) > limits.max_approver_chars:
        raise TooLarge(f"approver is over {limits.max_approver_chars} characters")

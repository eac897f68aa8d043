"""A readable timeline of a run, rendered from its stored facts (``runs timeline``, the demo).

One line per fact: its sequence number, the time since the run was created, its type and what it
says. Outputs and prompts are summarized by size (and the first words of an output, or of a typed
output's value), never printed whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from orchestration.core import (
    AgentAnswerSending,
    AgentAnswerSent,
    AgentQuestionAsked,
    ApprovalDecided,
    ApprovalRequested,
    AttemptFailed,
    AttemptStarted,
    ChainUpgraded,
    Fact,
    HostOutputSubmitted,
    HostTaskPrepared,
    PushConfigDeleted,
    PushConfigured,
    RouteDecided,
    RunCancelled,
    RunCreated,
    RunFinished,
    RunHead,
    TaskCompleted,
    TaskFailed,
    Telemetry,
    priced,
)

PREVIEW_CHARS = 60


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"


def _routes(routes: dict[str, str]) -> str:
    return ", ".join(f"{value}->{target}" for value, target in routes.items())


def decided_by(approver: str | None, channel: str | None, verified: bool) -> str:
    """Who decided a gate and how, for a line of text: `` by alice (verified, http)``,
    `` by bob (claimed, stdio)``; empty when nothing was recorded."""
    who = f" by {approver}" if approver else ""
    if channel is None:
        return who
    how = ("verified, " if verified else "claimed, ") if approver else ""
    return f"{who} ({how}{channel})"


def describe_fact(fact: Fact) -> str:
    """What one fact says, in a few words; a fact type without a describer (a remote run started, a
    child started or ended) gives its type alone."""
    describe = _DESCRIBERS.get(type(fact))
    return fact.type if describe is None else describe(fact)


def _run_created(fact: RunCreated) -> str:
    parallel = any(s.after is not None for s in fact.chain.steps)
    steps = (", " if parallel else " -> ").join(
        s.name
        + (f" [{s.route_on}: {_routes(s.routes)}]" if s.routes else "")
        + (f" (after {', '.join(s.after)})" if s.after else "")
        for s in fact.chain.steps
    )
    by = f", started by {fact.started_by} (verified)" if fact.started_by else ""
    if fact.forked_from is not None:
        by += f", forked from {fact.forked_from.run_id} at {fact.forked_from.task_id}"
    return (
        f"chain {fact.chain.name} ({steps}), backend {fact.contract.worker_backend}, "
        f'request "{_preview(fact.request)}"{by}'
    )


def _host_task_prepared(fact: HostTaskPrepared) -> str:
    digest = fact.prompt_sha256[:12]
    return f"{fact.task_id}: prompts handed to the host (attempt {fact.attempt}, sha256 {digest})"


def _host_output_submitted(fact: HostOutputSubmitted) -> str:
    usage = fact.usage
    reported = (
        ""
        if usage is None
        else f", reported by the host: {usage.input_tokens} in / {usage.output_tokens} out tokens"
        + ("" if usage.cost_usd is None else f", ${usage.cost_usd:.4f}")
    )
    read = fact.prompt_read
    parts = (
        ""
        if read is None
        else f"; it read {read.read:,} of the prompt's {read.chars:,} characters handed out in parts"
        + ("" if read.whole else f", SKIPPING {read.chars - read.read:,}")
    )
    who = decided_by(fact.by, fact.channel, fact.verified)
    return f"{fact.task_id}: host answered ({fact.output_chars} chars{reported}{parts}){who}"


def _task_completed(fact: TaskCompleted) -> str:
    if fact.value is not None:  # a typed answer: its value says more than the text's start
        return f"{fact.task_id}: done by {fact.executor}: value {_preview(json.dumps(fact.value))}"
    return f'{fact.task_id}: done by {fact.executor}: "{_preview(fact.output)}"'


def _approval_requested(fact: ApprovalRequested) -> str:
    note = "" if fact.budget is None else f": {fact.budget.note}"
    return f"{fact.gate_id}: waiting for a decision{note}"


def _approval_decided(fact: ApprovalDecided) -> str:
    who = decided_by(fact.approver, fact.channel, fact.verified)
    note = f' "{_preview(fact.comment)}"' if fact.comment else ""
    added = fact.budget_raise
    if added is not None:
        parts = [f"{added.max_total_tokens} tokens" if added.max_total_tokens else ""]
        parts.append(f"${added.max_cost_usd:.4f}" if added.max_cost_usd else "")
        note += f" (budget raised by {' and '.join(p for p in parts if p)})"
    return f"{fact.gate_id}: {fact.decision}{who}{note}"


def _agent_question_asked(fact: AgentQuestionAsked) -> str:
    return f'{fact.gate_id}: agent {fact.agent} asks "{_preview(fact.question)}" (attempt {fact.attempt})'


def _agent_answer_sending(fact: AgentAnswerSending) -> str:
    dup = " (possible duplicate call)" if fact.possible_duplicate_call else ""
    return f"{fact.gate_id}: sending the answer to {fact.task_id}'s agent as message {fact.message_id}{dup}"


def _agent_answer_sent(fact: AgentAnswerSent) -> str:
    return f"{fact.gate_id}: the agent took the answer (message {fact.message_id})"


def _attempt_started(fact: AttemptStarted) -> str:
    dup = " (possible duplicate call)" if fact.possible_duplicate_call else ""
    return f"{fact.task_id}: attempt {fact.attempt} by {fact.executor}{dup}"


def _attempt_failed(fact: AttemptFailed) -> str:
    return f"{fact.task_id}: attempt {fact.attempt} failed: {fact.error.code}: {fact.error.message}"


def _task_failed(fact: TaskFailed) -> str:
    return f"{fact.task_id}: failed: {fact.error.code}: {fact.error.message}"


def _route_decided(fact: RouteDecided) -> str:
    went = fact.next_task_id or fact.applied
    bound = (
        f" (bound reached: {fact.bounded_step} had {fact.visits} visits; on_exhausted {fact.applied})"
        if fact.exhausted
        else ""
    )
    return f"{fact.task_id}: {fact.route_on}={fact.value} -> {fact.target}{bound}: goes on with {went}"


def _run_cancelled(fact: RunCancelled) -> str:
    by = decided_by(fact.cancelled_by, fact.channel, fact.verified)
    return f"cancelled{by}{f': {fact.reason}' if fact.reason else ''}"


def _run_finished(fact: RunFinished) -> str:
    return f"{fact.status}{f': {fact.error.code}' if fact.error else ''}"


def _chain_upgraded(fact: ChainUpgraded) -> str:
    by = f" by {fact.by}{' (verified)' if fact.verified else ''}" if fact.by else ""
    why = f": {fact.reason}" if fact.reason else ""
    return f"moved to chain version {fact.to_hash[:12]} (from {fact.from_hash[:12]}){by}{why}"


def _push_configured(fact: PushConfigured) -> str:
    # the webhook's origin only: its path or query may carry what its owner keeps to itself
    by = f" by {fact.by}" if fact.by else ""
    return f"push notifications to {fact.origin} (config {fact.config_id}){by}"


def _push_config_deleted(fact: PushConfigDeleted) -> str:
    return f"push notification config {fact.config_id} removed{f' by {fact.by}' if fact.by else ''}"


#: What :func:`describe_fact` says of each fact type (by its class: no fact type subclasses another).
_DESCRIBERS: dict[type[Any], Callable[[Any], str]] = {
    RunCreated: _run_created,
    HostTaskPrepared: _host_task_prepared,
    HostOutputSubmitted: _host_output_submitted,
    TaskCompleted: _task_completed,
    ApprovalRequested: _approval_requested,
    ApprovalDecided: _approval_decided,
    AttemptStarted: _attempt_started,
    AgentQuestionAsked: _agent_question_asked,
    AgentAnswerSending: _agent_answer_sending,
    AgentAnswerSent: _agent_answer_sent,
    AttemptFailed: _attempt_failed,
    TaskFailed: _task_failed,
    RouteDecided: _route_decided,
    RunCancelled: _run_cancelled,
    RunFinished: _run_finished,
    ChainUpgraded: _chain_upgraded,
    PushConfigured: _push_configured,
    PushConfigDeleted: _push_config_deleted,
}


def usage_note(head: RunHead, fact: Fact) -> str:
    """An outcome's tokens and cost (at the run's recorded prices), `` [11 in / 7 out tokens,
    $0.0001]``; `` (reported by the host)`` for a host's; empty when it reported none."""
    if not isinstance(fact, (TaskCompleted, AttemptFailed)):
        return ""
    executor = fact.executor if isinstance(fact, TaskCompleted) else None
    if executor is None:
        try:
            executor = head.contract.executor_for(head.step_of(fact.task_id))
        except KeyError:  # pragma: no cover - a task of the run's own log
            executor = ""
    usage: Telemetry = priced(head.contract, executor, fact.telemetry)
    if usage.input_tokens is None and usage.output_tokens is None:
        return ""
    cost = "" if usage.cost_usd is None else f", ${usage.cost_usd:.4f}"
    host = " reported by the host" if usage.reported_by_host else ""
    return f" [{usage.input_tokens or 0} in / {usage.output_tokens or 0} out tokens{cost}{host}]"


def render_timeline(head: RunHead, facts: Sequence[Fact]) -> str:
    spent = head.spent
    total = (
        ""
        if spent is None
        else f"; spent {spent.run.total_tokens} tokens, ${spent.run.cost_usd:.4f}"
        + (f" ({spent.run.unpriced_calls} calls unpriced)" if spent.run.unpriced_calls else "")
    )
    lines = [f"run {head.run_id}: {head.status.value} ({len(facts)} facts, {head.version} writes{total})"]
    start = facts[0].at if facts else head.created_at
    for fact in facts:
        offset = (fact.at - start).total_seconds()
        copy = "" if fact.copied_from is None else f" [copy of #{fact.copied_from}]"
        line = f"{describe_fact(fact)}{usage_note(head, fact)}{copy}"
        lines.append(f"  #{fact.seq:<3} +{offset:8.3f}s  {fact.type:<22} {line}")
    return "\n".join(lines) + "\n"

"""Typed facts (DESIGN §3), and how stored ones are read back.

A run's record is an append-only, ordered log of frozen facts, each with its ``type``, its ``seq``
in the run's log and the time ``at`` it was recorded. Stored facts and heads are read with
:func:`parse_fact` and :func:`parse_head`, which ignore unknown fields and refuse, with
:class:`~orchestration.errors.RecordTooNew`, a record of a newer format or a fact type this code
does not know. The rules of record formats are in docs/development.md (Record formats).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import Field, TypeAdapter

from orchestration.core.costs import BudgetAsk, BudgetLimits, HostUsage
from orchestration.core.models import (
    ChainSnapshot,
    Decision,
    DecisionChannel,
    Delegation,
    ExecutionContract,
    Frozen,
    ParentLink,
    PromptRead,
    RunHead,
    Telemetry,
    TypedError,
)
from orchestration.core.routing import RoutePlan


class _Fact(Frozen):
    seq: int
    at: datetime
    #: the record format a reader must understand to read this fact ("Record formats" in
    #: docs/development.md); a fact type added in a later format declares that format as its default
    format: int = Field(default=1, ge=1)
    #: a fork's copy of a source run's fact: that fact's ``seq`` in the run its ``run_created``
    #: names (``forked_from``; see :mod:`orchestration.ops.forking`). Optional and left out of the
    #: record when absent, so no new format: an older reader folds a copy as the fact it copies.
    copied_from: int | None = Field(default=None, exclude_if=lambda v: v is None)


class ForkOrigin(Frozen):
    """The run and task instance a forked run was started from."""

    run_id: str
    task_id: str


class RunCreated(_Fact):
    type: Literal["run_created"] = "run_created"
    run_id: str
    request: str
    chain: ChainSnapshot
    chain_hash: str
    contract: ExecutionContract
    idempotency_key: str | None = None
    request_hash: str
    deadline_at: datetime | None = None
    #: the verified identity that started the run (HTTP with a token); optional, so no new format
    started_by: str | None = None
    #: set on a fork (:mod:`orchestration.ops.forking`); optional, so no new format
    forked_from: ForkOrigin | None = Field(default=None, exclude_if=lambda v: v is None)
    #: the W3C ``traceparent`` the run's spans continue (a tool call's ``_meta``, or the server's
    #: own span of that call; see :mod:`orchestration.tracing`); optional, so no new format: a
    #: reader without it only starts the run's spans in a trace of their own
    traceparent: str | None = None
    #: a child run's parent task and depth (:mod:`orchestration.engine.children`); optional, so no new
    #: format: a reader that ignores it runs the child as a run of its own
    parent: ParentLink | None = None
    #: the agent delegation that started the run (:mod:`orchestration.core.hops`); optional and
    #: left out when absent, so no new format: a reader that ignores it sends hop 1 onward
    delegation: Delegation | None = Field(default=None, exclude_if=lambda v: v is None)


class ApprovalRequested(_Fact):
    type: Literal["approval_requested"] = "approval_requested"
    gate_id: str
    #: a ``budget`` gate's request: the gate is created by this fact (record format 4, see
    #: :mod:`orchestration.core.budget`); None: a chain's gate, which exists from the start
    budget: BudgetAsk | None = None


class ApprovalDecided(_Fact):
    type: Literal["approval_decided"] = "approval_decided"
    gate_id: str
    #: ``revise`` and ``fail`` (expiry's) came with record format 3: :func:`decision_format`
    decision: Decision
    comment: str | None = None
    approver: str | None = None
    #: how the decision came in, and whether ``approver`` was verified (an HTTP token's identity)
    #: or only claimed; both optional: a fact without them reads as "channel unknown, claimed"
    channel: DecisionChannel | None = None
    verified: bool = False
    #: approving a ``budget`` gate: what the approver adds to the budget it hit; None: the
    #: original budget again (the gate exists only in format 4 runs, so no new format)
    budget_raise: BudgetLimits | None = None


def decision_format(decision: Decision) -> int:
    """The record format of an ``approval_decided`` fact recording ``decision``: 3 for ``revise``
    and ``fail`` (an older reader cannot read them: "Record formats" in docs/development.md), else 1."""
    return 3 if decision in ("revise", "fail") else 1


def gate_expired(head: RunHead, gate_id: str, decision: Decision, seq: int, at: datetime) -> ApprovalDecided:
    """The decision expiry records for the requested gate ``gate_id`` (its step's ``on_expiry``):
    channel ``expiry``, no approver, not verified."""
    gate = head.gate(gate_id)
    expires_at = gate.expires_at if gate is not None else None
    when = f" at {expires_at:%Y-%m-%dT%H:%M:%SZ}" if expires_at is not None else ""
    return ApprovalDecided(
        seq=seq,
        at=at,
        format=decision_format(decision),
        gate_id=gate_id,
        decision=decision,
        comment=f"expired{when} undecided; on_expiry = {decision!r}",
        approver=None,
        channel="expiry",
        verified=False,
    )


class HostTaskPrepared(_Fact):
    """A task's prompts were materialized for the host's own model; the run waits for its output."""

    type: Literal["host_task_prepared"] = "host_task_prepared"
    task_id: str
    attempt: int
    executor: str
    prompt_sha256: str


class HostOutputSubmitted(_Fact):
    """The host answered a prepared task (the output itself is carried by the ``task_completed``
    fact written in the same atomic write)."""

    type: Literal["host_output_submitted"] = "host_output_submitted"
    task_id: str
    attempt: int
    output_sha256: str
    output_chars: int
    #: the usage the host reported with its output (``orchestrate_resume``'s ``usage``); also in
    #: the ``task_completed`` fact's telemetry, marked ``reported_by_host``, which is what counts
    usage: HostUsage | None = None
    #: the task's prompt was handed out in parts: how much of it the host fetched (None: it came
    #: whole in one answer, or no part was handed out by the process that took the output).
    #: Informational, so no new record format: an older reader ignores it and decides the same.
    prompt_read: PromptRead | None = Field(default=None, exclude_if=lambda v: v is None)
    #: who handed the output in, as ``approval_decided`` records an approver: a verified identity
    #: (an HTTP token's, ``verified``), a name claimed (the CLI's user), or None; and the channel
    #: it came by. Informational and left out when absent, so no new record format.
    by: str | None = Field(default=None, exclude_if=lambda v: v is None)
    channel: DecisionChannel | None = Field(default=None, exclude_if=lambda v: v is None)
    verified: bool = Field(default=False, exclude_if=lambda v: not v)


class AttemptStarted(_Fact):
    """Recorded *before* a provider is called."""

    type: Literal["attempt_started"] = "attempt_started"
    task_id: str
    attempt: int
    executor: str
    possible_duplicate_call: bool = False
    #: an agent step's attempt that follows the remote call of attempt ``follows`` (the same
    #: idempotency key; ``remote_run_id`` when that call's remote run was recorded) instead of
    #: making its own; only in runs of record format 4 (see :class:`RemoteRunStarted`)
    follows: int | None = None
    remote_run_id: str | None = None
    #: following a recorded remote run, outside the drive: the run is ``awaiting_agent`` (see
    #: :mod:`orchestration.engine.agent_waits`); record format 6, left out when False
    waits: bool = Field(default=False, exclude_if=lambda v: not v)


class RemoteRunStarted(_Fact):
    """An agent step's call started a run on another construct-mcp: its id, recorded as soon as it
    is known (mid-attempt), so that a restarted process follows that run instead of starting
    another (see :mod:`orchestration.engine.delegation`). Record format 4."""

    type: Literal["remote_run_started"] = "remote_run_started"
    format: int = Field(default=4, ge=1)
    task_id: str
    attempt: int
    agent: str
    remote_run_id: str
    #: the remote run had not ended when its id came back: it is followed outside the drive and
    #: the run is ``awaiting_agent`` (:mod:`orchestration.engine.agent_waits`); record format 6,
    #: left out when False (a remote run that ended at once is finished in the drive)
    waits: bool = Field(default=False, exclude_if=lambda v: not v)


class RemoteRunCancelled(_Fact):
    """An agent step's awaited remote run was given up — the run cancelled, the task out of time,
    the run failing — and ``orchestrate_cancel`` was sent there first (best effort, bounded): its
    result, recorded in the same write as the fact that gives it up (``run_cancelled``,
    ``task_failed``, ``run_finished``; see :mod:`orchestration.engine.agent_waits`).
    ``cancelled``: the remote answered that its run is cancelled; else ``error`` is the code of what
    went wrong. Record format 6."""

    type: Literal["remote_run_cancelled"] = "remote_run_cancelled"
    format: int = Field(default=6, ge=1)
    task_id: str
    attempt: int
    agent: str
    remote_run_id: str
    cancelled: bool
    error: str | None = None


class AgentQuestionAsked(_Fact):
    """An agent step's remote A2A task stopped at ``input-required``: its question becomes the
    ``question`` gate ``gate_id`` of this run (requested at once), and the attempt is parked
    there, nobody following the remote task, until the gate is decided (see
    :mod:`orchestration.engine.agent_questions`). ``question``: the text parts of the task's
    status message (a data part as JSON); ``context_id``: the task's, which the answer names;
    ``asked_id``: the status message's id (or its time), so the same question read twice is
    asked once. Record format 8."""

    type: Literal["agent_question_asked"] = "agent_question_asked"
    format: int = Field(default=8, ge=1)
    task_id: str
    attempt: int
    agent: str
    remote_run_id: str
    context_id: str | None = None
    gate_id: str
    number: int
    question: str
    asked_id: str | None = None


class AgentAnswerSending(_Fact):
    """The answer decided at the ``question`` gate ``gate_id`` is about to be sent as
    ``message_id`` (recorded *before* the send, as ``attempt_started`` before a call): a send
    found recorded but not ended was perhaps made, so the next is ``possible_duplicate_call``.
    Record format 8."""

    type: Literal["agent_answer_sending"] = "agent_answer_sending"
    format: int = Field(default=8, ge=1)
    task_id: str
    attempt: int
    gate_id: str
    message_id: str
    possible_duplicate_call: bool = False


class AgentAnswerSent(_Fact):
    """The remote agent accepted the answer to the ``question`` gate ``gate_id``: the remote
    task is followed again. Record format 8."""

    type: Literal["agent_answer_sent"] = "agent_answer_sent"
    format: int = Field(default=8, ge=1)
    task_id: str
    attempt: int
    gate_id: str
    message_id: str


class AttemptFailed(_Fact):
    type: Literal["attempt_failed"] = "attempt_failed"
    task_id: str
    attempt: int
    error: TypedError
    telemetry: Telemetry = Telemetry()
    not_before: datetime | None = None


class TaskCompleted(_Fact):
    type: Literal["task_completed"] = "task_completed"
    task_id: str
    attempt: int
    executor: str
    output: str
    output_sha256: str
    telemetry: Telemetry = Telemetry()
    #: The validated value of ``output`` for a step with an ``output_schema`` (None otherwise).
    #: Added without a new record format ("Record formats" in docs/development.md): a fact without
    #: it is the output of an untyped step, and a reader that does not know the field loses nothing
    #: it decides on.
    #: (A routed value is decided on; but a run that routes holds route_decided facts, format 2.)
    value: dict[str, Any] | None = None


class TaskFailed(_Fact):
    type: Literal["task_failed"] = "task_failed"
    task_id: str
    error: TypedError


class RouteDecided(_Fact):
    """Where a routing task's validated output sent the run (see :mod:`orchestration.core.routing`):
    which task and output fact, which field and value, the route's target, and what was done —
    the target, or the routing step's ``on_exhausted`` when the target's bound was reached.
    Written by the drive from ``next_action``'s ``RouteTask``; folding it creates the instances a
    loop needs, skips what a forward route jumps over, or ends the run (``end``/``fail``)."""

    type: Literal["route_decided"] = "route_decided"
    format: int = Field(default=2, ge=1)
    task_id: str
    output_seq: int
    route_on: str
    value: str | None
    target: str
    applied: str
    next_task_id: str | None = None
    exhausted: bool = False
    bounded_step: str | None = None
    visits: int | None = None
    error: TypedError | None = None


def route_decided(plan: RoutePlan, seq: int, at: datetime) -> RouteDecided:
    """The fact that records ``plan`` (made by ``next_action``) as the ``seq``-th fact."""
    return RouteDecided(
        seq=seq,
        at=at,
        task_id=plan.task_id,
        output_seq=plan.output_seq,
        route_on=plan.route_on,
        value=plan.value,
        target=plan.target,
        applied=plan.applied,
        next_task_id=plan.next_task_id,
        exhausted=plan.exhausted,
        bounded_step=plan.bounded_step,
        visits=plan.visits,
        error=plan.error,
    )


class ChildStarted(_Fact):
    """A child run is linked to ``task_id`` (:mod:`orchestration.engine.children`). For a step that runs
    a chain (``by = "step"``) it is recorded *before* the child is created, with the child's run id
    derived from the run and the task instance, so a restart finds the same child; the task is
    then running and the run awaits its children. A host's child (``by = "host"``) is recorded
    after the child was created, on the task the host works on."""

    type: Literal["child_started"] = "child_started"
    format: int = Field(default=4, ge=1)
    task_id: str
    child_run_id: str
    chain: str
    by: Literal["step", "host"] = "step"


class ChildEnded(_Fact):
    """The child run ``child_run_id`` of ``task_id`` ended with ``status``. For a step's child it is
    written together with the task's outcome (``task_completed`` with the child's output, or
    ``task_failed`` with a typed ``child_*`` error)."""

    type: Literal["child_ended"] = "child_ended"
    format: int = Field(default=4, ge=1)
    task_id: str
    child_run_id: str
    status: str
    error: TypedError | None = None


class RunCancelled(_Fact):
    type: Literal["run_cancelled"] = "run_cancelled"
    reason: str | None = None
    cancelled_by: str | None = None
    #: how the cancel came in and whether ``cancelled_by`` was verified (an HTTP token's identity)
    #: or only claimed, as ``approval_decided`` records them. Informational and left out when
    #: absent, so no new record format: a fact without them reads as "channel unknown, claimed".
    channel: DecisionChannel | None = Field(default=None, exclude_if=lambda v: v is None)
    verified: bool = Field(default=False, exclude_if=lambda v: not v)


class RunFinished(_Fact):
    type: Literal["run_finished"] = "run_finished"
    status: Literal["completed", "completed_with_failures", "failed"]
    error: TypedError | None = None


class ChainUpgraded(_Fact):
    """The run moved to another version of its chain (:mod:`orchestration.core.upgrades`): from
    this fact on it folds and decides against ``chain``."""

    type: Literal["chain_upgraded"] = "chain_upgraded"
    format: int = Field(default=7, ge=1)
    from_hash: str
    to_hash: str
    chain: ChainSnapshot
    #: who asked for the move (a verified identity, a name claimed, or ``policy`` for a chain whose
    #: runs move by themselves), and why
    by: str | None = None
    verified: bool = False
    reason: str | None = None


# -- A2A push notification configs (record format 8) -----------------------------------------


class PushConfigured(_Fact):
    """A caller asked for the run's status changes at a webhook (an A2A push notification config,
    :mod:`server.a2a.push_notifier`). The client's ``token`` and its ``authentication`` credentials
    are secrets: recorded only sealed (``sealed_token``, ``sealed_credentials``: AES-GCM under a
    key of the server's signing key, :mod:`server.a2a.push_keys`), never in clear. A config of the
    same ``config_id`` replaces the one before. Record format 8: an older reader must refuse a run
    that has one (its webhook would stop hearing from the run)."""

    type: Literal["push_configured"] = "push_configured"
    format: int = Field(default=8, ge=1)
    config_id: str
    url: str
    sealed_token: str | None = None
    #: the HTTP authentication scheme of ``authentication`` (``Bearer``, ...), in clear
    auth_scheme: str | None = None
    sealed_credentials: str | None = None
    #: the verified identity that set it (None: a local or unauthenticated caller)
    by: str | None = None

    @property
    def origin(self) -> str:
        """The webhook's scheme, host and port: what a log line or a timeline shows of it (its
        path or query may carry what its owner keeps to itself)."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"


class PushConfigDeleted(_Fact):
    """The push notification config ``config_id`` is removed: nothing more is sent to it.
    Record format 8."""

    type: Literal["push_config_deleted"] = "push_config_deleted"
    format: int = Field(default=8, ge=1)
    config_id: str
    by: str | None = None


Fact = Annotated[
    RunCreated
    | ApprovalRequested
    | ApprovalDecided
    | HostTaskPrepared
    | HostOutputSubmitted
    | AttemptStarted
    | RemoteRunStarted
    | RemoteRunCancelled
    | AgentQuestionAsked
    | AgentAnswerSending
    | AgentAnswerSent
    | AttemptFailed
    | TaskCompleted
    | TaskFailed
    | RouteDecided
    | ChildStarted
    | ChildEnded
    | RunCancelled
    | RunFinished
    | ChainUpgraded
    | PushConfigured
    | PushConfigDeleted,
    Field(discriminator="type"),
]

FACT_ADAPTER: TypeAdapter[Fact] = TypeAdapter(Fact)
FACTS_ADAPTER: TypeAdapter[list[Fact]] = TypeAdapter(list[Fact])


#: Every fact ``type`` this code knows.
FACT_TYPES: frozenset[str] = frozenset(
    cls.model_fields["type"].default for cls in get_args(get_args(Fact)[0])
)


def parse_fact(data: str | bytes) -> Fact:
    """A stored fact read back; fields this code does not know are ignored ("Record formats"
    in docs/development.md). The caller checks ``format`` against ``RECORD_FORMAT``."""
    return FACT_ADAPTER.validate_json(data, extra="ignore")


def parse_head(data: str | bytes) -> RunHead:
    """A stored head read back; fields this code does not know are ignored ("Record formats"
    in docs/development.md). The caller checks ``format`` against ``RECORD_FORMAT``."""
    return RunHead.model_validate_json(data, extra="ignore")


def dump_fact(fact: Fact) -> str:
    return fact.model_dump_json()

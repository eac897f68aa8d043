"""Immutable domain records: chain snapshots, the execution contract, task and gate states, the run
head, typed errors and telemetry. Every record is frozen; a change makes a copy. The head holds no
task output, only a reference to the fact that carries it, so writing a head costs the same
whatever the size of earlier outputs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestration.core.costs import Costs, Spend
from orchestration.core.memo import by_identity
from orchestration.core.vocabulary import RunStatus, TaskStatus

#: The newest stored-record format this code understands.
#: Every stored head and fact states the format a reader must understand to read it; a record
#: without one is format 1. The rules: "Record formats" in docs/development.md.
#: Format 4: budgets (a run with a budget, a ``budget`` gate: :mod:`orchestration.core.budget`).
#: Format 4 also: child runs (a run ``awaiting_children``, ``child_started`` / ``child_ended``).
#: Format 4 also: steps that delegate to another MCP agent (``agent``, ``remote_run_started``).
#: Format 5: a chain-level gate policy (:attr:`ChainSnapshot.approvers`).
#: Format 6: a run ``awaiting_agent`` (an agent step's remote run followed without a lease:
#: :mod:`orchestration.engine.agent_waits`), ``waits`` on ``remote_run_started`` /
#: ``attempt_started``, and ``remote_run_cancelled``.
#: Format 7: a run moved to another version of its chain (``chain_upgraded``).
#: Format 8: an A2A agent's question as a gate of the run (gate position ``question``,
#: ``agent_question_asked``, ``agent_answer_sending``, ``agent_answer_sent``:
#: :mod:`orchestration.engine.agent_questions`).
RECORD_FORMAT = 8


class Frozen(BaseModel):
    """Immutable and strict: building a record with a field it does not have is an error. Stored
    records are read back leniently instead (see ``parse_head``/``parse_fact`` in
    :mod:`orchestration.core.facts`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


F = TypeVar("F", bound=Frozen)
_set = object.__setattr__


def evolve(record: F, update: Mapping[str, Any]) -> F:
    """``record.model_copy(update=update)``, in a fraction of its time (the fold makes
    several copies per fact): the new record shares every unchanged value with ``record``, keeps
    its fields in the same order, and counts the updated ones as set, as ``model_copy`` does.
    Like it, nothing is validated: ``update`` holds values of the fields' types. Frozen records
    have no extra fields and no private attributes, so there is nothing else to copy."""
    new = object.__new__(type(record))
    values = record.__dict__.copy()
    values.update(update)
    _set(new, "__dict__", values)
    _set(new, "__pydantic_fields_set__", record.__pydantic_fields_set__.union(update))
    _set(new, "__pydantic_extra__", None)
    _set(new, "__pydantic_private__", None)
    return new


def built(cls: type[F], values: Mapping[str, Any]) -> F:
    """``cls(**values)`` for values that already are of their fields' types (taken from validated
    records, as the fold takes them from facts): not validated, as ``model_construct`` or
    ``evolve``, in a fraction of the time of either. The fields not given have their defaults
    (immutable: a class with a default factory cannot be built so), the given ones are set."""
    defaults = _defaults.get(cls)
    if defaults is None:
        defaults = _defaults[cls] = _defaults_of(cls)
    fields = defaults.copy()
    fields.update(values)
    new = object.__new__(cls)
    _set(new, "__dict__", fields)
    _set(new, "__pydantic_fields_set__", set(values))
    _set(new, "__pydantic_extra__", None)
    _set(new, "__pydantic_private__", None)
    return new


_defaults: dict[type[Frozen], dict[str, Any]] = {}


def _defaults_of(cls: type[Frozen]) -> dict[str, Any]:
    """Each field of ``cls`` in order, with its default (None for a required one: given always)."""
    if cls.__private_attributes__:
        raise TypeError(f"{cls.__name__} has private attributes")
    defaults: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        if field.default_factory is not None:
            raise TypeError(f"{cls.__name__}.{name} has a default factory")
        defaults[name] = None if field.is_required() else field.default
    return defaults


OnFailure = Literal["fail", "continue"]
OnExpiry = Literal["reject", "approve", "fail"]
WorkerBackend = Literal["inline", "provider"]


#: Separates a step's name from its visit number in the id of a later task instance
#: (``engineer~2``). Step names never contain it, so an instance id is never a step name.
INSTANCE_SEPARATOR = "~"

#: Route targets that are not steps: ``end`` finishes the run, ``fail`` fails it. ``ask`` is an
#: ``on_exhausted`` choice (a human decides). No step may be called any of these.
RESERVED_STEP_NAMES = frozenset({"end", "fail", "ask"})

#: The approver name that means *the calling agent itself*, not a person: a gate whose policy
#: (``approvers``) lists it may be decided by the agent that drives the run, with ``approver =
#: "agent"``; every other gate is a person's (see :mod:`orchestration.core.approvals`). No HTTP
#: token identity may take this name, so a record naming it always means the agent's own decision.
AGENT_APPROVER = "agent"


#: the ``tool`` of a step that sends a message to an A2A agent (the A2A method it calls)
A2A_SEND = "message/send"


class AgentStep(Frozen):
    """What a step that delegates to another MCP agent calls (``agent = "..."`` in a chain step; the
    rule is in :mod:`orchestration.core.agent_steps`): the agent's name (an ``[agents.NAME]`` table of the
    server's config, resolved when the call is made, never snapshotted: it holds no secret here),
    the tool, and its arguments, whose strings are templates rendered from the run's record. A
    snapshot with one is record format 4 (an older server would run the step as a specialist)."""

    agent: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    #: another construct-mcp (tool ``orchestrate_start``): the remote step whose output becomes this
    #: step's output (its latest visit); None: the remote run's last done task
    output_step: str | None = None

    @property
    def sends_messages(self) -> bool:
        """Whether the agent is an A2A agent (tool :data:`A2A_SEND`, the step's ``message``
        template in ``arguments["message"]``): the message starts a remote task, followed with
        ``tasks/get`` until it ends."""
        return self.tool == A2A_SEND

    @property
    def follows_runs(self) -> bool:
        """Whether the call starts a remote run that is followed until it ends: a construct-mcp's
        ``orchestrate_start`` (it takes an ``idempotency_key``; followed with ``run_status``) or an
        A2A agent's message (:attr:`sends_messages`)."""
        return self.tool == "orchestrate_start" or self.sends_messages


class ChainStep(Frozen):
    """One step of a chain: a named task run by one specialist.

    A step with an ``output_schema`` may *route* on one of its output's fields (``route_on``):
    ``routes`` maps each value the schema allows to a step name, ``end`` or ``fail``. Each visit of
    a step is a task instance of its own (see :func:`instance_id`); ``max_visits`` bounds them, and
    the routing step's ``on_exhausted`` says what happens when a route would exceed a bound
    (``fail``, ``end``, ``ask`` or a later step's name). :mod:`orchestration.core.routing` holds the
    rules and the checks made when a chain is loaded."""

    name: str = Field(description="Unique within the chain; the first visit's task id.")
    specialist: str
    approve_before: bool = False
    approve_after: bool = False
    on_failure: OnFailure = "fail"
    provider: str | None = None
    model: str | None = None
    timeout_seconds: float | None = None
    #: The JSON Schema every answer of this step must match (resolved from a built-in name or the
    #: chain definition when the run started, see :mod:`orchestration.chains.schemas`); None: free text.
    #: Added without a new record format: a snapshot without it is a chain of free-text steps,
    #: which is what it was when it was written.
    output_schema: dict[str, Any] | None = None
    #: the field of the output this step routes on, and where each of its values goes
    #: (a step name, ``end`` or ``fail``); a snapshot without them is a linear chain
    route_on: str | None = None
    routes: dict[str, str] | None = None
    max_visits: int = Field(default=3, ge=1)
    on_exhausted: str = "fail"
    #: the steps this one runs after (all of them settled first); None: the previous step of the
    #: chain, as in every chain written before steps could run in parallel (see
    #: :mod:`orchestration.core.graph`). A snapshot without it is a linear chain.
    after: tuple[str, ...] | None = None
    #: this step's own instruction, added to its prompt (the angle a researcher takes)
    instruction: str | None = None
    #: a gate of this step left undecided this long after it was requested is decided by expiry
    #: (``on_expiry``: reject, approve, or fail the run with ``approval_expired``); None: it waits
    expires_after_seconds: float | None = Field(default=None, gt=0)
    on_expiry: OnExpiry = "reject"
    #: who may decide this step's gates: identities, and :data:`AGENT_APPROVER` for the calling
    #: agent itself; None: the chain's policy (:attr:`ChainSnapshot.approvers`), else any person
    approvers: tuple[str, ...] | None = None
    #: a step that runs another chain as a child run (see :mod:`orchestration.engine.children`): that
    #: chain's name (``specialist`` is then ``chain:<name>``, a label), and the child's step whose
    #: output becomes this step's (None: the child's last done task). Record format 4.
    chain: str | None = None
    output_of: str | None = None
    #: the step delegates to a tool of another MCP agent instead of running its specialist (see
    #: :class:`AgentStep`); its ``specialist`` is then ``agent:<name>``, a label only
    agent: AgentStep | None = None

    @field_validator("name")
    @classmethod
    def _no_separator(cls, value: str) -> str:
        if INSTANCE_SEPARATOR in value:
            raise ValueError(f"a step name cannot contain {INSTANCE_SEPARATOR!r} (it marks later visits)")
        return value


class SpecialistSnapshot(Frozen):
    """A specialist as it was when the run started (its persona is part of the snapshot)."""

    name: str
    description: str
    persona: str


class ChainSnapshot(Frozen):
    """The chain as resolved at start. Resuming never re-reads the config file."""

    name: str
    steps: tuple[ChainStep, ...]
    specialists: tuple[SpecialistSnapshot, ...]
    #: how many of the run's ready steps the provider backend runs at the same time
    max_parallel: int = Field(default=4, ge=1)
    #: child runs (:mod:`orchestration.engine.children`): how many may be live at once (None: no limit),
    #: and how deep a run of this chain may start them (a child of depth > ``max_depth`` fails)
    max_children: int | None = Field(default=None, ge=1)
    max_depth: int = Field(default=3, ge=0)
    #: the chain's gate policy: who decides every gate whose step names no ``approvers`` of its own,
    #: and the run's budget gates (:func:`~orchestration.core.approvals.gate_approvers`); None: a
    #: person. Record format 5 when set (an older server would let anyone decide those gates). Left
    #: out of the record when unset, so a chain without it is stored and hashed as before.
    approvers: tuple[str, ...] | None = Field(default=None, exclude_if=lambda v: v is None)

    def step(self, name: str) -> ChainStep:
        return step_map(self)[name]

    def index(self, name: str) -> int:
        """The position of step ``name`` in the chain (KeyError when it has none)."""
        return _step_positions(self)[name]

    def specialist(self, name: str) -> SpecialistSnapshot:
        for spec in self.specialists:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def content_hash(self) -> str:
        return _content_hash(self)


@by_identity
def _content_hash(chain: ChainSnapshot) -> str:
    """A snapshot's content hash, once per snapshot object (a catalog hands the same snapshot to
    every start of the same chain: :meth:`~orchestration.chains.catalog.Catalog.resolve`)."""
    return canonical_hash(chain.model_dump(mode="json"))


@by_identity
def _step_positions(chain: ChainSnapshot) -> Mapping[str, int]:
    """Each step's position by name (the first, should a name repeat), once per snapshot: every
    decision looks steps up by name (see :mod:`orchestration.core.memo`)."""
    positions: dict[str, int] = {}
    for i, step in enumerate(chain.steps):
        positions.setdefault(step.name, i)
    return MappingProxyType(positions)


@by_identity
def step_map(chain: ChainSnapshot) -> Mapping[str, ChainStep]:
    """The chain's steps by name, as :meth:`ChainSnapshot.step` finds them (once per snapshot)."""
    return MappingProxyType({name: chain.steps[i] for name, i in _step_positions(chain).items()})


class ExecutionContract(Frozen):
    """How the run's tasks are executed, resolved once at start and persisted (DESIGN §3)."""

    worker_backend: WorkerBackend = "inline"
    provider: str | None = None
    model: str | None = None
    max_attempts: int = 3
    #: prices, the output limit of a call and the budget, as they were at start (see
    #: :mod:`orchestration.core.costs`); None: a run started before costs were recorded. A contract
    #: with a budget makes the run record format 4 (:meth:`record_format`)
    costs: Costs | None = None

    def record_format(self) -> int:
        """The record format of a run started with this contract: 4 when it has a budget (an
        older server would ignore the budget and spend past it), else 1."""
        return 4 if self.costs is not None and self.costs.budget is not None else 1

    def executor_for(self, step: ChainStep) -> str:
        if step.agent is not None:
            return f"agent:{step.agent.agent}:{step.agent.tool}"
        if self.worker_backend == "inline":
            return "inline:host"
        provider = step.provider or self.provider
        model = step.model or self.model
        return f"provider:{provider}:{model}"


class TypedError(Frozen):
    """A failure as data: a stable ``code``, a message, and whether retrying could help."""

    code: str
    message: str
    retryable: bool = False
    http_status: int | None = None
    retry_after_seconds: float | None = None
    provider_request_id: str | None = None


class Telemetry(Frozen):
    latency_ms: float | None = None
    http_status: int | None = None
    provider_request_id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    possible_duplicate_call: bool = False
    #: what the tokens cost at the run's recorded prices (set by the fold, or as the host
    #: reported it); None: unknown (no price for the model, or no usage)
    cost_usd: float | None = None
    #: the usage was reported by the host with its output (a host task), not measured here
    reported_by_host: bool = False
    #: a streamed call: from the request to the first output delta, and from the response's
    #: headers to its last event (None: not streamed, or no delta came)
    first_token_ms: float | None = None
    stream_ms: float | None = None


class PromptRead(Frozen):
    """How much of a host task's user prompt the host fetched, when it was handed out in parts
    (``task_prompt``): ``read`` of its ``chars`` characters, each counted once, as the server
    process that took the output served them. The run does not depend on it (the output is
    recorded either way); it makes a host that skipped parts visible in the run."""

    chars: int = Field(ge=0)
    read: int = Field(ge=0)

    @property
    def whole(self) -> bool:
        return self.read >= self.chars


class AttemptRecord(Frozen):
    number: int
    executor: str
    started_at: datetime
    finished_at: datetime | None = None
    outcome: Literal["running", "succeeded", "failed", "prepared"] = "running"
    error: TypedError | None = None
    telemetry: Telemetry = Telemetry()
    #: an agent step's attempt: the remote run it started or follows (once known), and the earlier
    #: attempt whose remote call it follows (None: it made its own call)
    remote_run_id: str | None = None
    follows: int | None = None
    #: the remote run is followed outside any drive while the run is ``awaiting_agent`` (record
    #: format 6; left out of the record when False, so older heads read the same)
    waits: bool = Field(default=False, exclude_if=lambda v: not v)
    #: a host task's attempt whose prompt was handed out in parts: how much of it the host read
    #: (left out when None, so older heads read the same)
    prompt_read: PromptRead | None = Field(default=None, exclude_if=lambda v: v is None)
    #: an A2A agent's question in play for this attempt (record format 8): the id of its
    #: ``question`` gate, from the question until the answer was sent (while the gate is
    #: requested the attempt is parked, ``waits`` False: nobody follows the remote task)
    question: str | None = Field(default=None, exclude_if=lambda v: v is None)
    #: the answer to ``question`` is being sent (``agent_answer_sending`` recorded, no
    #: ``agent_answer_sent`` yet): a send after a crash may be a duplicate
    answer_sending: bool = Field(default=False, exclude_if=lambda v: not v)


class ChildRef(Frozen):
    """A child run linked to a task (:mod:`orchestration.engine.children`): started by the task's step
    (``by = "step"``) or by the host working on it (``"host"``); ``status`` is ``active`` until the
    child's end is recorded on the parent, then the child's terminal status."""

    run_id: str
    by: Literal["step", "host"] = "step"
    status: str = "active"


class ParentLink(Frozen):
    """The task of another run that started this one as a child run, and this run's depth."""

    run_id: str
    task_id: str
    depth: int = Field(default=1, ge=1)


#: A server's identity as it travels in a delegation's ``servers`` list (see
#: :mod:`orchestration.core.hops`): letters, digits, ``-`` and ``_``, at most 100 characters.
SERVER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$"


class Delegation(Frozen):
    """How a run was started by another server's agent step (:mod:`orchestration.core.hops`): the
    hop count of its start (1: a top-level run's agent step started it) and the identities of the
    servers the delegation passed through, oldest first. Client input (a call's ``_meta``), so
    every part is bounded."""

    hops: int = Field(ge=1, le=1000, strict=True)
    servers: tuple[Annotated[str, Field(pattern=SERVER_ID_PATTERN)], ...] = Field(default=(), max_length=50)


class TaskState(Frozen):
    """A task's state in the run head.

    While a task is pending or in progress the head carries everything :func:`next_action
    <orchestration.core.decide.next_action>` needs: its attempts, executor, prompt hash and times. Once the
    task is terminal the head keeps it *settled* (:meth:`settled`): only its id, specialist, status,
    the sequence number of its output fact and its error. Its history stays in the fact log, and
    :func:`orchestration.core.fold.with_history` folds it back for views. So the head, which a store
    rewrites at every append, does not grow as tasks finish, and neither does the cost of a write.

    A task is one *instance* of a chain step: ``step`` names the step and ``visit`` counts its
    visits (both absent for a first visit, whose task id is the step name: so every head written
    before steps could be revisited reads the same). A routing step's settled task keeps the value
    of the field it routes on (``route_value``, small) and what its route did (``routed_to``),
    which is all :func:`~orchestration.core.decide.next_action` needs; the output stays in its fact.
    """

    task_id: str
    specialist: str
    #: the chain step this task instantiates; None: the step named ``task_id``
    step: str | None = None
    #: which visit of its step this is; None: the first
    visit: int | None = None
    #: the routing task whose route created this instance (its output sent the work back)
    sent_back_by: str | None = None
    #: the gate whose ``revise`` created this instance, and the task whose output it sent back
    revised_by: str | None = None
    revision_of: str | None = None
    #: the task a move to another chain version replaced with this instance (its step changed
    #: while the task was handed to the host); left out of the record when None, so no new format
    upgraded_from: str | None = Field(default=None, exclude_if=lambda v: v is None)
    #: a routing step's task: the value of the field it routes on, from its validated output
    route_value: str | None = None
    #: a routing step's task, once routed: the task the run went on with, or end, fail or ask
    routed_to: str | None = None
    status: TaskStatus = TaskStatus.PENDING
    executor: str | None = None
    attempts: tuple[AttemptRecord, ...] = ()
    prompt_sha256: str | None = None
    output_seq: int | None = Field(
        default=None, description="Sequence number of the fact that carries the task's output."
    )
    output_chars: int | None = None
    output_sha256: str | None = None
    error: TypedError | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: the child runs linked to this task, oldest first (None: none)
    children: tuple[ChildRef, ...] | None = None

    @property
    def step_name(self) -> str:
        """The chain step this task instantiates."""
        return self.step or self.task_id

    @property
    def visit_number(self) -> int:
        return self.visit or 1

    def settled(self) -> TaskState:
        """This terminal task as the head keeps it: what deciding and reading outputs need."""
        values = self.__dict__
        return built(TaskState, {name: values[name] for name in _SETTLED_FIELDS})


#: what a settled task keeps (see :meth:`TaskState.settled`)
_SETTLED_FIELDS = (
    "task_id",
    "specialist",
    "step",
    "visit",
    "sent_back_by",
    "revised_by",
    "revision_of",
    "upgraded_from",
    "route_value",
    "routed_to",
    "status",
    "output_seq",
    "error",
    "children",
)


def instance_id(step: str, visit: int) -> str:
    """The task id of a step's ``visit``-th instance: the step's name for the first visit (as in
    every run recorded before steps could be revisited), ``engineer~2`` for the second, and so
    on. Unique within a run, URI-safe (``~`` is unreserved in RFC 3986) and never a step name."""
    return step if visit == 1 else f"{step}{INSTANCE_SEPARATOR}{visit}"


#: ``revised``: sent back (the step whose output the gate showed runs again, see
#: :func:`orchestration.core.routing.revise_plan`); ``failed``: expired with ``on_expiry = "fail"``
GateStatus = Literal["pending", "requested", "approved", "rejected", "revised", "failed"]
#: What a gate's decision can be: ``revise`` sends the work back; ``fail`` is only recorded by
#: expiry (``on_expiry = "fail"``). ``revise`` and ``fail`` came with record format 3.
Decision = Literal["approve", "reject", "revise", "fail"]
#: the status a gate's decision leaves it in
GATE_STATUS_OF: dict[str, GateStatus] = {
    "approve": "approved",
    "reject": "rejected",
    "revise": "revised",
    "fail": "failed",
}
#: ``exhausted``: a routing task's route would exceed a step's ``max_visits`` and its step's
#: ``on_exhausted`` is ``ask``: a human decides whether the work is accepted (gate id
#: ``exhausted:<task id>``)
#: ``budget``: a provider call the run's budget did not allow, with ``on_budget = "ask"`` (gate id
#: ``budget:<n>``, created when requested; record format 4: see :mod:`orchestration.core.budget`)
#: ``question``: a remote A2A task of an agent step stopped at ``input-required``; the gate's
#: ``note`` is its question, an approval's comment the answer sent back (gate id
#: ``question:<task id>:<n>``, created when asked; record format 8)
GatePosition = Literal["before", "after", "exhausted", "budget", "question"]
#: How a decision reached the server: a tool call over HTTP or stdio, the CLI; ``elicitation``,
#: ``web`` and ``expiry`` are reserved for the ways still to come (declared now, so that a fact
#: recording one stays readable by this code without a new record format).
DecisionChannel = Literal["http", "stdio", "cli", "elicitation", "web", "expiry"]


class GateState(Frozen):
    gate_id: str
    task_id: str
    position: GatePosition
    status: GateStatus = "pending"
    requested_at: datetime | None = None
    decided_at: datetime | None = None
    comment: str | None = None
    approver: str | None = None
    #: how the decision came in (None: recorded before channels were, or by an older server)
    channel: DecisionChannel | None = None
    #: True when ``approver`` is an identity the server verified (an HTTP token's); False when it
    #: is only what the caller claimed (stdio's ``approver`` argument, the CLI's user)
    verified: bool = False
    #: when a requested gate of a step with ``expires_after_seconds`` is decided by expiry
    expires_at: datetime | None = None
    #: a ``budget`` gate: the step whose budget was hit (None: the run's), and what was spent and
    #: what the next call may need, in words
    budget_step: str | None = None
    note: str | None = None
    #: a ``question`` gate: the agent that asks, the attempt whose remote task asks, and which
    #: of the task's questions it is (1, 2, ...); left out when None
    agent: str | None = Field(default=None, exclude_if=lambda v: v is None)
    attempt: int | None = Field(default=None, exclude_if=lambda v: v is None)
    number: int | None = Field(default=None, exclude_if=lambda v: v is None)
    #: a ``question`` gate: the remote task's id of that asking (its status message's), so that
    #: the same question read again before the remote took the answer is not asked twice
    asked_id: str | None = Field(default=None, exclude_if=lambda v: v is None)
    #: a ``question`` gate: the remote task's context id, which the answer names
    context_id: str | None = Field(default=None, exclude_if=lambda v: v is None)


def gate_id_for(position: GatePosition, task_id: str) -> str:
    return f"{position}:{task_id}"


class RunHead(Frozen):
    """The current state of a run: the fold of its facts, cached by the store for fast reads.

    ``version`` counts the writes made to the run (creation is version 1); every write is a
    compare-and-swap on it. ``last_seq`` is the sequence number of the newest fact.
    """

    run_id: str
    version: int
    last_seq: int
    status: RunStatus
    request: str
    chain: ChainSnapshot
    chain_hash: str
    contract: ExecutionContract
    idempotency_key: str | None = None
    request_hash: str
    #: the verified identity (an HTTP token's) that started the run; None for stdio and the CLI.
    #: A head rewritten by a server that predates the field loses it: identities limited to their
    #: own runs then no longer see the run (the safe direction).
    started_by: str | None = None
    #: the W3C traceparent of ``run_created`` (write-once): every drive's spans, in any process,
    #: continue that trace. A head rewritten by an older server loses it (only the trace suffers).
    traceparent: str | None = None
    tasks: tuple[TaskState, ...]
    gates: tuple[GateState, ...]
    not_before: datetime | None = None
    #: the run's own deadline (``timeout_seconds`` at start); passing it fails the run
    deadline_at: datetime | None = None
    #: the task of another run that started this run as a child (None: a top-level run)
    parent: ParentLink | None = None
    #: the delegation that started this run (write-once, from ``run_created``; None: not started by
    #: an agent step of another server); its own agent steps send one hop more. A head rewritten by
    #: an older server loses it: its agent steps then send hop 1 and no servers (as an older server).
    delegation: Delegation | None = Field(default=None, exclude_if=lambda v: v is None)
    #: the earliest time at which the run needs a decision although nobody wrote to it: the run's
    #: deadline or the deadline of the task in progress. Stores index it so that a dispatcher finds
    #: paused runs whose time ran out while no process was up.
    wake_at: datetime | None = None
    error: TypedError | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    #: running totals of what the run spent, and what approvals added to its budget (see
    #: :mod:`orchestration.core.costs`); kept in the head so that a budget check reads no fact. None:
    #: nothing spent yet (or a head written before spend was kept)
    spent: Spend | None = None
    #: whether the run moved off the chain it was created with (``chain_upgraded``): a store that
    #: keeps the creation chain apart from the head keeps this run's chain with its head. Left out
    #: of the record when False
    chain_moved: bool = Field(default=False, exclude_if=lambda v: not v)
    #: the ids of the run's A2A push notification configs (``push_configured`` less
    #: ``push_config_deleted``; the configs themselves are in those facts): the notifier reads this
    #: at each change, the log only for a run that has some. Left out of the record when empty
    push_configs: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)
    #: the record format a reader must understand to read this head: the highest ``format`` of the
    #: facts folded into it (see "Record formats" in docs/development.md). Declared last, so
    #: that a stored head starts with ``run_id``, ``version`` and ``last_seq``.
    format: int = Field(default=1, ge=1)

    def task(self, task_id: str) -> TaskState:
        return self.tasks[task_position(self, task_id)]

    def step_of(self, task_id: str) -> ChainStep:
        """The chain step task ``task_id`` instantiates (KeyError for an unknown task)."""
        return self.chain.step(self.task(task_id).step_name)

    def gate(self, gate_id: str) -> GateState | None:
        for gate in self.gates:
            if gate.gate_id == gate_id:
                return gate
        return None


def task_position(head: RunHead, task_id: str) -> int:
    """Where task ``task_id`` is in ``head.tasks`` (KeyError when the run has none). A run's tasks
    start one per step in chain order, and stay there unless a route or a revise inserts a new
    instance: the step's position is tried first, and checked (task ids are unique), so a lookup
    does not scan the tasks (the fold and every decision look tasks up by id)."""
    tasks = head.tasks
    guess = _step_positions(head.chain).get(task_id)
    if guess is not None and guess < len(tasks) and tasks[guess].task_id == task_id:
        return guess
    for index, task in enumerate(tasks):
        if task.task_id == task_id:
            return index
    raise KeyError(task_id)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def canonical_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()

"""What the tools answer: typed views of a run, built from the persisted record only.

These pydantic models are the tools' output models, so hosts get them as ``structuredContent`` (and
as the JSON text). :func:`run_view` turns a :class:`~orchestration.engine.runtime.RunSnapshot` (the head,
the persisted outputs and, when the run awaits the host, the materialized prompts) into a
:class:`RunView`; :func:`runs_page` turns a page of heads into a :class:`RunsPage`.

The most important field is ``next_action``: what the caller must do now — run a host task and
resume with its output, approve a gate, wait, or nothing — as a call (``tool`` and the ``arguments``
to send it) and an ``instruction`` sentence a host model can follow without reading any
documentation; in a parallel run whose branches wait at once,
``more_actions`` holds every other host task and gate (see :mod:`server.views.next_step`).

Views are sized for a model's context: every answer is a view, and a host may show all of it to its
model. So a view is *compact* by default: each finished task's output appears as a preview (its
first :data:`OUTPUT_PREVIEW_CHARS` characters, its length, its sha256 and the URI of the whole
output, ``run://<run_id>/tasks/<task_id>/output``), and the prompts of the host task to run now are
the only place upstream outputs appear in full. ``detail="full"`` puts every whole output in the
view; ``full_task`` puts one task's whole output in it. The request, which the host gave and the
host task's prompt carries, is a preview too (whole with ``detail="full"``). A typed task's validated
``value`` is shown whole when its JSON is small (:data:`VALUE_INLINE_CHARS`; a verdict with its notes
is), else only in a full view: its text is the output, one call away like any other.

The published ``outputSchema`` of :class:`RunView` and :class:`RunsPage` is an *outline* (see
:class:`~server.views.outline.Outlined`): their top-level fields with types, nested objects as plain
objects described in a sentence. The whole nested schema, repeated by each of the five tools that
answer with a run view, made ``tools/list`` about 60 KB, which a host pays for in every
conversation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from orchestration.core import (
    AttemptRecord,
    ChainSnapshot,
    ChainStep,
    DecisionChannel,
    ExecutionContract,
    GateState,
    PromptRead,
    RunHead,
    RunStatus,
    TaskState,
    TaskStatus,
    TypedError,
    by_identity,
    gate_approvers,
    parked_question,
    revise_offered,
    shown_key,
)
from orchestration.engine import RunSnapshot
from orchestration.errors import InvalidArgument
from server.views.attendance import Unattended
from server.views.budget_view import BudgetView, budget_view
from server.views.graph_view import RouteView, loop_history, route_view, waits_for

# The next-action models live in server.views.next_step; views re-exports them (tools, the CLI and tests
# import them from here).
from server.views.next_step import Approve as Approve
from server.views.next_step import Done as Done
from server.views.next_step import NextAction as NextAction
from server.views.next_step import RunHostTask as RunHostTask
from server.views.next_step import Wait as Wait
from server.views.next_step import next_step as next_step
from server.views.next_step import waiting_items
from server.views.outline import Outlined, View

#: ``runs_list`` and compact views show this much of each request.
REQUEST_PREVIEW_CHARS = 200

#: A compact view shows this many characters of each task's output.
OUTPUT_PREVIEW_CHARS = 200

#: A compact view shows a typed task's validated value whole when its JSON has at most this many
#: characters (a verdict with its notes, typically); a larger value only in a full view.
VALUE_INLINE_CHARS = 2000

#: How much of each task's output a view carries: a preview (``compact``) or all of it (``full``).
Detail = Literal["compact", "full"]


def output_uri(run_id: str, task_id: str) -> str:
    """The resource holding a task's whole output (``text/plain``, verbatim)."""
    return f"run://{run_id}/tasks/{task_id}/output"


class ErrorView(View):
    """A typed error: ``code`` is stable, ``message`` says what happened."""

    code: str
    message: str
    retryable: bool = False
    http_status: int | None = None
    retry_after_seconds: float | None = None
    provider_request_id: str | None = None


class TelemetryView(View):
    latency_ms: float | None = None
    http_status: int | None = None
    provider_request_id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = Field(default=None, description="At the run's prices; null: unknown.")
    reported_by_host: bool = Field(default=False, description="The host reported this usage (not measured).")
    first_token_ms: float | None = None
    stream_ms: float | None = None
    possible_duplicate_call: bool = Field(
        default=False,
        description="True when a worker died during an earlier attempt, so the provider may have been "
        "called twice for this task.",
    )


class PromptReadView(View):
    chars: int = Field(description="The user prompt's length in characters.")
    read: int = Field(description="How many of them the host fetched (task_prompt), each counted once.")
    whole: bool = Field(description="Whether the host fetched all of it.")

    @classmethod
    def of(cls, read: PromptRead) -> PromptReadView:
        return cls(chars=read.chars, read=read.read, whole=read.whole)


class AttemptView(View):
    number: int
    executor: str
    outcome: Literal["running", "succeeded", "failed", "prepared"] = Field(
        description="'prepared': the prompts were handed to the host, whose answer completes the attempt."
    )
    error: ErrorView | None = None
    telemetry: TelemetryView
    started_at: datetime
    finished_at: datetime | None = None
    remote_run_id: str | None = Field(
        default=None, description="A step that delegates to another construct-mcp: the run it started there."
    )
    follows: int | None = Field(
        default=None, description="The earlier attempt whose remote call this one follows (no new call)."
    )
    prompt_read: PromptReadView | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="A host task whose prompt was handed out in parts: how much of it the host read.",
    )


class Totals(View):
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    attempts: int = 0


class TaskView(View):
    task_id: str
    specialist: str
    status: TaskStatus
    executor: str | None = Field(
        default=None, description="Who produced the output: 'inline:host' or 'provider:<name>:<model>'."
    )
    attempts: list[AttemptView]
    output: str | None = Field(
        default=None,
        description="The task's whole recorded output, verbatim: only in a full view "
        "(run_status detail='full', or task_id naming this task).",
    )
    output_preview: str | None = Field(
        default=None,
        description=f"The output's first {OUTPUT_PREVIEW_CHARS} characters (all of it when shorter), "
        "in a compact view.",
    )
    output_chars: int | None = Field(default=None, description="The output's length in characters.")
    output_sha256: str | None = Field(default=None, description="sha256 of the output's UTF-8 bytes.")
    output_uri: str | None = Field(
        default=None, description="The resource that holds the whole output as text/plain."
    )
    step: str = Field(description="The chain step this task is an instance of.")
    visit: int = Field(default=1, description="Which visit of its step (task id step~N for N > 1).")
    sent_back_by: str | None = Field(
        default=None, description="The routing task whose output sent the work back to this one."
    )
    revised_by: str | None = Field(default=None, description="The gate whose revise created this task.")
    waits_for: str | None = Field(default=None, description="What this task waits for, if it has not ended.")
    value: dict[str, Any] | None = Field(
        default=None,
        description="A typed step's validated answer (it matched the step's output_schema); in a "
        f"compact view only when its JSON has at most {VALUE_INLINE_CHARS} characters.",
    )
    error: ErrorView | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    totals: Totals = Field(description="Tokens, latency and attempts of this task's attempts.")
    # Left out when absent (like forked_from): views of runs that are not forks stay as they were.
    copied_from: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="A fork's copy, not run here: the seq of its fact in forked_from's run.",
    )


class GateView(View):
    gate_id: str
    task_id: str
    position: Literal["before", "after", "exhausted", "budget", "question"] = Field(
        description="exhausted: a loop reached its bound and a human decides (see description); "
        "budget: the budget did not allow a call (see note); question: an agent asks (see note)."
    )
    note: str | None = Field(
        default=None,
        description="A budget gate: what was spent, what the call needs; a question gate: the question.",
    )
    agent: str | None = Field(
        default=None, description="A question gate: the agent that asks.", exclude_if=lambda v: v is None
    )
    budget_step: str | None = Field(
        default=None, description="A budget gate: the step whose budget; null: the run's."
    )
    status: Literal["pending", "requested", "approved", "rejected", "revised", "failed"] = Field(
        description="revised: sent back (revise); failed: expired with on_expiry fail."
    )
    description: str | None = Field(
        default=None,
        description="For an exhausted gate: the loop's rounds, each value and notes; for a question "
        "gate: the agent's question and how to answer it.",
    )
    decisions: list[Literal["approve", "reject", "revise"]] = Field(
        default_factory=list, description="The decisions a requested gate takes now."
    )
    approvers: list[str] | None = Field(
        default=None, description="Who may decide it (agent: you); none: a person."
    )
    expires_at: datetime | None = Field(default=None, description="When it is decided by on_expiry.")
    on_expiry: Literal["reject", "approve", "fail"] | None = None
    requested_at: datetime | None = None
    decided_at: datetime | None = None
    comment: str | None = None
    approver: str | None = None
    channel: DecisionChannel | None = Field(default=None, description="How the decision came in.")
    verified: bool = Field(
        default=False, description="True: approver is the verified identity of an HTTP token; false: claimed."
    )


class StepView(View):
    name: str
    specialist: str
    approve_before: bool
    approve_after: bool
    on_failure: Literal["fail", "continue"]
    max_visits: int = Field(default=3, description="How many task instances the step may have.")
    route_on: str | None = Field(default=None, description="The output field this step routes on.")
    routes: dict[str, str] | None = Field(
        default=None, description="Where each value of route_on sends the run: a step, end or fail."
    )
    on_exhausted: str | None = Field(
        default=None, description="What a route that would exceed a max_visits does instead."
    )
    after: list[str] | None = Field(
        default=None,
        description="The steps this one runs after (all settled first); none: the previous step.",
    )
    instruction: str | None = Field(
        default=None, description="The step's own instruction, added to its prompt."
    )


class ChainView(View):
    name: str
    steps: list[StepView]
    max_parallel: int = Field(
        default=4, description="How many ready steps the provider backend runs at once."
    )
    hash: str = Field(description="Hash of the chain snapshot the run runs on (its version).")
    version: int | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="The number of the chain's version the run is on (v3), where the store keeps them.",
    )
    label: str | None = Field(
        default=None, exclude_if=lambda v: v is None, description="That version's label in the configuration."
    )


class ContractView(View):
    worker_backend: Literal["inline", "provider"]
    provider: str | None = None
    model: str | None = None
    max_attempts: int


class ForkView(View):
    """A link to another run's task: the run this one was forked from, or its parent."""

    run_id: str
    task_id: str
    #: filled in by Services.view (server.views.children_view.with_gone_links)
    gone: Literal["pruned", "moved"] | None = Field(
        default=None, exclude_if=lambda v: v is None, description="The linked run was pruned or moved away."
    )


class BehindView(View):
    """The configuration has a newer version of the run's chain (server.views.chain_behind)."""

    current_version: str = Field(
        description="The configuration's version of the chain: v4, or its hash's start where none is kept."
    )
    upgrade: Literal["pinned", "manual", "at_boundary"] = Field(description="The chain's upgrade policy.")
    verdict: Literal["would_move", "blocked", "not_now", "pinned"]
    reason: str | None = Field(default=None, description="Why the run stays on its version.")


class ChildView(View):
    """A child run of a task of the run viewed."""

    run_id: str
    task_id: str = Field(description="The parent's task the child belongs to.")
    by: Literal["step", "host"] = Field(
        description="step: the task's step runs a chain; host: you started it."
    )
    chain: str | None = None
    status: str = Field(description="The child run's status.")
    waiting_for: str | None = Field(default=None, description="What the child waits for, if anything.")


class RunView(Outlined):
    """A run as the tools return it: its status, what the caller must do next, and its record."""

    # Published to hosts: what they read (five tools answer with a run view; every field named
    # costs tools/list bytes in each of them). The answer holds all the fields below.
    # The compact answer (server.views.compact) has these always; the rest only when set.
    published = ("run_id", "status", "status_kind", "next_action", "tasks")
    bare = True

    run_id: str
    status: RunStatus
    status_kind: Literal["active", "paused", "terminal"]
    next_action: NextAction = Field(
        description="Send arguments to tool; kind run_host_task, approve, wait or none."
    )
    more_actions: list[RunHostTask | Approve] = Field(
        default_factory=list, description="Others waiting too (parallel steps)."
    )
    #: set by a reader that read the run's lease (server.views.attendance: the CLI, the page)
    unattended: Unattended | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="Nobody drives the run: since when, and the command that continues it.",
    )
    #: set by a reader that knows the configuration (server.views.chain_behind) when the run's chain
    #: has a newer version there
    behind: BehindView | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="The chain has a newer version: what moving the run would do (orchestrate_upgrade).",
    )
    #: set by orchestrate_start (``model_copy``) when the start did not create the run
    existing_run: bool = Field(
        default=False,
        exclude_if=lambda v: not v,
        description="true: this start found the run an identical start made within the retry window "
        "(or with the same idempotency_key); pass new_run: true for another.",
    )
    #: set by server.views.compact.content_for for a caller who may not read the run's content
    withheld: bool = Field(
        default=False,
        exclude_if=lambda v: not v,
        description="true: the run's request, outputs and prompts are left out (reading them needs the "
        "'read' role, or to have started the run).",
    )
    chain: ChainView
    contract: ContractView
    request: str | None = Field(
        default=None, description="The whole request: only in a full view (run_status detail='full')."
    )
    request_preview: str = Field(description=f"The request's first {REQUEST_PREVIEW_CHARS} characters.")
    request_chars: int
    idempotency_key: str | None = None
    started_by: str | None = Field(default=None, description="The verified identity that started the run.")
    forked_from: ForkView | None = Field(
        default=None, exclude_if=lambda v: v is None, description="The run and task this run was forked from."
    )
    parent: ForkView | None = Field(
        default=None, exclude_if=lambda v: v is None, description="A child run's parent run and task."
    )
    tasks: list[TaskView] = Field(description="In run order; outputs as previews.")
    gates: list[GateView]
    routes: list[RouteView] = Field(default_factory=list, description="Routing facts, in order.")
    #: filled in by Services.view (server.views.children_view)
    children: list[ChildView] = Field(
        default_factory=list, description="Child runs of the run's tasks.", exclude_if=lambda v: not v
    )
    error: ErrorView | None = None
    totals: Totals
    budget: BudgetView | None = Field(default=None, description="What the run may spend and has spent.")
    warnings: list[str] = Field(default_factory=list)
    semantics: str = Field(description="Which backend produced which output, and what this server did.")
    version: int = Field(description="Number of durable writes made to the run.")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    detail: Detail = Field(
        default="compact",
        exclude=True,
        description="How the view was asked for: its answer is compact (server.views.compact) or whole.",
    )


# --------------------------------------------------------------------------------------------
# Building views


def _error(error: TypedError | None) -> ErrorView | None:
    return None if error is None else ErrorView.model_validate(error.model_dump())


@by_identity
def _attempt(attempt: AttemptRecord) -> AttemptView:
    """An attempt as views show it, once per attempt record (a record is immutable, and a task's
    unchanged attempts are the same objects from one head to the next; views are frozen)."""
    return AttemptView(
        number=attempt.number,
        executor=attempt.executor,
        outcome=attempt.outcome,
        error=_error(attempt.error),
        telemetry=TelemetryView.model_validate(attempt.telemetry.model_dump()),
        started_at=attempt.started_at,
        finished_at=attempt.finished_at,
        remote_run_id=attempt.remote_run_id,
        follows=attempt.follows,
        prompt_read=None if attempt.prompt_read is None else PromptReadView.of(attempt.prompt_read),
    )


def _task(
    head: RunHead,
    task: TaskState,
    output: str | None,
    whole: bool,
    value: dict[str, Any] | None = None,
    copied_from: int | None = None,
) -> TaskView:
    """``whole``: the view carries the whole output (and value); otherwise a preview of it, and the
    value when it is small (:data:`VALUE_INLINE_CHARS`)."""
    if value is not None and not whole and len(json.dumps(value, ensure_ascii=False)) > VALUE_INLINE_CHARS:
        value = None
    return TaskView(
        task_id=task.task_id,
        specialist=task.specialist,
        status=task.status,
        executor=task.executor,
        attempts=[_attempt(a) for a in task.attempts],
        output=output if whole else None,
        output_preview=output[:OUTPUT_PREVIEW_CHARS] if output is not None and not whole else None,
        output_chars=len(output) if output is not None else task.output_chars,
        output_sha256=task.output_sha256 if output is not None else None,
        output_uri=output_uri(head.run_id, task.task_id) if output is not None else None,
        step=task.step_name,
        visit=task.visit_number,
        sent_back_by=task.sent_back_by,
        revised_by=task.revised_by,
        waits_for=waits_for(head, task),
        value=value,
        error=_error(task.error),
        started_at=task.started_at,
        finished_at=task.finished_at,
        totals=_sum_attempts([task]),
        copied_from=copied_from,
    )


def gate_decisions(head: RunHead, gate: GateState) -> list[Literal["approve", "reject", "revise"]]:
    """The decisions ``gate`` takes now: none unless it is requested; revise only when the gate
    has a step to re-run and its bound allows it (:func:`~orchestration.core.routing.revise_offered`)."""
    if gate.status != "requested" or head.status.is_terminal:
        return []
    if gate.position == "question" and parked_question(head.task(gate.task_id)) != gate.gate_id:
        return []  # moot: its task ended meanwhile
    return ["approve", "reject", "revise"] if revise_offered(head, gate) else ["approve", "reject"]


def _gate(gate: GateState, snapshot: RunSnapshot) -> GateView:
    head = snapshot.head
    step = head.step_of(gate.task_id)
    description = loop_history(snapshot, gate) if gate.position == "exhausted" else None
    if gate.position == "question":
        # What the page and every reader of the view shows: the question, and how it is answered.
        description = (
            f"Agent {gate.agent} (step {step.name!r}) asks:\n{gate.note}\n\nApprove with your answer "
            "as the comment (sent to the agent); reject to decline (the step fails)."
        )
    return GateView.model_validate(
        gate.model_dump(exclude={"attempt", "number", "asked_id", "context_id"})
        | {
            "description": description,
            "decisions": gate_decisions(head, gate),
            "approvers": None if (allowed := gate_approvers(head, gate)) is None else list(allowed),
            "on_expiry": step.on_expiry if step.expires_after_seconds is not None else None,
        }
    )


@by_identity
def _steps(chain: ChainSnapshot) -> tuple[StepView, ...]:
    """A chain's steps as views show them, once per chain snapshot (the same object in every
    head of a run)."""
    return tuple(_step(s) for s in chain.steps)


@by_identity
def _contract(contract: ExecutionContract) -> ContractView:
    """A run's contract as views show it (its costs apart), once per contract object."""
    return ContractView.model_validate(contract.model_dump(exclude={"costs"}))


def _step(step: ChainStep) -> StepView:
    return StepView(
        name=step.name,
        specialist=step.specialist,
        approve_before=step.approve_before,
        approve_after=step.approve_after,
        on_failure=step.on_failure,
        max_visits=step.max_visits,
        route_on=step.route_on,
        routes=step.routes,
        on_exhausted=step.on_exhausted if step.route_on is not None else None,
        after=None if step.after is None else list(step.after),
        instruction=step.instruction,
    )


def totals(head: RunHead) -> Totals:
    return _sum_attempts(head.tasks)


def _sum_attempts(tasks: Sequence[TaskState]) -> Totals:
    input_tokens = output_tokens = attempts = 0
    latency = cost = 0.0
    for task in tasks:
        for attempt in task.attempts:
            attempts += 1
            input_tokens += attempt.telemetry.input_tokens or 0
            output_tokens += attempt.telemetry.output_tokens or 0
            latency += attempt.telemetry.latency_ms or 0.0
            cost += attempt.telemetry.cost_usd or 0.0
    return Totals(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=cost,
        latency_ms=latency,
        attempts=attempts,
    )


def semantics(head: RunHead) -> str:
    """One sentence per executor that produced something, saying who did the work."""
    executors = sorted({t.executor for t in head.tasks if t.executor is not None})
    if not executors:
        executors = ["inline:host"] if head.contract.worker_backend == "inline" else []
    parts: list[str] = []
    for executor in executors:
        if executor == "inline:host":
            parts.append(
                "Outputs of tasks run by inline:host were produced by the host's own model and recorded "
                "verbatim; this server called no model for them."
            )
        elif executor.startswith("provider:"):
            parts.append(
                f"Outputs of tasks run by {executor} were produced by this server calling that provider's "
                "model over HTTP and recorded verbatim."
            )
        elif executor.startswith("agent:"):
            parts.append(
                f"Outputs of tasks run by {executor} (agent:<name>:<tool>) were produced by that MCP agent, "
                "which this server called, and recorded verbatim."
            )
        else:
            parts.append(f"Outputs of tasks run by {executor} were recorded verbatim.")
    if not parts:
        parts.append("Tasks of this run are executed by this server through its provider backend.")
    return " ".join(parts)


def check_task_id(head: RunHead, task_id: str) -> TaskState:
    """The run's task ``task_id``; an id the run does not have is an ``InvalidArgument``."""
    for task in head.tasks:
        if task.task_id == task_id:
            return task
    raise InvalidArgument(
        f"run {head.run_id} has no task {task_id[:100]!r}; its tasks are "
        + ", ".join(t.task_id for t in head.tasks)
    )


def run_view(snapshot: RunSnapshot, detail: Detail = "compact", full_task: str | None = None) -> RunView:
    """The run as the tools show it.

    ``detail="compact"`` (the default) shows each finished task's output and the request as
    previews (an output's start, length, sha256 and resource URI); ``"full"`` shows them whole.
    ``full_task`` shows that one task's whole output whatever ``detail`` says; a task id the run
    does not have is an :class:`~orchestration.errors.InvalidArgument`.
    """
    head = snapshot.head
    if full_task is not None:
        check_task_id(head, full_task)
    waiting = waiting_items(snapshot)
    action = next_step(snapshot, waiting)
    return RunView(
        run_id=head.run_id,
        status=head.status,
        status_kind=status_kind_of(head.status),
        next_action=action,
        more_actions=[i for i in waiting if i is not action],
        chain=ChainView(
            name=head.chain.name,
            steps=list(_steps(head.chain)),
            hash=head.chain_hash,
            max_parallel=head.chain.max_parallel,
        ),
        contract=_contract(head.contract),
        request=head.request if detail == "full" else None,
        request_preview=request_preview(head.request),
        request_chars=len(head.request),
        idempotency_key=shown_key(head.idempotency_key, head.started_by),
        started_by=head.started_by,
        forked_from=None if snapshot.forked_from is None else ForkView(**snapshot.forked_from.model_dump()),
        parent=None
        if head.parent is None
        else ForkView(run_id=head.parent.run_id, task_id=head.parent.task_id),
        tasks=[
            _task(
                head,
                t,
                snapshot.outputs.get(t.task_id),
                detail == "full" or t.task_id == full_task,
                snapshot.values.get(t.task_id),
                snapshot.copied.get(t.task_id),
            )
            for t in head.tasks
        ],
        gates=[_gate(g, snapshot) for g in head.gates],
        routes=[route_view(r) for r in snapshot.routes],
        error=_error(head.error),
        totals=totals(head),
        budget=budget_view(head),
        warnings=list(snapshot.warnings),
        semantics=semantics(head),
        version=head.version,
        created_at=head.created_at,
        updated_at=head.updated_at,
        finished_at=head.finished_at,
        detail=detail,
    )


def status_kind_of(status: RunStatus) -> Literal["active", "paused", "terminal"]:
    kind = status.kind
    if kind == "active":
        return "active"
    if kind == "paused":
        return "paused"
    return "terminal"


def request_preview(request: str) -> str:
    """The request's start (at most :data:`REQUEST_PREVIEW_CHARS` characters, '…' marking a cut)."""
    request = request.strip()
    return request if len(request) <= REQUEST_PREVIEW_CHARS else request[: REQUEST_PREVIEW_CHARS - 1] + "…"

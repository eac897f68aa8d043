"""The MCP tools (``orchestrate_start``, ``orchestrate_resume``, ``task_prompt``,
``orchestrate_approve``, ``run_status``, ``orchestrate_cancel``, ``runs_list``, ``run_events``), each a
use case of the runtime answered with a view; published by :mod:`server.mcp.publishing`, described
for hosts in docs/tools.md. Each works inside :func:`~server.mcp.answering.answer`, so an error the
caller can fix is an ``isError`` result starting with its stable code.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated, Literal

from mcp.types import CallToolResult, InputRequiredResult
from pydantic import Field

from orchestration.core import (
    AGENT_APPROVER,
    Budget,
    BudgetLimits,
    Delegation,
    HostUsage,
    Limits,
    RetryWindow,
    RunHead,
    RunStatus,
    StartRequest,
    delegation_from_meta,
)
from orchestration.engine import is_settled
from orchestration.errors import Forbidden, InvalidArgument, InvalidState, quoted
from orchestration.store import RunPage
from orchestration.tracing import current_traceparent
from server.identity import Caller, start_identity
from server.mcp.answering import (
    DEFAULT_WAIT_SECONDS,
    MAX_WAIT_SECONDS,
    Progress,
    ToolContext,
    answer,
    answer_or_ask,
    caller_for,
    services_of,
    settle_asking,
    with_progress,
)
from server.mcp.budget_argument import BudgetArgument
from server.views.events import MAX_EVENTS_LIMIT, EventsPage, read_events
from server.views.fitted_pages import fitted_events, fitted_runs
from server.views.listing import RunsPage
from server.views.parts import PromptPart, prompt_part
from server.views.record_parts import RecordPart, StatusAnswer, check_record_arguments, record_answer
from server.views.run_view import Detail, RunView, check_task_id

log = logging.getLogger("construct.tools")

#: The bounds the input schemas publish; the runtime enforces the same ones (request and output
#: limits are configurable: :func:`~server.mcp.publishing.build_tools` publishes the configured ones).
LIMITS = Limits()

RunId = Annotated[str, Field(max_length=80)]
Name = Annotated[str, Field(max_length=LIMITS.max_name_chars)]
WaitSeconds = Annotated[
    float,
    Field(
        ge=0,
        le=MAX_WAIT_SECONDS,
        allow_inf_nan=False,
        description="Seconds to wait for the run to need you.",
    ),
]


# -- the tools -----------------------------------------------------------------------------------


# orchestrate_start's parameters (each schema is what hosts see in the tool's inputSchema)

StartText = Annotated[str, Field(description="The task and its context, in the user's words.")]
StartChain = Annotated[
    Annotated[str, Field(min_length=1, max_length=LIMITS.max_name_chars)]
    | Annotated[list[Name], Field(min_length=1, max_length=LIMITS.max_list_items)]
    | None,
    Field(description="A chain name (default: architect, engineer, reviewer) or specialists in order."),
]
ApproveBefore = Annotated[
    list[Name] | None,
    Field(
        max_length=LIMITS.max_list_items,
        description="Steps to pause before for approval.",
    ),
]
IdempotencyKey = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=LIMITS.max_idempotency_key_chars,
        description="Same key and request: same run.",
    ),
]
NewRun = Annotated[
    bool | None,
    Field(description="true: a new run even after an identical start."),
]
WorkerBackend = Annotated[
    Literal["inline", "provider"] | None,
    Field(description="'inline': you run the tasks; 'provider': the server calls a model."),
]
ProviderName = Annotated[
    Literal["anthropic", "openrouter", "openai"] | None, Field(description="Default: the server's.")
]
ModelName = Annotated[
    str | None, Field(max_length=LIMITS.max_name_chars, description="Default: the server's.")
]
RunTimeout = Annotated[
    float | None,
    Field(
        gt=0,
        allow_inf_nan=False,
        description="Seconds the run may take.",
    ),
]
TaskTimeout = Annotated[
    float | None,
    Field(
        gt=0,
        allow_inf_nan=False,
        description="Seconds each task may take.",
    ),
]
StartBudget = Annotated[
    BudgetArgument | None,
    Field(description="Hard limits, per run and per step; on_budget 'fail' (default) or 'ask'."),
]
ParentRunId = Annotated[
    RunId | None,
    Field(description="With parent_task_id: a child run of that host task."),
]
ParentTaskId = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=LIMITS.max_id_chars,
        description="parent_run_id's task awaiting your output.",
    ),
]


async def orchestrate_start(
    ctx: ToolContext,
    request: StartText,
    chain: StartChain = None,
    approve_before: ApproveBefore = None,
    idempotency_key: IdempotencyKey = None,
    new_run: NewRun = None,
    worker_backend: WorkerBackend = None,
    provider: ProviderName = None,
    model: ModelName = None,
    timeout_seconds: RunTimeout = None,
    task_timeout_seconds: TaskTimeout = None,
    budget: StartBudget = None,
    wait_seconds: WaitSeconds = DEFAULT_WAIT_SECONDS,
    parent_run_id: ParentRunId = None,
    parent_task_id: ParentTaskId = None,
) -> CallToolResult | InputRequiredResult:
    """Start a durable specialist chain; the answer's next_action is the next call (tool,
    arguments)."""

    async def work() -> RunView | InputRequiredResult:
        caller = await caller_for(ctx, "orchestrate_start")
        start = _start_request(
            caller,
            _retry_window(ctx, caller, idempotency_key, new_run),
            request=request,
            chain=chain,
            approve_before=approve_before,
            idempotency_key=idempotency_key,
            worker_backend=worker_backend,
            provider=provider,
            model=model,
            timeout_seconds=timeout_seconds,
            task_timeout_seconds=task_timeout_seconds,
            budget=None if budget is None else budget.to_budget(),
            delegation=delegation_from_meta(ctx.request_context.meta),
        )
        parent = _parent_task(parent_run_id, parent_task_id)
        head, created = await _started(ctx, caller, start, parent)
        keyed = idempotency_key is not None
        answered = await settle_asking(ctx, caller, head, wait_seconds, retry_safe=keyed)
        if not created and isinstance(answered, RunView):
            found = _found_earlier(head, idempotency_key, services_of(ctx).runtime.clock.now())
            answered = answered.model_copy(
                update={"existing_run": True, "warnings": [*answered.warnings, found]}
            )
        return answered

    return await answer_or_ask("orchestrate_start", work, services_of(ctx))


def _found_earlier(head: RunHead, idempotency_key: str | None, now: datetime) -> str:
    """What a start that found an earlier run says, in words a person and a model both notice:
    which run, how old, and how to start another."""
    age = max(0, round((now - head.created_at).total_seconds()))
    old = f"{age} s" if age < 120 else f"{age // 60} min"
    if idempotency_key is not None:
        return (
            f"existing_run: nothing new was started; run {head.run_id} was started {old} ago with this "
            "idempotency_key. Pass another idempotency_key to start another run"
        )
    return (
        f"existing_run: nothing new was started; run {head.run_id} was started {old} ago by an identical "
        "orchestrate_start (a repeat within the start retry window is taken for a retry). Call "
        "orchestrate_start again with new_run: true to start another run"
    )


def _retry_window(
    ctx: ToolContext, caller: Caller, idempotency_key: str | None, new_run: bool | None
) -> RetryWindow | None:
    """The retry window of a start without a key (``start_retry_window_seconds``; None when it is
    0): a retried start then returns the run the first one made, durably (see
    :mod:`orchestration.engine.start_window`). An explicit key decides alone, ``new_run`` or not."""
    seconds = services_of(ctx).settings.start_retry_window_seconds
    if idempotency_key is not None or seconds <= 0:
        return None
    return RetryWindow(identity=start_identity(caller), seconds=seconds, new_run=bool(new_run))


def _start_request(
    caller: Caller,
    retry: RetryWindow | None,
    *,
    request: str,
    chain: str | list[str] | None,
    approve_before: list[str] | None,
    idempotency_key: str | None,
    worker_backend: Literal["inline", "provider"] | None,
    provider: Literal["anthropic", "openrouter", "openai"] | None,
    model: str | None,
    timeout_seconds: float | None,
    task_timeout_seconds: float | None,
    budget: Budget | None,
    delegation: Delegation | None,
) -> StartRequest:
    """What ``orchestrate_start``'s arguments ask the runtime for: the run is started by the
    caller's identity only when it is verified, joins the trace of this call, and is found again
    by a retry within ``retry`` (see :func:`_retry_window`)."""
    return StartRequest(
        request=request,
        chain=tuple(chain) if isinstance(chain, list) else chain,
        approve_before=tuple(approve_before or ()),
        idempotency_key=idempotency_key,
        worker_backend=worker_backend,
        provider=provider,
        model=model,
        timeout_seconds=timeout_seconds,
        task_timeout_seconds=task_timeout_seconds,
        started_by=caller.identity if caller.verified else None,
        # the caller's _meta traceparent, through the SDK's span of this call: the run's trace
        traceparent=current_traceparent(),
        budget=budget,
        retry=retry,
        # the agent delegation the call came through (_meta), refused if it loops or is too deep
        delegation=delegation,
    )


def _parent_task(parent_run_id: str | None, parent_task_id: str | None) -> tuple[str, str] | None:
    """The host task a child run is started for (run id, task id), or None for a top-level run;
    ``invalid_argument`` when only one of the two is given."""
    if parent_run_id is None or parent_task_id is None:
        if parent_run_id is not None or parent_task_id is not None:
            raise InvalidArgument("parent_run_id and parent_task_id go together: give both or neither")
        return None
    return parent_run_id, parent_task_id


async def _started(
    ctx: ToolContext, caller: Caller, start: StartRequest, parent: tuple[str, str] | None
) -> tuple[RunHead, bool]:
    """The run ``start`` made, or found (a known idempotency key, an identical start within the
    retry window: ``created`` False), as a child of the host task ``parent`` when given (which
    the caller must be allowed to see); a new run is handed to the dispatcher."""
    services = services_of(ctx)
    runtime = services.runtime
    if parent is not None:
        parent_run_id, parent_task_id = parent
        caller.check_run(await runtime.status(parent_run_id))
        head, created = await runtime.children.start_for_host(start, parent_run_id, parent_task_id)
    else:
        head, created = await runtime.start(start)
    # Keys are per identity (orchestration.core.inputs.stored_key), so a key finds only the
    # caller's own run; checked all the same, as every run a caller is shown.
    caller.check_run(head)
    if created and not is_settled(head, runtime.clock.now()):
        # An inline run starts with its first host task prepared (or its first gate requested)
        # in its first write: the dispatcher is needed only for work that runs elsewhere.
        services.dispatcher.wake(head.run_id)
    return head, created


# orchestrate_resume's parameters

AnsweredTask = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=LIMITS.max_id_chars,
        description="The task your output answers (next_action's); required with output.",
    ),
]
HostOutput = Annotated[
    str | None,
    Field(
        description="Your model's whole answer, verbatim (JSON if output_schema is set); omit to continue "
        "an interrupted run."
    ),
]
OutputUsage = Annotated[
    HostUsage | None,
    Field(description="With output: the tokens (and cost) it took."),
]
DetachChildren = Annotated[
    bool,
    Field(description="Complete it though its child runs are live."),
]


async def orchestrate_resume(
    ctx: ToolContext,
    run_id: RunId,
    task_id: AnsweredTask = None,
    output: HostOutput = None,
    usage: OutputUsage = None,
    wait_seconds: WaitSeconds = DEFAULT_WAIT_SECONDS,
    detach_children: DetachChildren = False,
) -> CallToolResult | InputRequiredResult:
    """Hand in a host task's output; without output, continue an interrupted run. A repeat records
    nothing twice."""

    async def work() -> RunView | InputRequiredResult:
        caller = await caller_for(ctx, "orchestrate_resume", run_id)
        services = services_of(ctx)
        runtime = services.runtime
        if output is None:
            if usage is not None:
                raise InvalidArgument("usage goes with output (the usage of producing it); pass both")
            if task_id is not None:
                raise InvalidArgument(
                    f"task_id {quoted(task_id)} was given without output; pass the task's output, or omit "
                    "both to continue an interrupted run"
                )
            head = await runtime.check_resumable(run_id)
            services.dispatcher.wake(head.run_id)
        elif task_id is None:
            raise await runtime.missing_task_id(run_id)
        else:
            # One write: the output and what follows from it (the next host task).
            head = await runtime.submit_host_output(
                run_id,
                task_id,
                output,
                usage,
                detach_children,
                by=caller.recorded,
                channel=caller.channel,
                verified=caller.verified,
            )
        # Retried with the same task_id and output, the call records nothing; without output, a
        # retry at the gate would be invalid_state.
        return await settle_asking(ctx, caller, head, wait_seconds, retry_safe=output is not None)

    return await answer_or_ask("orchestrate_resume", work, services_of(ctx))


async def task_prompt(
    ctx: ToolContext,
    run_id: RunId,
    task_id: Annotated[
        str,
        Field(min_length=1, max_length=LIMITS.max_id_chars, description="next_action's task_id."),
    ],
    offset: Annotated[int, Field(ge=0, description="next_action's offset: where the part starts.")] = 0,
) -> CallToolResult:
    """Read a long host task prompt in parts (next_action read_prompt); each answer names the next
    call."""

    async def work() -> PromptPart:
        caller = await caller_for(ctx, "task_prompt", run_id)
        services = services_of(ctx)
        head = await services.runtime.status(run_id)
        if not caller.sees_content(head):
            raise Forbidden("reading a task's prompt needs the 'read' role, or to have started the run")
        snapshot = await services.snapshot_of(head)
        prompts = snapshot.host_tasks or ((snapshot.host_task,) if snapshot.host_task is not None else ())
        prompt = next((p for p in prompts if p.task_id == task_id), None)
        if prompt is None:
            raise InvalidState(
                f"task {quoted(task_id)} of run {head.run_id} is not awaiting the host's output (the run "
                f"is {head.status.value}); run_status shows what the run needs"
            )
        if offset > 0 and offset >= len(prompt.user):
            raise InvalidArgument(
                f"offset {offset} is past the prompt's end ({len(prompt.user)} characters); start at 0"
            )
        schema = head.step_of(task_id).output_schema
        part = prompt_part(head.run_id, prompt, offset, services.settings.max_answer_chars, schema)
        services.memory.prompt_reads.served(head.run_id, task_id, part.chars, part.offset, part.end)
        return part

    return await answer("task_prompt", work, services_of(ctx))


# orchestrate_approve's parameters

GateDecision = Annotated[
    Literal["approve", "reject", "revise"],
    Field(description="One of next_action's choices."),
]
DecidedGate = Annotated[
    str,
    Field(
        min_length=1,
        max_length=LIMITS.max_id_chars,
        description="next_action's gate_id.",
    ),
]
DecisionComment = Annotated[
    str | None,
    Field(
        max_length=LIMITS.max_comment_chars,
        description="Shown to the following steps (revise: what to change).",
    ),
]
Approver = Annotated[
    str | None,
    Field(
        max_length=LIMITS.max_approver_chars,
        description="Who decided (omit with a token); 'agent': you, where next_action says so.",
    ),
]
BudgetRaise = Annotated[
    BudgetLimits | None,
    Field(description="Approving a budget gate: what to add (default: the budget)."),
]


async def orchestrate_approve(
    ctx: ToolContext,
    run_id: RunId,
    decision: GateDecision,
    gate_id: DecidedGate,
    comment: DecisionComment = None,
    approver: Approver = None,
    budget_raise: BudgetRaise = None,
    wait_seconds: WaitSeconds = DEFAULT_WAIT_SECONDS,
) -> CallToolResult | InputRequiredResult:
    """Decide the gate a run waits at, as next_action says (a person's gate: ask the user). A
    repeat records nothing."""

    async def work() -> RunView | InputRequiredResult:
        caller = await caller_for(ctx, "orchestrate_approve", run_id)
        services = services_of(ctx)
        recorded = _recorded_approver(caller, approver)
        # One write: the decision and what follows from it.
        head = await services.runtime.approve(
            run_id,
            decision,
            gate_id,
            comment,
            recorded,
            channel=caller.channel,
            verified=caller.verified and recorded != AGENT_APPROVER,
            budget_raise=budget_raise,
        )
        return await settle_asking(ctx, caller, head, wait_seconds, retry_safe=True)

    return await answer_or_ask("orchestrate_approve", work, services_of(ctx))


def _recorded_approver(caller: Caller, approver: str | None) -> str | None:
    """Who a decision records as its approver: a verified caller's identity (a different
    ``approver`` would be a claim the server cannot back, so it is ``forbidden`` rather than
    recorded or silently replaced), else the ``approver`` argument, claimed. ``"agent"`` (the
    calling agent deciding a gate whose policy lets it) is recorded as it is, claimed, on every
    channel: no token identity may take that name (``server.settings``), so it names no person."""
    if not caller.verified or approver == AGENT_APPROVER:
        return approver
    if approver is not None and approver != caller.identity:
        raise Forbidden(
            f"approver {quoted(approver)} is not the identity of this connection's token, "
            f"{caller.identity!r}, which the record names; omit approver "
            f"(or pass {caller.identity!r})"
        )
    return caller.identity


async def run_status(
    ctx: ToolContext,
    run_id: RunId,
    wait_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=MAX_WAIT_SECONDS,
            allow_inf_nan=False,
            description="Seconds to wait for the run to need you.",
        ),
    ] = 0.0,
    detail: Annotated[
        Detail,
        Field(description="'full': the whole record and outputs."),
    ] = "compact",
    task_id: Annotated[
        str | None,
        Field(
            max_length=LIMITS.max_id_chars,
            description="A task whose whole output to show.",
        ),
    ] = None,
    offset: Annotated[int, Field(ge=0, description="read_more's offset.")] = 0,
    version: Annotated[int | None, Field(ge=0, description="read_more's version (pins the parts).")] = None,
) -> Annotated[CallToolResult, StatusAnswer] | InputRequiredResult:
    """A run's status, next_action, tasks and gates; detail='full' or task_id for whole outputs
    (in parts)."""

    services = services_of(ctx)

    async def work() -> RunView | RecordPart | InputRequiredResult:
        caller = await caller_for(ctx, "run_status", run_id)
        check_record_arguments(detail, task_id, offset, version)
        head = await services.runtime.status(run_id)
        if task_id is not None:
            check_task_id(head, task_id)  # before waiting: an unknown task is a mistake to report now
        answered = await settle_asking(
            ctx, caller, head, wait_seconds, retry_safe=True, detail=detail, full_task=task_id
        )
        if isinstance(answered, InputRequiredResult) or (detail != "full" and task_id is None):
            return answered
        bound = services.settings.max_answer_chars
        return record_answer(answered, task_id, offset, version, bound, services.records, services.answer_of)

    return await answer_or_ask("run_status", work, services)


async def orchestrate_cancel(
    ctx: ToolContext,
    run_id: RunId,
    reason: Annotated[
        str | None,
        Field(max_length=LIMITS.max_comment_chars, description="Why, for the record."),
    ] = None,
) -> CallToolResult:
    """Cancel a run that has not ended; it never continues. A repeat changes nothing."""

    async def work() -> RunView:
        caller = await caller_for(ctx, "orchestrate_cancel", run_id)
        services = services_of(ctx)
        head = await services.runtime.cancel(
            run_id, reason=reason, by=caller.recorded, channel=caller.channel, verified=caller.verified
        )
        return await services.view(head.run_id, head, caller=caller)

    return await answer("orchestrate_cancel", work, services_of(ctx))


async def runs_list(
    ctx: ToolContext,
    status: Annotated[
        list[RunStatus] | None,
        Field(
            max_length=len(RunStatus),
            description="Only runs in these statuses.",
        ),
    ] = None,
    limit: Annotated[int, Field(ge=1, le=500)] = 20,
    cursor: Annotated[
        str | None,
        # Bounded in the published schema (_strict_schema); a longer one is forged: the runtime
        # refuses it as invalid_argument, like any other forged cursor, not as too_large.
        Field(description="The previous page's next_cursor."),
    ] = None,
) -> Annotated[CallToolResult, RunsPage]:
    """List runs, newest first, with what each waits for; page with next_cursor."""

    async def work() -> RunsPage:
        caller = await caller_for(ctx, "runs_list")
        services = services_of(ctx)
        statuses = frozenset(status) if status else None

        async def read(count: int) -> RunPage:
            return await services.runtime.list_runs(statuses, count, cursor)

        # Filtered page by page for an identity limited to its own runs: a page may then hold fewer
        # than limit runs (next_cursor still says whether more follow); fewer too where limit runs
        # would make the answer longer than max_answer_chars.
        return await fitted_runs(
            read,
            caller.may_see if caller.own_runs_only else lambda _: True,
            limit,
            services.settings.max_answer_chars,
            {"status": [s.value for s in status]} if status else {},
        )

    return await answer("runs_list", work)


async def run_events(
    ctx: ToolContext,
    run_id: RunId,
    after_seq: Annotated[int, Field(ge=0, description="Events after this seq.")] = 0,
    limit: Annotated[int, Field(ge=1, le=MAX_EVENTS_LIMIT)] = 50,
    wait_seconds: Annotated[
        float,
        Field(
            ge=0, le=MAX_WAIT_SECONDS, allow_inf_nan=False, description="With no event yet, wait this long."
        ),
    ] = 0.0,
    output_after: Annotated[int, Field(ge=0, description="Text cursor.")] = 0,
) -> Annotated[CallToolResult, EventsPage]:
    """A run's events after after_seq; continue with next_after_seq (wait_seconds long-polls)."""

    async def work() -> EventsPage:
        await caller_for(ctx, "run_events", run_id)
        runtime = services_of(ctx).runtime

        async def page(_: Progress | None = None) -> EventsPage:
            return await read_events(
                runtime, run_id, after_seq, limit, wait_seconds, output_after=output_after
            )

        if wait_seconds <= 0:
            read = await page()
        else:
            # A long poll: progress ticks while it waits (the run's head as the wait began).
            read = await with_progress(ctx, await runtime.status(run_id), page)
        return fitted_events(read, services_of(ctx).settings.max_answer_chars, limit, output_after)

    return await answer("run_events", work)

"""MCP Tasks (``io.modelcontextprotocol/tasks``, SEP-2663, read at ``b0f60ba5``) for task-aware
clients, on the MCP SDK's extension framework (``mcp.server.extension``); what a host sees is in
docs/hosts.md, MCP Tasks.

A task is a run (``taskId`` = the run id), and only where the client can carry it to its end: a run
it cannot finish (an inline run, a gate it has no form for) is never a task, and a task whose run
later needs such a thing is handed over, ``completed`` with the run's view. Every ``tasks/*``
request is checked like the tool it stands for (:data:`~server.mcp.answering.ROLE_OF`).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Final

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolRequestParams, CallToolResult, ElicitResult, TextContent
from mcp_types import RequestParams, SubscriptionsListenRequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from orchestration.core import AGENT_APPROVER, RunHead, RunStatus, TaskStatus, validate_run_id
from orchestration.errors import ConstructError, InvalidState, RunNotFound, StoreError
from server.identity import Caller, Role, caller_of
from server.mcp.elicit import RevisableGateForm, gate_request, may_decide, take_answer
from server.mcp.tool_hints import tool_error_text
from server.views.compact import answer_data, answer_text
from server.views.next_step import Approve, RunHostTask, Wait
from server.views.run_view import RunView

if TYPE_CHECKING:
    from server.mcp.services import Services

log = logging.getLogger("construct.tasks")

EXTENSION_ID: Final = "io.modelcontextprotocol/tasks"
#: The tools that answer a declaring client with a task.
TASK_TOOLS: Final = frozenset({"orchestrate_start"})
#: Suggested polling interval while the server works on the run, and while it waits for someone.
POLL_WORKING_MS: Final = 2000
POLL_WAITING_MS: Final = 5000
#: The JSON-RPC error code of a failed task (a run that failed or was rejected): in the range
#: JSON-RPC leaves to implementations; ``data.reason`` says which.
RUN_ENDED_ERROR: Final = -32000
#: SEP-2663: a client that does not declare the extension asked for a task method.
MISSING_CAPABILITY: Final = -32021
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
#: The prefix of a gate's key in ``inputRequests`` / ``inputResponses``. A gate id names one task
#: instance (a revisit is ``step~2``), so a key is never reused within a task, as SEP-2663 requires.
GATE_KEY: Final = "gate:"

#: The text and structured content of the tools' answer that is a view.
AnswerOf = Callable[[RunView], tuple[str, dict[str, Any]]]


class TaskParams(RequestParams):
    """``tasks/get`` and ``tasks/cancel``: ``{"taskId": ...}``."""

    task_id: str


class UpdateTaskParams(RequestParams):
    """``tasks/update``: ``{"taskId": ..., "inputResponses": {key: response}}``."""

    task_id: str
    input_responses: dict[str, Any] = {}


# ------------------------------------------------------------------------------------------------
# The mapping (pure)


def detailed_task(
    view: RunView,
    gate_requests: dict[str, dict[str, Any]] | None = None,
    *,
    created: bool = False,
    answer_of: AnswerOf | None = None,
) -> dict[str, Any]:
    """The task a run is, as ``tasks/get`` answers it (the table of docs/hosts.md, MCP Tasks).
    ``gate_requests``: the elicitation forms of the open gates the caller may answer, by key (none
    for a client that does not declare elicitation). ``created``: the seed ``CreateTaskResult``
    (``resultType: "task"``, neither ``result`` nor ``error``). ``answer_of``: how the tools answer
    with a view (see :func:`tool_result`)."""
    status = view.status
    task: dict[str, Any] = {
        "taskId": view.run_id,
        "status": "working",
        "createdAt": view.created_at.isoformat(),
        "lastUpdatedAt": view.updated_at.isoformat(),
        "ttlMs": None,
        "pollIntervalMs": POLL_WORKING_MS,
    }
    if created:
        task["resultType"] = "task"
    actions = [view.next_action, *view.more_actions]
    forms = dict(gate_requests or {})
    if status in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_AGENT):
        task["statusMessage"] = _working_message(view)
    elif status == RunStatus.AWAITING_CHILDREN and not _waits_for_someone(actions):
        task["statusMessage"] = f"run {view.run_id} waits for its child runs: " + ", ".join(
            f"{c.run_id} ({c.status})" for c in view.children
        )
    elif status in (RunStatus.AWAITING_APPROVAL, RunStatus.AWAITING_HOST, RunStatus.AWAITING_CHILDREN):
        # awaiting_children here: a child run waits for a host task or a gate (the view's actions
        # name the child's run_id; a child's gate is answered on the child, not by tasks/update)
        task.update(_waiting(view, actions, forms, None if created else answer_of or _whole))
    elif status in (RunStatus.COMPLETED, RunStatus.COMPLETED_WITH_FAILURES):
        task.update(status="completed", statusMessage=_completed_message(view))
        if not created:
            task["result"] = tool_result(view, answer_of)
    elif status in (RunStatus.FAILED, RunStatus.REJECTED):
        reason, message = _failure(view)
        task.update(status="failed", statusMessage=f"run {view.run_id} {status.value}: {reason}: {message}")
        if not created:
            task["error"] = {
                "code": RUN_ENDED_ERROR,
                "message": f"{reason}: {message}",
                "data": {"reason": reason, "run_id": view.run_id, "status": status.value},
            }
    else:  # cancelled: the only status left (the unit tests go through every one)
        assert status == RunStatus.CANCELLED, status
        task.update(status="cancelled", statusMessage=_cancelled_message(view))
    return task


def _waiting(
    view: RunView, actions: Sequence[object], forms: dict[str, dict[str, Any]], answer_of: AnswerOf | None
) -> dict[str, Any]:
    """The fields of a task whose run waits for someone: ``input_required`` with the forms, or
    handed over (``completed``, its result the view as ``answer_of`` answers it; none in a seed,
    when ``answer_of`` is None)."""
    message = _waiting_message(view, actions, forms)
    if not hands_over(view, forms):
        return {
            "status": "input_required",
            "pollIntervalMs": POLL_WAITING_MS,
            "statusMessage": message,
            "inputRequests": forms,
        }
    fields: dict[str, Any] = {"status": "completed", "statusMessage": f"{HANDED_OVER}{message}"}
    if answer_of is not None:
        fields["result"] = tool_result(view, answer_of)
    return fields


def _whole(view: RunView) -> tuple[str, dict[str, Any]]:
    """The compact view whole, as text and structured content (no prompt handed out in parts)."""
    data = answer_data(view)
    return answer_text(data), data


def hands_over(view: RunView, gate_requests: dict[str, dict[str, Any]]) -> bool:
    """Whether the run waits for what a task-aware client cannot give through ``tasks/update``:
    a host task (the host's model runs it), or gates none of whose forms ``gate_requests`` holds
    (the client does not declare elicitation, may not decide them, or they are a child's). Such a
    run is no task at its start, and a task that comes to it is ``completed`` with the run's view."""
    if view.status not in (RunStatus.AWAITING_APPROVAL, RunStatus.AWAITING_HOST, RunStatus.AWAITING_CHILDREN):
        return False
    actions = [view.next_action, *view.more_actions]
    if any(isinstance(a, RunHostTask) for a in actions) or view.status == RunStatus.AWAITING_HOST:
        return True
    if view.status == RunStatus.AWAITING_CHILDREN and not _waits_for_someone(actions):
        return False  # the children are at work
    return not gate_requests


def _waits_for_someone(actions: Sequence[object]) -> bool:
    return any(isinstance(a, RunHostTask | Approve) for a in actions)


def tool_result(view: RunView, answer_of: AnswerOf | None = None) -> dict[str, Any]:
    """The ``CallToolResult`` the tools answer with for ``view``: ``answer_of`` gives its text and
    structured content (the server's :meth:`~server.mcp.services.Services.answer_of`, which hands
    long prompts out in parts as every tool answer does); without it, the compact view whole."""
    text, data = (answer_of or _whole)(view)
    result = CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def _working_message(view: RunView) -> str:
    running = [t.task_id for t in view.tasks if t.status == TaskStatus.RUNNING]
    if running:
        return f"run {view.run_id} is {view.status.value}: task {', '.join(running)} in progress"
    action = view.next_action
    if isinstance(action, Wait) and action.not_before is not None:
        until = action.not_before.isoformat()
        return f"run {view.run_id} is {view.status.value}: the next attempt waits until {until}"
    return f"run {view.run_id} is {view.status.value}: the server is working on it"


def _waiting_message(view: RunView, actions: Sequence[object], asked: dict[str, dict[str, Any]]) -> str:
    parts: list[str] = []
    for action in actions:
        # An action's arguments name its run: a child run's task or gate names the child.
        if isinstance(action, RunHostTask):
            parts.append(
                f"host task {action.task_id!r} ({action.specialist}) waits for your model: run its prompts "
                f"(the result's next_action or more_actions has them), then call {action.tool} with "
                f"{json.dumps(action.arguments)} plus output (your model's answer)"
            )
        elif isinstance(action, Approve):
            key = GATE_KEY + action.gate_id
            call = (
                f"{action.tool} with {json.dumps(action.arguments)} (decision: {' or '.join(action.choices)})"
            )
            if key in asked and action.run_id is None:
                how = f"answer inputRequests[{key!r}] with tasks/update, or call {call}"
            elif action.arguments.get("approver") == AGENT_APPROVER:  # the agent's own to decide
                how = f"you may decide it yourself: call {call}"
            else:  # this caller may not decide it (see server.mcp.elicit.may_decide)
                how = f"someone who may decide it calls {call}"
            parts.append(f"gate {action.gate_id!r} waits for a decision: {how}")
    return f"run {view.run_id} is {view.status.value}; " + "; ".join(parts)


def _completed_message(view: RunView) -> str:
    failed = [t for t in view.tasks if t.status == TaskStatus.FAILED]
    if not failed:
        return f"run {view.run_id} completed"
    listed = ", ".join(f"{t.task_id} ({t.error.code if t.error else 'failed'})" for t in failed)
    return f"run {view.run_id} completed with failures: {listed}"


def _failure(view: RunView) -> tuple[str, str]:
    """The typed reason a failed or rejected run ended, and a sentence."""
    if view.status == RunStatus.REJECTED:
        gate = next((g for g in view.gates if g.status == "rejected"), None)
        if gate is None:
            return "rejected", f"run {view.run_id} was rejected"
        by = f" by {gate.approver}" if gate.approver else ""
        note = f": {gate.comment}" if gate.comment else ""
        return "rejected", f"gate {gate.gate_id} was rejected{by}{note}"
    if view.error is not None:
        return view.error.code, view.error.message
    return "failed", f"run {view.run_id} failed"


def _cancelled_message(view: RunView) -> str:
    return f"run {view.run_id} was cancelled"


# ------------------------------------------------------------------------------------------------
# The extension


RequestContext = ServerRequestContext["Services", Any]


def declares_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """The request is a 2026-07-28 one that declares the extension in its capabilities."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities is not None else None
    return bool(extensions) and EXTENSION_ID in (extensions or {})


#: how a handed-over task's status message begins
HANDED_OVER: Final = "handed over: "

#: how many handed-over tasks a process remembers (the oldest goes first)
HANDED_OVER_KEPT: Final = 4096


class TasksExtension(Extension):
    """``tasks/get``, ``tasks/update``, ``tasks/cancel``, and ``orchestrate_start`` answered with a
    task for a declaring client (see the module docstring).

    A terminal status is final: a task handed over (``completed`` with the run's view, whose
    ``next_action`` the client's model then carries out) is answered the same way by later
    ``tasks/get`` calls of the same caller, while the run goes on (``run_status`` follows it). This
    process remembers the handed-over answers; another process (or this one after a restart)
    answers with the run as it is then."""

    identifier = EXTENSION_ID

    def __init__(self) -> None:
        super().__init__()
        self._handed_over: OrderedDict[tuple[str, str | None], dict[str, Any]] = OrderedDict()

    def methods(self) -> Sequence[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return (
            MethodBinding("tasks/get", TaskParams, self._get, protocol_versions=modern),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, protocol_versions=modern),
            MethodBinding("tasks/cancel", TaskParams, self._cancel, protocol_versions=modern),
        )

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if params.name not in TASK_TOOLS or not declares_tasks(ctx):
            return await call_next(ctx)
        services: Services = ctx.lifespan_context
        if _host_runs_it(params.arguments or {}, services.settings.worker_backend):
            return await call_next(ctx)  # the host's model does its tasks: the plain call, untouched
        # Answer as soon as the run is stored: the handler is invoked with these very params.
        params.arguments = {**(params.arguments or {}), "wait_seconds": 0}
        result = await call_next(ctx)
        if not isinstance(result, CallToolResult) or result.is_error or not result.structured_content:
            return result  # refused: the usual isError answer
        # The answer is compact (server.views.compact): the task is built from the run's view.
        caller = caller_of(ctx.request)
        run_id = str(result.structured_content["run_id"])
        head = await services.runtime.status(run_id)
        view = await services.view(run_id, head, caller=caller)
        forms = await _gate_forms(ctx, services, caller, view, head)
        # What the start's own answer shows: the run as its first write left it (the dispatcher
        # may have moved it on since; a run that was at work then is a task all the same).
        waits_at_start = result.structured_content.get("status") in _WAITING
        if view.contract.worker_backend == "inline" or (waits_at_start and hands_over(view, forms)):
            # An inline run found by its key, or one that waits from its first write for what this
            # client cannot give: no task. The run is settled there, so this is the plain answer.
            return result
        log.info("task created", extra={"action": "task_created", "run_id": view.run_id})
        return detailed_task(view, forms, created=True)

    async def _get(self, ctx: RequestContext, params: TaskParams) -> dict[str, Any]:
        services, caller, head = await _open(ctx, params.task_id, "read")
        key = (head.run_id, caller.identity)
        final = self._handed_over.get(key)
        if final is not None:
            return final
        view = await services.view(head.run_id, head, caller=caller)
        forms = await _gate_forms(ctx, services, caller, view, head)
        task = detailed_task(view, forms, answer_of=services.answer_of)
        if task["status"] == "completed" and str(task.get("statusMessage", "")).startswith(HANDED_OVER):
            self._handed_over[key] = task
            while len(self._handed_over) > HANDED_OVER_KEPT:
                self._handed_over.popitem(last=False)
        return task

    async def _update(self, ctx: RequestContext, params: UpdateTaskParams) -> dict[str, Any]:
        services, caller, head = await _open(ctx, params.task_id, "approve")
        open_gates = {g.gate_id for g in head.gates if g.status in ("pending", "requested")}
        notes: list[str] = []
        for key, raw in params.input_responses.items():
            gate_id = key.removeprefix(GATE_KEY)
            if not key.startswith(GATE_KEY) or gate_id not in open_gates:
                continue  # not an outstanding request: ignored, as the spec says
            response = _elicit_result(raw, key)
            head = await take_answer(services, head, gate_id, response, caller, notes)
        if notes:
            log.info(
                "tasks/update: %s",
                "; ".join(notes),
                extra={"action": "task_update_notes", "run_id": head.run_id},
            )
        services.dispatcher.wake(head.run_id)
        return {}

    async def _cancel(self, ctx: RequestContext, params: TaskParams) -> dict[str, Any]:
        services, caller, head = await _open(ctx, params.task_id, "operate")
        # A run that ended first stays as it is: cancellation is cooperative, the ack stands.
        with suppress(InvalidState):
            await services.runtime.cancel(
                head.run_id,
                reason="tasks/cancel",
                by=caller.recorded,
                channel=caller.channel,
                verified=caller.verified,
            )
        return {}


ListenHandler = Callable[[ServerRequestContext[Any, Any], SubscriptionsListenRequestParams], Awaitable[Any]]


def guard_task_notifications(listen: ListenHandler) -> ListenHandler:
    """``listen`` (the ``subscriptions/listen`` handler), refusing a stream that asks for task
    status notifications (``notifications.taskIds``) from a client that did not declare the
    extension, with ``-32021`` as SEP-2663 requires. A declaring client's stream is opened; this
    server pushes no ``notifications/tasks`` (the spec makes them optional), so its acknowledgement
    lists no task ids and the client polls ``tasks/get``."""

    async def handle(ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams) -> Any:
        if "taskIds" in (params.notifications.model_extra or {}) and not declares_tasks(ctx):
            raise _missing_capability()
        return await listen(ctx, params)

    return handle


#: The statuses in which a run waits for someone (a host task, a gate; a child's, for a parent).
_WAITING: Final = frozenset(
    {RunStatus.AWAITING_APPROVAL.value, RunStatus.AWAITING_HOST.value, RunStatus.AWAITING_CHILDREN.value}
)


def _host_runs_it(arguments: dict[str, Any], default_backend: str) -> bool:
    """Whether the start asks for a run whose tasks the host's model does: the ``inline`` backend,
    asked for, else the server's default (as the runtime resolves a run's contract; a child run
    the engine starts for a step shares its parent's, and is no start of its own)."""
    return (arguments.get("worker_backend") or default_backend) == "inline"


def declares_elicitation(ctx: ServerRequestContext[Any, Any]) -> bool:
    """The client declared form elicitation (a bare ``elicitation: {}`` counts, as in the SDK)."""
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and not (elicitation.form is None and elicitation.url is not None)


async def _gate_forms(
    ctx: ServerRequestContext[Any, Any], services: Services, caller: Caller, view: RunView, head: RunHead
) -> dict[str, dict[str, Any]]:
    """The elicitation forms, by ``inputRequests`` key, of the run's own open gates that ``caller``
    may decide; none for a client that does not declare elicitation (it could not fill them)."""
    if view.status != RunStatus.AWAITING_APPROVAL or not declares_elicitation(ctx):
        return {}
    snapshot = await services.runtime.snapshot(head.run_id, head)
    forms: dict[str, dict[str, Any]] = {}
    for action in (view.next_action, *view.more_actions):
        if (
            isinstance(action, Approve)
            and action.run_id is None
            and may_decide(snapshot.head, action.gate_id, caller)
        ):
            request = gate_request(snapshot, action.gate_id)
            forms[GATE_KEY + action.gate_id] = request.model_dump(
                mode="json", by_alias=True, exclude_none=True
            )
    return forms


def _missing_capability() -> MCPError:
    return MCPError(
        code=MISSING_CAPABILITY,
        message="Missing required client capability",
        data={"requiredCapabilities": {"extensions": {EXTENSION_ID: {}}}},
    )


def _elicit_result(raw: object, key: str) -> ElicitResult:
    """An answer to a gate form: an ``ElicitResult`` whose content, when accepted, fits the form."""
    try:
        response = ElicitResult.model_validate(raw, by_name=False)
        if response.action == "accept":
            RevisableGateForm.model_validate(response.content or {})
    except ValidationError:
        raise MCPError(
            code=INVALID_PARAMS,
            message=f"inputResponses[{key!r}] does not answer the gate form: an elicitation result "
            "with action accept and content {decision: approve|reject|revise, comment?}, or decline/cancel",
        ) from None
    return response


async def _open(ctx: RequestContext, task_id: str, role: Role) -> tuple[Services, Caller, RunHead]:
    """The services, the caller (checked for ``role``) and the run behind ``task_id``; the
    spec's JSON-RPC errors otherwise."""
    if not declares_tasks(ctx):
        raise _missing_capability()
    services: Services = ctx.lifespan_context
    caller = caller_of(ctx.request)
    try:
        caller.require(role, ctx.method)
        # Checked as a run id before it reaches the store. Run ids carry 64 random bits, so a task
        # id is as unguessable as SEP-2663 asks; the caller is checked all the same.
        head = await services.runtime.status(validate_run_id(task_id))
        if not caller.may_see(head):
            raise RunNotFound(head.run_id)  # another identity's run: as if it did not exist
    except RunNotFound:
        raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found") from None
    except ConstructError as exc:
        if exc.code == "invalid_argument":
            message = "Failed to retrieve task: Task not found (not a task id this server gives out)"
        else:
            message = tool_error_text(exc)
        code = INTERNAL_ERROR if isinstance(exc, StoreError) else INVALID_PARAMS
        raise MCPError(code=code, message=message, data={"code": exc.code}) from None
    return services, caller, head

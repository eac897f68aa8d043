"""Every chain as an A2A 1.0 agent, on the wire: the one module of the server that imports the A2A
SDK (``a2a-sdk``, the ``a2a`` extra). What the calls do to runs is :mod:`server.a2a.chain_agent`.

Served beside ``/mcp`` by ``serve --transport streamable-http``:

- ``GET /.well-known/agent-card.json``: the agent card (no token needed, as A2A clients fetch it
  first): one skill per chain, the JSON-RPC interface at ``/a2a``, streaming, and the bearer
  scheme when the server takes tokens.
- ``POST /a2a``: the JSON-RPC binding, behind the same tokens as ``/mcp`` (the caller's identity,
  roles and "own runs only" are the tools'): ``SendMessage``, ``SendStreamingMessage``,
  ``GetTask``, ``ListTasks``, ``CancelTask``, ``SubscribeToTask``, and the A2A 0.3 names of the
  same methods (``message/send``, ``message/stream``, ``tasks/get``, ...) for clients of that line.

A task's states: ``submitted`` (queued), ``working`` (running, or waiting for child runs or a
remote agent), ``input-required`` (a host task to run or a gate to decide: the status message
says what, as text and as a data part), ``completed`` (also with failed optional steps),
``failed``, ``canceled``, ``rejected`` (a gate's reject). A blocking ``SendMessage`` answers once
the run needs its caller or ended, or after ``[a2a] blocking_wait_seconds`` (600)
with the task still working. A stream sends the task, then each status change, each task's output
as its text grows (an artifact per task, appended) and whole once recorded; it ends when the task
needs its caller or ended. Push notifications (``CreateTaskPushNotificationConfig``, ``Get``,
``List``, ``Delete``, and ``configuration.taskPushNotificationConfig`` of ``SendMessage``) are
offered when a signing key is configured (:mod:`server.a2a.push_notifier`; the card says whether),
their key set at ``/.well-known/a2a-push-jwks.json`` (no token); the extended card is not (an
unsupported operation). A message to a task that has ended is an unsupported operation too, unless
it repeats a reply the task took; one whose ``contextId`` is not its task's is invalid params. The
``A2A-Version`` may come as a query parameter instead of the header. Errors: this server's codes,
as the message's prefix and in ``data.code`` (the error detail's metadata).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder, create_jsonrpc_routes
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    HTTPAuthSecurityScheme,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    A2AError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf import struct_pb2  # type: ignore[import-untyped]
from google.protobuf.json_format import MessageToDict, ParseDict  # type: ignore[import-untyped]
from mcp.server.transport_security import TransportSecurityMiddleware
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage

from orchestration.chains import Catalog
from orchestration.core import RunHead, RunStatus, whole_numbers
from orchestration.core import TaskStatus as RunTaskStatus
from orchestration.errors import ConstructError, InvalidArgument, InvalidState, RunNotFound
from server.a2a.chain_agent import (
    DECISIONS,
    ChainAgent,
    Reply,
    RunState,
    TaskEnded,
    context_of,
)
from server.a2a.push_keys import PushKeys
from server.a2a.push_notifier import Notice
from server.a2a.webhook_configs import WebhookConfig, WebhookConfigs
from server.identity import Caller, caller_of
from server.transports.http import security_settings

log = logging.getLogger("construct.a2a")

#: where the agent card is served (A2A 1.0's well-known path)
CARD_PATH = "/.well-known/agent-card.json"
#: the JSON-RPC endpoint
RPC_PATH = "/a2a"
#: the public key set that push notifications' signatures are checked with (no token needed)
PUSH_JWKS_PATH = "/.well-known/a2a-push-jwks.json"
#: the A2A protocol version served
PROTOCOL_VERSION = "1.0"
#: how long one wait of a stream lasts before it looks again (a stream lives as long as its task
#: works; each wait is bounded so that a stopping server ends it)
STREAM_WAIT_SECONDS = 15.0
#: how many runs one ListTasks page holds at most, and without a pageSize (A2A 1.0's bounds)
MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 50
_CALLER = "construct.caller"
#: whom a push notification's task is shown as: a reader of every run (a config's creator needed
#: what ``run_status`` needs, so it reads what its webhook receives)
_NOTIFIED = Caller(
    identity=None, roles=frozenset({"read"}), own_runs_only=False, channel="http", verified=False
)

STATES: dict[RunStatus, TaskState] = {
    RunStatus.QUEUED: TaskState.TASK_STATE_SUBMITTED,
    RunStatus.RUNNING: TaskState.TASK_STATE_WORKING,
    RunStatus.AWAITING_APPROVAL: TaskState.TASK_STATE_INPUT_REQUIRED,
    RunStatus.AWAITING_HOST: TaskState.TASK_STATE_INPUT_REQUIRED,
    RunStatus.AWAITING_CHILDREN: TaskState.TASK_STATE_WORKING,
    RunStatus.AWAITING_AGENT: TaskState.TASK_STATE_WORKING,
    RunStatus.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    RunStatus.COMPLETED_WITH_FAILURES: TaskState.TASK_STATE_COMPLETED,
    RunStatus.FAILED: TaskState.TASK_STATE_FAILED,
    RunStatus.CANCELLED: TaskState.TASK_STATE_CANCELED,
    RunStatus.REJECTED: TaskState.TASK_STATE_REJECTED,
}
_STATUSES_OF: dict[int, frozenset[RunStatus]] = {}
for _run_status, _task_state in STATES.items():
    _STATUSES_OF[_task_state] = _STATUSES_OF.get(_task_state, frozenset()) | {_run_status}

T = TypeVar("T")


def state_of(run: RunState) -> TaskState:
    """The A2A state of ``run``: a paused run is ``input-required`` only when it asks its caller
    something (a child run's host task or gate counts), else ``working``."""
    if run.questions:
        return TaskState.TASK_STATE_INPUT_REQUIRED
    state = STATES[run.status]
    return TaskState.TASK_STATE_WORKING if state == TaskState.TASK_STATE_INPUT_REQUIRED else state


def _struct(data: dict[str, Any]) -> struct_pb2.Struct:
    return ParseDict(data, struct_pb2.Struct())


def _data_part(data: Any) -> Part:
    return Part(data=ParseDict(data, struct_pb2.Value()), media_type="application/json")


def _status_message(run: RunState) -> Message | None:
    """What the status says in words (and, at ``input-required``, as data: the questions)."""
    head = run.head
    parts: list[Part] = []
    if run.questions:
        lines = []
        for q in run.questions:
            if q.kind == "gate":
                lines.append(f"Gate {q.gate_id} ({q.guards}): decide one of {', '.join(q.choices or {})}.")
            else:
                lines.append(
                    f"Host task {q.task_id} ({q.specialist}): run its prompt, reply with the output."
                )
        lines.append(run.questions[0].instruction)
        parts = [Part(text="\n".join(lines)), _data_part({"questions": [q.data() for q in run.questions]})]
    elif head.error is not None:
        parts = [Part(text=f"{head.error.code}: {head.error.message}")]
    elif head.status.is_terminal:
        parts = [Part(text=f"run {head.run_id} {head.status.value}")]
    if not parts:
        return None
    return Message(
        message_id=f"{head.run_id}/status/{head.version}",
        role=Role.ROLE_AGENT,
        task_id=head.run_id,
        context_id=run.context_id,
        parts=parts,
    )


def _timestamp(status: TaskStatus, at: datetime) -> TaskStatus:
    status.timestamp.FromDatetime(at)
    return status


def _status(run: RunState) -> TaskStatus:
    message = _status_message(run)
    status = (
        TaskStatus(state=state_of(run))
        if message is None
        else TaskStatus(state=state_of(run), message=message)
    )
    return _timestamp(status, run.head.updated_at)


def _artifacts(run: RunState) -> list[Artifact]:
    return [
        Artifact(artifact_id=o.task_id, name=o.task_id, description=o.specialist, parts=[Part(text=o.text)])
        for o in run.outputs
    ]


def task_of(run: RunState) -> Task:
    """``run`` as an A2A task."""
    return Task(
        id=run.run_id,
        context_id=run.context_id,
        status=_status(run),
        artifacts=_artifacts(run),
        metadata=_struct({"construct_status": run.status.value, "content": run.content}),
    )


async def push_notice(agent: ChainAgent, head: RunHead) -> Notice:
    """``head``'s task as a push notification carries it (a ``StreamResponse`` holding the task;
    :mod:`server.a2a.push_notifier`), and what a webhook is told again only when it changes: the
    A2A state and the questions asked."""
    run = await agent.state(_NOTIFIED, head)
    asked = ",".join(f"{q.run_id}/{q.gate_id or q.task_id}" for q in run.questions)
    body = json.dumps(MessageToDict(StreamResponse(task=task_of(run))), separators=(",", ":")).encode()
    return Notice(
        run_id=head.run_id,
        version=head.version,
        key=f"{TaskState.Name(state_of(run))}[{asked}]",
        body=body,
    )


def _webhook_config(task_id: str, config: TaskPushNotificationConfig) -> WebhookConfig:
    auth = config.authentication if config.HasField("authentication") else None
    return WebhookConfig(
        config_id=config.id,
        task_id=task_id,
        url=config.url,
        token=config.token or None,
        auth_scheme=(auth.scheme or None) if auth is not None else None,
        credentials=(auth.credentials or None) if auth is not None else None,
    )


def _push_config(config: WebhookConfig) -> TaskPushNotificationConfig:
    """A config as an answer shows it: no token, no credentials."""
    shown = TaskPushNotificationConfig(id=config.config_id, task_id=config.task_id, url=config.url)
    if config.auth_scheme:
        shown.authentication.scheme = config.auth_scheme
    return shown


def _a2a_error(exc: ConstructError) -> A2AError:
    """This server's error as the A2A error a client reads: its code first in the message and in
    ``data.code``."""
    message = f"{exc.code}: {exc}"
    data = {"code": exc.code}
    if isinstance(exc, RunNotFound):
        return TaskNotFoundError(message, data)
    if isinstance(exc, TaskEnded):
        return UnsupportedOperationError(message, data)
    if isinstance(exc, InvalidArgument):
        return InvalidParamsError(message, data)
    return InvalidRequestError(message, data)


async def _answered(call: Awaitable[T]) -> T:
    try:
        return await call
    except ConstructError as exc:
        raise _a2a_error(exc) from exc


def _caller(context: ServerCallContext) -> Caller:
    caller = context.state.get(_CALLER)
    if not isinstance(caller, Caller):  # pragma: no cover - the context builder always sets it
        raise InternalError("no caller")
    return caller


def _metadata(message: Message) -> dict[str, Any]:
    return whole_numbers(MessageToDict(message.metadata)) if message.HasField("metadata") else {}


def _reply(message: Message) -> Reply:
    """The reply a message that continues a task carries: ``metadata`` (or a data part) names the
    task or gate, the decision and the child run; the text parts are the output or comment."""
    named = _metadata(message)
    if not ({"task_id", "gate_id"} & named.keys()):
        for part in message.parts:
            if part.HasField("data"):
                value = MessageToDict(part.data)
                if isinstance(value, dict) and {"task_id", "gate_id"} & value.keys():
                    named = value
                    break
    text = "\n".join(p.text for p in message.parts if p.HasField("text"))
    if "output" in named and not text:
        text = named["output"] if isinstance(named["output"], str) else json.dumps(named["output"])
    if "comment" in named and not text and isinstance(named["comment"], str):
        text = named["comment"]
    decision = named.get("decision")
    if decision is not None and decision not in DECISIONS:
        raise InvalidArgument(f"decision must be one of {', '.join(sorted(DECISIONS))}, not {decision!r}")

    def ident(name: str) -> str | None:
        value = named.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"metadata.{name} must be a string")
        return value

    return Reply(
        task_id=ident("task_id"),
        gate_id=ident("gate_id"),
        decision=decision,
        text=text,
        run_id=ident("run_id"),
    )


class ChainHandler(RequestHandler):
    """The A2A methods, answered from the runs (:class:`~server.a2a.chain_agent.ChainAgent`)."""

    def __init__(self, agent: ChainAgent, configs: WebhookConfigs | None = None) -> None:
        self._agent = agent
        #: the push notification configs; None: push notifications are not offered
        self._configs = configs

    async def _sent(self, params: SendMessageRequest, caller: Caller) -> RunHead:
        """The run a message starts, or the run it continues once the reply is handed in; and the
        push notification config the message's configuration gives, set on it."""
        message = params.message
        pushed = params.configuration.HasField("task_push_notification_config")
        if pushed and self._configs is None:
            raise PushNotificationNotSupportedError()
        if pushed and self._configs is not None:  # refused before a run is started with it
            self._configs.check(_webhook_config("", params.configuration.task_push_notification_config))
        if message.task_id:
            head = await self._agent.answer(
                caller, message.task_id, _reply(message), message.context_id or None
            )
        else:
            named = _metadata(message)
            text = "\n".join(p.text for p in message.parts if p.HasField("text"))
            head = await self._agent.start(
                caller, text, named, message.context_id or None, message.message_id
            )
        if pushed and self._configs is not None:
            config = params.configuration.task_push_notification_config
            await self._configs.set(caller, _webhook_config(head.run_id, config))
        return head

    def _push(self) -> WebhookConfigs:
        if self._configs is None:
            raise PushNotificationNotSupportedError()
        return self._configs

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        caller = _caller(context)

        async def send() -> Task:
            head = await self._sent(params, caller)
            if not params.configuration.return_immediately:
                head = await self._agent.settled(head.run_id)
            return task_of(await self._agent.state(caller, head))

        return await _answered(send())

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        caller = _caller(context)
        head = await _answered(self._sent(params, caller))
        async for event in self._followed(caller, head):
            yield event

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        caller = _caller(context)
        head = await _answered(self._agent.head(caller, params.id))
        if head.status.is_terminal:
            raise UnsupportedOperationError(
                f"task {head.run_id} has ended ({head.status.value}); read it with GetTask"
            )
        async for event in self._followed(caller, head):
            yield event

    async def _followed(self, caller: Caller, head: RunHead) -> AsyncGenerator[Event]:
        """The task, then its changes, until it needs its caller or ends."""
        run = await _answered(self._agent.state(caller, head))
        yield task_of(run)
        shown_state, shown_outputs, position = state_of(run), {o.task_id for o in run.outputs}, 0
        written: set[str] = set()
        while run.status.is_terminal is False and not run.questions:
            seq = run.head.last_seq
            fresh, pieces = await _answered(
                self._agent.changed(run.run_id, seq, position, STREAM_WAIT_SECONDS)
            )
            if run.content:
                for piece in pieces:
                    position = max(position, piece.position)
                    yield TaskArtifactUpdateEvent(
                        task_id=run.run_id,
                        context_id=run.context_id,
                        artifact=Artifact(
                            artifact_id=piece.task_id, name=piece.task_id, parts=[Part(text=piece.text)]
                        ),
                        append=piece.task_id in written,
                    )
                    written.add(piece.task_id)
            if fresh.version == run.head.version:
                continue
            done = {t.task_id for t in fresh.tasks if t.status == RunTaskStatus.DONE} - shown_outputs
            run = await _answered(self._agent.state(caller, fresh, outputs_of=done))  # new ones only
            for output in run.outputs:
                if output.task_id not in shown_outputs:
                    shown_outputs.add(output.task_id)
                    yield TaskArtifactUpdateEvent(
                        task_id=run.run_id,
                        context_id=run.context_id,
                        artifact=Artifact(
                            artifact_id=output.task_id,
                            name=output.task_id,
                            description=output.specialist,
                            parts=[Part(text=output.text)],
                        ),
                        append=False,
                        last_chunk=True,
                    )
            state = state_of(run)
            if state != shown_state or run.questions or run.status.is_terminal:
                shown_state = state
                yield TaskStatusUpdateEvent(
                    task_id=run.run_id, context_id=run.context_id, status=_status(run)
                )

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        caller = _caller(context)

        async def get() -> Task:
            head = await self._agent.head(caller, params.id)
            return task_of(await self._agent.state(caller, head))

        return await _answered(get())

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        caller = _caller(context)
        if params.HasField("page_size") and not 1 <= params.page_size <= MAX_PAGE_SIZE:
            raise InvalidParamsError(f"pageSize must be 1 to {MAX_PAGE_SIZE}, not {params.page_size}")
        if params.HasField("history_length") and params.history_length < 0:
            raise InvalidParamsError(f"historyLength must not be negative, not {params.history_length}")
        size = params.page_size if params.HasField("page_size") else DEFAULT_PAGE_SIZE
        statuses = _STATUSES_OF.get(params.status) if params.status else None
        since = (
            params.status_timestamp_after.ToDatetime(tzinfo=UTC)
            if params.HasField("status_timestamp_after")
            else None
        )

        async def listed() -> ListTasksResponse:
            self._agent.allow(caller, "runs_list")
            runtime = self._agent.services().runtime
            page = await runtime.list_runs(statuses, size, params.page_token or None)
            tasks = []
            for head in page.runs:
                if not caller.may_read(head) or (since is not None and head.updated_at < since):
                    continue
                if params.context_id and context_of(head) != params.context_id:
                    continue
                # the outputs are read only for a listing that shows them
                outputs_of = None if params.include_artifacts else ()
                tasks.append(task_of(await self._agent.state(caller, head, outputs_of=outputs_of)))
            return ListTasksResponse(
                tasks=tasks, next_page_token=page.next_cursor or "", page_size=size, total_size=len(tasks)
            )

        return await _answered(listed())

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        caller = _caller(context)

        async def cancel() -> Task:
            try:
                head = await self._agent.cancel(caller, params.id)
            except InvalidState as exc:
                raise TaskNotCancelableError(f"{exc.code}: {exc}", {"code": exc.code}) from exc
            return task_of(await self._agent.state(caller, head))

        return await _answered(cancel())

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        configs, caller = self._push(), _caller(context)
        set_ = configs.set(caller, _webhook_config(params.task_id, params))
        return _push_config(await _answered(set_))

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        configs, caller = self._push(), _caller(context)
        return _push_config(await _answered(configs.get(caller, params.task_id, params.id)))

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        configs, caller = self._push(), _caller(context)
        listed = await _answered(configs.listed(caller, params.task_id))
        return ListTaskPushNotificationConfigsResponse(configs=[_push_config(c) for c in listed])

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        configs, caller = self._push(), _caller(context)
        await _answered(configs.delete(caller, params.task_id, params.id))

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        # the card does not declare capabilities.extendedAgentCard: the operation is unsupported
        # (ExtendedAgentCardNotConfigured is for an agent that declares it and has none)
        raise UnsupportedOperationError("this agent has no extended agent card (see its card's capabilities)")


class _CallerContext(DefaultServerCallContextBuilder):
    """The SDK's call context (the headers its version check reads), with the caller the
    bearer-token middleware verified (or the unauthenticated loopback one)."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[_CALLER] = caller_of(request)
        return context


def agent_card(
    catalog: Catalog, base_url: str, version: str, bearer: bool, *, push: bool = False
) -> AgentCard:
    """The agent card: one skill per chain, the JSON-RPC interface at ``base_url`` + ``/a2a``."""
    skills = [
        AgentSkill(
            id=name,
            name=name,
            description=f"{chain.description} (steps: {' -> '.join(step.name for step in chain.steps)})",
            tags=["chain", *(step.name for step in chain.steps)],
            examples=[f'Send your request as the text, with metadata {{"chain": "{name}"}}'],
            input_modes=["text/plain"],
            output_modes=["text/plain", "application/json"],
        )
        for name, chain in sorted(catalog.chains.items())
    ]
    card = AgentCard(
        name="construct-mcp",
        description=(
            "Durable specialist chains (architect -> engineer -> reviewer, or any chain configured): "
            "a task is a run; it asks for input at host tasks and approval gates."
        ),
        version=version,
        provider=AgentProvider(organization="construct-mcp", url="https://github.com/construct-mcp"),
        supported_interfaces=[
            AgentInterface(
                url=base_url.rstrip("/") + RPC_PATH,
                protocol_binding="JSONRPC",
                protocol_version=PROTOCOL_VERSION,
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=push),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "application/json"],
        skills=skills,
    )
    if bearer:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer"))
        )
        requirement = SecurityRequirement()
        requirement.schemes["bearer"].SetInParent()
        card.security_requirements.append(requirement)
    return card


def a2a_app(
    agent: ChainAgent,
    catalog: Catalog,
    version: str,
    *,
    bearer: bool,
    public_url: str | None,
    push_keys: PushKeys | None = None,
) -> ASGIApp:
    """The A2A app: the card (``GET``, no token) and the JSON-RPC endpoint (``POST``, guarded by
    whoever mounts it). The card names the endpoint at ``public_url``'s origin (the ``[auth]``
    audience, which clients reach), else at the origin the card was asked at. With
    ``push_keys``, push notifications are offered (the card says so) and their key set is served
    at :data:`PUSH_JWKS_PATH` (``GET``, no token)."""

    public = None if public_url is None else urlsplit(public_url)
    push = push_keys is not None

    async def card(request: Request) -> Response:
        base = str(request.base_url) if public is None else f"{public.scheme}://{public.netloc}"
        return JSONResponse(agent_card_to_dict(agent_card(catalog, base, version, bearer, push=push)))

    configs = None if push_keys is None else WebhookConfigs(agent, push_keys)
    routes = [
        Route(CARD_PATH, card, methods=["GET"]),
        *create_jsonrpc_routes(
            ChainHandler(agent, configs), RPC_PATH, _CallerContext(), enable_v0_3_compat=True
        ),
    ]
    if push_keys is not None:
        key_set = push_keys.jwks()

        async def jwks(_request: Request) -> Response:
            return JSONResponse(key_set, headers={"Cache-Control": "max-age=300"})

        routes.append(Route(PUSH_JWKS_PATH, jwks, methods=["GET"]))
    return Starlette(routes=routes)


class LoopbackNames:
    """On a loopback bind, refuses a JSON-RPC request whose ``Host`` or ``Origin`` is not a
    loopback name (DNS rebinding), as ``/mcp`` and the pages do; a JSON-RPC error, HTTP 403."""

    def __init__(self, app: ASGIApp, host: str) -> None:
        self._app = app
        settings = security_settings(host)
        self._security = None if settings is None else TransportSecurityMiddleware(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._security is not None and scope["type"] == "http":
            refused = await self._security.validate_request(Request(scope), is_post=False)
            if refused is not None:
                message = "forbidden: this server answers loopback Host and Origin names only"
                body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
                await JSONResponse(body, status_code=403)(scope, receive, send)
                return
        await self._app(scope, receive, send)


def _version_from_query(scope: Scope) -> Scope:
    """``scope`` with the ``A2A-Version`` a client gave as a query parameter instead of the header
    (A2A 1.0 allows either) as the header the SDK reads; a header, when sent, wins."""
    headers = scope.get("headers", [])
    if any(name == b"a2a-version" for name, _ in headers):
        return scope
    for key, value in parse_qsl(scope.get("query_string", b"").decode("latin-1")):
        if key.lower() == "a2a-version":
            return {**scope, "headers": [*headers, (b"a2a-version", value.encode("latin-1"))]}
    return scope


class JsonRpcRefusals:
    """The refusals made before the A2A app sees a request (no or a bad token: 401, 403; a body
    over the limit: 413; 503 when the issuer cannot be asked) as JSON-RPC error responses, their
    status and headers (``WWW-Authenticate``) kept: an A2A client reads the ``error`` member of the
    body as a JSON-RPC error and would otherwise show none of what the refusal says. The message
    starts with the refusal's code (``unauthorized``, ``invalid_token``, ``too_large``, ...)."""

    REFUSALS = frozenset({401, 403, 413, 503})

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        held: dict[str, Any] = {}

        async def answered(message: ASGIMessage) -> None:
            if message["type"] == "http.response.start" and message["status"] in self.REFUSALS:
                held["start"] = message
                return
            if "start" not in held or message["type"] != "http.response.body":
                await send(message)
                return
            held["body"] = held.get("body", b"") + message.get("body", b"")
            if not message.get("more_body", False):
                await self._send_rewritten(send, held["start"], held["body"])

        await self._app(scope, receive, answered)

    @staticmethod
    async def _send_rewritten(send: Send, start: ASGIMessage, body: bytes) -> None:
        try:
            refusal = json.loads(body)
        except ValueError:
            refusal = None
        if not isinstance(refusal, dict) or "jsonrpc" in refusal:
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        code = refusal.get("error") if isinstance(refusal.get("error"), str) else "refused"
        said = refusal.get("error_description") or refusal.get("message") or ""
        error = {"code": -32600, "message": f"{code}: {said}".rstrip(": "), "data": {"code": code}}
        rewritten = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(rewritten)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": rewritten})


class WithA2A:
    """Sends the agent card's path (and the push key set's) to the A2A app without a token,
    ``/a2a`` to it behind ``guard`` (the tokens of ``/mcp``, the body limit), everything else to
    ``app``."""

    def __init__(self, app: ASGIApp, a2a: ASGIApp, guard: Callable[[ASGIApp], ASGIApp], host: str) -> None:
        self._app = app
        self._card = a2a
        self._rpc = LoopbackNames(JsonRpcRefusals(guard(a2a)), host)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path in (CARD_PATH, PUSH_JWKS_PATH):
            await self._card(scope, receive, send)
        elif path == RPC_PATH:
            await self._rpc(_version_from_query(scope), receive, send)
        else:
            await self._app(scope, receive, send)

"""The A2A client side of agent steps: the one module that imports the A2A SDK (``a2a-sdk``, the
``a2a`` extra).

A step of an ``[agents.NAME]`` table with ``protocol = "a2a"`` sends its rendered ``message`` as
an A2A message (``message/send``, answered at once with the task it started) and follows that task
with ``tasks/get`` until it ends. The parts the drive owns are those of every agent step
(:mod:`orchestration.engine.delegation`, :mod:`orchestration.engine.agent_waits`): the task's id is
recorded (``remote_run_started``) as soon as the answer names it, and a task that has not ended is
followed outside the drive, through :meth:`A2AWorker.remote_status`.

- The message id is derived from the call's idempotency key (the run, the task and the attempt
  that made the first call, :func:`message_id`): an attempt that follows one whose outcome is
  unknown resends the same message. A2A does not promise that an agent recognises it (the SDK's
  own server starts another task), so such an attempt is marked ``possible_duplicate_call``.
- The output: the text parts of the task's artifacts, joined with newlines (with no artifact, the
  text of the task's last status message); for a step with an ``output_schema``, the last data part
  of the artifacts (as JSON) when there is one, validated as any agent's answer.
- Task states read as this server's run statuses (:data:`STATUSES`); a task that stops at
  ``input-required`` reads as ``awaiting_approval``: :meth:`A2AWorker.remote_status` names its
  question (:func:`question_text`), which the follower makes a gate of the run, and
  :meth:`A2AWorker.answer_question` sends the answer decided there as the task's next message
  (the same ``taskId`` and ``contextId``; its id derived from the run, the task, the attempt and
  the question: :func:`~orchestration.core.agent_steps.answer_message_id`; see
  :mod:`orchestration.engine.agent_questions`). A task at ``auth-required`` fails the step with
  ``auth`` (what it asks for quoted).
- Errors are classified in one place (:func:`classify`); the token is read from ``token_env`` when
  the call is made and lives only in that call's requests to the configured URL's origin.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Unpack
from urllib.parse import urlsplit

import anyio
import anyio.lowlevel
import httpx
from a2a.client import (
    A2AClientError,
    A2AClientTimeoutError,
    AgentCardResolutionError,
    Client,
    ClientConfig,
    ClientFactory,
)
from a2a.helpers import get_data_parts, get_text_parts
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    InternalError,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    Task,
    TaskNotFoundError,
    TaskState,
)
from a2a.utils.errors import A2AError
from google.protobuf.json_format import ParseError  # type: ignore[import-untyped]

from orchestration.core.agent_steps import AGENT_ERROR_CODES, message_id
from orchestration.core.hops import DELEGATION_META, onward
from orchestration.core.inputs import whole_numbers
from orchestration.core.models import ExecutionContract, Telemetry, TypedError
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded
from orchestration.errors import ConstructError
from orchestration.workers._redact import Redactor
from orchestration.workers.agent_answers import AgentFailure, checked_answer, remote_run_id
from orchestration.workers.agent_calls import (
    AgentCall,
    AgentEndpoint,
    RemoteAnswer,
    RemoteQuestion,
    RemoteRunKnown,
)
from orchestration.workers.agent_polls import PollPacing, protocol_message
from orchestration.workers.mcp_agents import AgentClient, ClientOptions, call_token, endpoint_token

log = logging.getLogger("construct.agents")

#: how an A2A task's state reads as a run status of this server. A task stopped for input waits
#: at a gate (its question: :mod:`orchestration.engine.agent_questions`); one stopped for
#: authentication has ended for the step (the outcome read from it is the typed error ``auth``).
STATUSES: Mapping[int, str] = {
    TaskState.TASK_STATE_SUBMITTED: "queued",
    TaskState.TASK_STATE_WORKING: "running",
    TaskState.TASK_STATE_COMPLETED: "completed",
    TaskState.TASK_STATE_FAILED: "failed",
    TaskState.TASK_STATE_CANCELED: "cancelled",
    TaskState.TASK_STATE_REJECTED: "rejected",
    TaskState.TASK_STATE_INPUT_REQUIRED: "awaiting_approval",
    TaskState.TASK_STATE_AUTH_REQUIRED: "failed",
}
#: states in which the task goes on by itself, or waits for an answer (not ended for the step)
_WORKING = frozenset(
    {TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_INPUT_REQUIRED}
)
#: the longest question kept (it is shown in the run's view and kept in its head)
MAX_QUESTION_CHARS = 4000


def _ended(state: int) -> bool:
    return state in STATUSES and state not in _WORKING


def question_text(task: Task) -> str:
    """The question of a task at ``input-required``: its status message's parts in order, text as
    it is and a data part as JSON, one per line (at most :data:`MAX_QUESTION_CHARS`)."""
    if not task.status.HasField("message"):
        return "(the agent asks for input but gave no question)"
    lines: list[str] = []
    for part in task.status.message.parts:
        if part.HasField("text"):
            lines.append(part.text)
        elif part.HasField("data"):
            lines.extend(json.dumps(whole_numbers(d), ensure_ascii=False) for d in get_data_parts([part]))
    text = "\n".join(lines).strip() or "(the agent asks for input but gave no question)"
    return text[:MAX_QUESTION_CHARS]


def reply_naming(task: Task) -> dict[str, str]:
    """What an answer to ``task`` names in its metadata when the agent is another construct-mcp:
    its status message's data part lists what its run waits for (``questions``, see
    docs/hosts.md, Other agents: A2A), and with exactly one, the answer names it — a host task's
    ``task_id`` (the answer is its output) or a gate's ``gate_id`` with the decision ``approve``
    (the answer is the comment: the person approved at this run's question gate; a reject there
    cancels the task instead). Any other agent's task: nothing (the answer is its text alone)."""
    if not task.status.HasField("message"):
        return {}
    for data in get_data_parts([p for p in task.status.message.parts if p.HasField("data")]):
        asked = data.get("questions") if isinstance(data, dict) else None
        if not isinstance(asked, list) or len(asked) != 1 or not isinstance(asked[0], dict):
            continue
        question = asked[0]
        child = question.get("run_id")
        named = {"run_id": child} if isinstance(child, str) and child != task.id else {}
        if question.get("kind") == "gate" and isinstance(question.get("gate_id"), str):
            return {**named, "gate_id": question["gate_id"], "decision": "approve"}
        if question.get("kind") == "host_task" and isinstance(question.get("task_id"), str):
            return {**named, "task_id": question["task_id"]}
    return {}


def _question(task: Task) -> RemoteQuestion:
    status = task.status
    asked = status.message.message_id if status.HasField("message") else ""
    if not asked and status.HasField("timestamp"):
        asked = status.timestamp.ToJsonString()
    return RemoteQuestion(question_text(task), task.context_id or None, asked or None)


#: ``connect(endpoint, token, statuses)``: an open A2A client for the agent; every HTTP status
#: seen is appended to ``statuses``
Connector = Callable[[AgentEndpoint, str | None, list[int]], AbstractAsyncContextManager[Client]]


def _card_location(url: str) -> tuple[str, str | None]:
    """The base URL and the card's path of an agent ``url``: a URL ending in ``.json`` is the
    card's own; any other is the base the well-known card path is under."""
    parts = urlsplit(url)
    if parts.path.endswith(".json"):
        return f"{parts.scheme}://{parts.netloc}", parts.path
    return url, None


@asynccontextmanager
async def connect_a2a(
    endpoint: AgentEndpoint,
    token: str | None,
    statuses: list[int],
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[Client]:
    """A client of the A2A agent at ``endpoint``: its card fetched, then the JSON-RPC binding it
    names, through one HTTP client of this call's own. The token goes, as a bearer header, only
    to the origin of the configured ``url``: a card naming an endpoint elsewhere gets none.
    ``transport``: tests."""
    assert endpoint.url is not None
    origin = _origin(httpx.URL(endpoint.url))

    async def authorize(request: httpx.Request) -> None:
        if token is not None and _origin(request.url) == origin:
            request.headers["Authorization"] = f"Bearer {token}"

    async def seen(response: httpx.Response) -> None:
        statuses.append(response.status_code)

    timeout = httpx.Timeout(endpoint.call_timeout_seconds)
    hooks: dict[str, list[Callable[..., Any]]] = {"request": [authorize], "response": [seen]}
    async with httpx.AsyncClient(timeout=timeout, transport=transport, event_hooks=hooks) as http:
        factory = ClientFactory(ClientConfig(streaming=False, polling=True, httpx_client=http))
        base, card_path = _card_location(endpoint.url)
        client = await factory.create_from_url(base, relative_card_path=card_path)
        async with client:
            yield client


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port or {"http": 80, "https": 443}.get(url.scheme)


def classify(exc: BaseException, statuses: list[int], redact: Redactor, agent: str) -> TypedError:
    """The typed error of an exception raised by a call to the A2A ``agent``, given the HTTP
    statuses seen: every SDK and HTTP failure is translated here, and every message redacted."""
    bad = [s for s in statuses if s >= 400]
    status = bad[-1] if bad else None
    if isinstance(exc, AgentFailure):
        code, message = exc.code, exc.message
    elif status in (401, 403):
        code, message = "auth", f"agent {agent} refused the credentials (HTTP {status}); check its token_env"
    elif isinstance(exc, A2AClientTimeoutError | TimeoutError | httpx.TimeoutException):
        code, message = "timeout", f"agent {agent} did not answer in time"
    elif isinstance(exc, TaskNotFoundError):
        code, message = "agent_run_failed", f"agent {agent} does not know the task any more: {exc.message}"
    elif isinstance(
        exc, A2AClientError | AgentCardResolutionError | InternalError | httpx.HTTPError | OSError
    ):
        where = f" (HTTP {status})" if status is not None else ""
        code = "agent_unreachable"
        message = f"agent {agent} could not be reached or stopped answering{where}: {_detail(exc)}"
    elif isinstance(exc, A2AError):
        code, message = "agent_run_failed", f"agent {agent} refused the request: {_detail(exc)}"
    elif isinstance(exc, ValueError | ParseError):
        # the SDK's own: a card naming no JSON-RPC interface, an answer with neither task nor
        # message; or an answer that is no A2A 1.0 object (a field of the wrong shape)
        code, message = "malformed_response", f"agent {agent} answered what cannot be read: {_detail(exc)}"
    else:
        code, message = "agent_unreachable", f"agent {agent} failed: {_detail(exc)}"
    return TypedError(
        code=code, message=redact(message), retryable=AGENT_ERROR_CODES.get(code, False), http_status=status
    )


def _detail(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _status_text(task: Task) -> str:
    return "\n".join(get_text_parts(task.status.message.parts)) if task.status.HasField("message") else ""


def output_text(task: Task, structured: bool) -> str:
    """A completed task's output (see the module's docstring): with ``structured`` (the step has
    an ``output_schema``), its last data part as JSON when it has one."""
    parts = [p for artifact in task.artifacts for p in artifact.parts]
    data = get_data_parts(parts)
    if structured and data:
        return json.dumps(whole_numbers(data[-1]), ensure_ascii=False)
    if parts:
        return "\n".join(get_text_parts(parts))
    return _status_text(task)


def _state_name(state: int) -> str:
    try:
        name = str(TaskState.Name(state))
    except ValueError:
        return str(state)
    return name.removeprefix("TASK_STATE_").lower().replace("_", "-")


class A2AWorker(AgentClient[Connector]):
    """Sends agent steps' messages to the configured A2A agents (see the module's docstring);
    what :class:`~orchestration.workers.agent_calls.AgentDelegate` asks, for A2A agents."""

    MISSING = "this server has no A2A agent [agents.{agent}]; add it to construct.toml"

    def __init__(
        self,
        endpoints: Mapping[str, AgentEndpoint],
        *,
        connect: Connector | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        super().__init__(endpoints, connect or connect_a2a, **options)

    async def delegate(
        self,
        contract: ExecutionContract,
        call: AgentCall,
        previous_errors: tuple[TypedError, ...],
        remember: RemoteRunKnown,
    ) -> AttemptOutcome:
        """Send ``call``'s message, or follow its recorded task, to the task's end (one attempt);
        never raises for the agent's failures. ``remember`` is awaited with the task's id as soon
        as the answer names it; what it raises ends the call and is raised as itself."""
        name = call.agent.agent
        endpoint = self.endpoints.get(name)
        if endpoint is None or endpoint.url is None:
            return self.failure(contract, call, previous_errors, self.not_configured(name))
        token, refused = call_token(endpoint, self._lookup)
        if refused is not None:
            return self.failure(contract, call, previous_errors, refused)
        statuses: list[int] = []
        started = time.monotonic()
        try:
            async with self._connect(endpoint, token, statuses) as client:
                output, value = await self._call(client, endpoint, call, remember)
        except ConstructError:
            raise  # the drive's own (remember): not the agent's failure
        except Exception as exc:
            error = classify(exc, statuses, Redactor([token]), name)
            telemetry = Telemetry(latency_ms=_ms(started), http_status=error.http_status)
            return self._failed(contract, call, previous_errors, error, telemetry)
        return AttemptSucceeded(output, Telemetry(latency_ms=_ms(started)), value)

    async def cancel_remote(self, agent: str, remote_run_id: str, reason: str) -> bool:
        """``tasks/cancel`` the task; whether it ended cancelled. Bounded by the agent's
        ``call_timeout_seconds``, logged, never raised."""
        endpoint = self.endpoints.get(agent)
        if endpoint is None or endpoint.url is None:
            return False
        token = endpoint_token(endpoint, self._lookup)
        statuses: list[int] = []
        try:
            with anyio.fail_after(endpoint.call_timeout_seconds):
                async with self._connect(endpoint, token, statuses) as client:
                    task = await client.cancel_task(CancelTaskRequest(id=remote_run_id))
        except Exception as exc:
            error = classify(exc, statuses, Redactor([token]), agent)
            log.warning(
                "could not cancel remote task %s on agent %s: %s",
                remote_run_id,
                agent,
                error.message,
                extra={"action": "remote_cancel_failed", "code": error.code},
            )
            return False
        cancelled = task.status.state == TaskState.TASK_STATE_CANCELED
        log.info(
            "remote task %s on agent %s: cancel %s (%s)",
            remote_run_id,
            agent,
            "recorded" if cancelled else "not taken",
            reason,
            extra={"action": "remote_cancelled" if cancelled else "remote_cancel_refused"},
        )
        return cancelled

    async def remote_status(self, agent: str, remote_run_id: str, wait_seconds: float) -> RemoteAnswer:
        """One ``tasks/get`` of the followed task: its state as a run status (:data:`STATUSES`;
        None for a state this code does not know), or the poll's typed error. A2A has no long
        poll: the answer comes at once, and the follower's pacing backs off between polls from
        the agent's ``paused_poll_seconds`` up to ``poll_cap_seconds``."""
        endpoint = self.endpoints.get(agent)
        if endpoint is None or endpoint.url is None:
            return RemoteAnswer(None, self.not_configured(agent))
        token = endpoint_token(endpoint, self._lookup)
        statuses: list[int] = []
        started = time.monotonic()
        try:
            with anyio.fail_after(endpoint.call_timeout_seconds * 2):
                async with self._connect(endpoint, token, statuses) as client:
                    task = await client.get_task(GetTaskRequest(id=remote_run_id, history_length=0))
        except Exception as exc:
            error = classify(exc, statuses, Redactor([token]), agent)
            return RemoteAnswer(None, error, time.monotonic() - started)
        # No long poll here: answered "at once" whatever it took, so that the follower's pacing
        # always backs off between polls (never a hot loop, whatever follow_wait_seconds says).
        asks = task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        return RemoteAnswer(STATUSES.get(task.status.state), None, 0.0, _question(task) if asks else None)

    async def answer_question(
        self, agent: str, remote_run_id: str, context_id: str | None, message_id: str, text: str
    ) -> TypedError | None:
        """Send ``text`` as the next message of the task ``remote_run_id`` (``message/send`` with
        its ``taskId`` and ``contextId``, the id ``message_id``, answered at once); None when the
        agent took it, else the typed error (classified as a call's, never raised)."""
        endpoint = self.endpoints.get(agent)
        if endpoint is None or endpoint.url is None:
            return self.not_configured(agent)
        token = endpoint_token(endpoint, self._lookup)
        statuses: list[int] = []
        message = Message(
            message_id=message_id,
            role=Role.ROLE_USER,
            parts=[Part(text=text)],
            task_id=remote_run_id,
            context_id=context_id or "",
        )
        request = SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )
        try:
            with anyio.fail_after(endpoint.call_timeout_seconds * 2):
                async with self._connect(endpoint, token, statuses) as client:
                    asking = await client.get_task(GetTaskRequest(id=remote_run_id, history_length=0))
                    named = reply_naming(asking)
                    if named:
                        request.message.metadata.update(named)
                    async for _ in client.send_message(request):
                        pass
        except Exception as exc:
            return classify(exc, statuses, Redactor([token]), agent)
        log.info(
            "answer %s sent to remote task %s on agent %s",
            message_id,
            remote_run_id,
            agent,
            extra={"action": "remote_answer_sent"},
        )
        return None

    async def _call(
        self, client: Client, endpoint: AgentEndpoint, call: AgentCall, remember: RemoteRunKnown
    ) -> tuple[str, dict[str, Any] | None]:
        name = call.agent.agent
        if call.remote_run_id is None:
            answers = [a async for a in client.send_message(self._request(call))]
            answer = answers[-1] if answers else None
            if answer is not None and answer.HasField("message"):
                # Answered at once, with no task to follow.
                text = "\n".join(get_text_parts(answer.message.parts))
                return checked_answer(text, call.output_schema, self.limits.max_output_chars, name)
            if answer is None or not answer.HasField("task"):
                raise AgentFailure("malformed_response", f"agent {name}: message/send answered no task")
            task = answer.task
            task_id = remote_run_id(task.id, name, "message/send")
            await remember(task_id, _ended(task.status.state))
            # A drive that records the task as awaited outside it cancels this call: stop here.
            await anyio.lowlevel.checkpoint()
        else:
            task_id = call.remote_run_id
            task = await client.get_task(GetTaskRequest(id=task_id, history_length=0))
        task = await self._follow(client, endpoint, task, name)
        return self._outcome(call, task)

    def _request(self, call: AgentCall) -> SendMessageRequest:
        """The ``message/send`` of ``call``: its message (the id from its idempotency key, the
        delegation one hop on in its metadata), answered at once with the task it started."""
        text = str(call.arguments.get("message", ""))
        message = Message(
            message_id=message_id(call.idempotency_key), role=Role.ROLE_USER, parts=[Part(text=text)]
        )
        message.metadata.update(
            {DELEGATION_META: onward(call.delegation, self.server_id).model_dump(mode="json")}
        )
        return SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )

    async def _follow(self, client: Client, endpoint: AgentEndpoint, task: Task, name: str) -> Task:
        """``tasks/get`` until the task ends, paced as the follower's polls (an unknown state past
        ``unknown_status_seconds`` is ``agent_protocol``)."""
        pacing = PollPacing.for_endpoint(endpoint, self.rng)
        while not _ended(task.status.state) and task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED:
            now = time.monotonic()
            status = STATUSES.get(task.status.state)
            delay = pacing.after(status, endpoint.follow_wait_seconds, 0.0, now)
            if pacing.stalled(now):
                seconds = endpoint.unknown_status_seconds
                raise AgentFailure(
                    "agent_protocol", protocol_message(name, task.id, _state_name(task.status.state), seconds)
                )
            await anyio.sleep(delay)
            task = await client.get_task(GetTaskRequest(id=task.id, history_length=0))
        return task

    def _outcome(self, call: AgentCall, task: Task) -> tuple[str, dict[str, Any] | None]:
        """The output of the ended ``task``, or the typed failure it ended with."""
        name = call.agent.agent
        state = task.status.state
        said = _status_text(task)[:500]
        if state == TaskState.TASK_STATE_COMPLETED:
            text = output_text(task, call.output_schema is not None)
            return checked_answer(text, call.output_schema, self.limits.max_output_chars, name)
        if state == TaskState.TASK_STATE_INPUT_REQUIRED:
            # Read by the follower, which makes the question a gate; met here only by a call
            # that follows the task in the drive (it is never left waiting on a person there).
            raise AgentFailure(
                "agent_input_required",
                f"agent {name}: remote task {task.id} asks for input: {said or '(no question given)'}; "
                "the server that follows it makes the question a gate of the run",
            )
        if state == TaskState.TASK_STATE_AUTH_REQUIRED:
            raise AgentFailure(
                "auth",
                f"agent {name}: remote task {task.id} requires authentication: "
                f"{said or '(no detail given)'}; give this server credentials the agent accepts (token_env)",
            )
        why = f": {said}" if said else ""
        raise AgentFailure(
            "agent_run_failed", f"agent {name}: remote task {task.id} ended {_state_name(state)}{why}"
        )


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


__all__ = [
    "MAX_QUESTION_CHARS",
    "STATUSES",
    "A2AWorker",
    "Connector",
    "classify",
    "connect_a2a",
    "output_text",
    "question_text",
]

"""The MCP client side of agent steps: one call of a tool on another MCP server, per attempt.

:class:`AgentWorker` starts or follows a remote construct-mcp run, or calls any other tool once;
what an attempt does is decided from the record (:func:`orchestration.core.agent_steps.agent_attempt`).
Errors come back as data, classified in one place (:func:`classify`). The agent's token is read
from its ``token_env`` when the call is made (:func:`token_from_environment`) and lives only in
that call's headers: never in a record, a log line or an error message.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypedDict, TypeVar, Unpack, cast

import anyio
import anyio.lowlevel
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent
from mcp_types import REQUEST_TIMEOUT, RequestParamsMeta

from orchestration.chains.prompts import TaskPrompt
from orchestration.core.agent_steps import AGENT_ERROR_CODES
from orchestration.core.clock import Clock, SystemClock
from orchestration.core.hops import DELEGATION_META, new_server_id, onward
from orchestration.core.inputs import Limits
from orchestration.core.models import ChainStep, ExecutionContract, Telemetry, TypedError
from orchestration.core.outcomes import AttemptFailedOutcome, AttemptOutcome, AttemptSucceeded
from orchestration.errors import ConstructError
from orchestration.workers._redact import Redactor, check_api_key
from orchestration.workers.agent_answers import (
    AgentFailure,
    checked_answer,
    ended_code,
    refusal_code,
    remote_run_id,
)
from orchestration.workers.agent_calls import (
    AgentCall,
    AgentDelegate,
    AgentEndpoint,
    RemoteAnswer,
    RemoteRunKnown,
)
from orchestration.workers.agent_polls import TERMINAL_STATUSES, PollPacing, protocol_message, status_of
from orchestration.workers.port import DeltaSink, TaskWorker
from orchestration.workers.retry import RetryPolicy, Rng, failed_outcome

log = logging.getLogger("construct.agents")

_TERMINAL = frozenset({"completed", "completed_with_failures", "failed", "cancelled", "rejected"})
_COMPLETED = frozenset({"completed", "completed_with_failures"})


class AgentSession(Protocol):
    """What a call needs of an MCP client session (``mcp.Client`` is one)."""

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        *,
        meta: RequestParamsMeta | None = None,
    ) -> CallToolResult: ...


@dataclass
class _Observed:
    """HTTP statuses seen on the connection (the SDK reports a 401 as a bare JSON-RPC error)."""

    statuses: list[int] = field(default_factory=list)


#: ``connect(endpoint, token, observed)``: an open session to the agent
Connector = Callable[[AgentEndpoint, str | None, _Observed], AbstractAsyncContextManager[AgentSession]]


def token_from_environment(name: str) -> str | None:
    """The process environment's variable ``name`` as it is now (None: not set): an agent's
    ``token_env`` at each call, and each variable a stdio agent's ``pass_env`` names. The one place
    this module reads the environment (everything else is in the server's settings)."""
    return os.environ.get(name)


def endpoint_token(endpoint: AgentEndpoint, lookup: Callable[[str], str | None]) -> str | None:
    """``endpoint``'s bearer token, read through ``lookup`` now (None: no ``token_env``, or not set)."""
    if endpoint.token_env is None:
        return None
    return (lookup(endpoint.token_env) or "").strip() or None


def call_token(
    endpoint: AgentEndpoint, lookup: Callable[[str], str | None]
) -> tuple[str | None, TypedError | None]:
    """The token a call to ``endpoint`` sends, or the ``auth`` error that stops the call before
    anything is sent: ``token_env`` not set, or a value no header can carry (refused without
    quoting it: a header's own errors would)."""
    token = endpoint_token(endpoint, lookup)
    name = endpoint.name
    if endpoint.token_env is not None and token is None:
        message = (
            f"agent {name} needs a token: the environment variable {endpoint.token_env} is not set on "
            "this server"
        )
        return None, TypedError(code="auth", message=message)
    if token is not None:
        try:
            check_api_key(token, what=f"the token in {endpoint.token_env}")
        except ValueError as exc:
            return None, TypedError(code="auth", message=f"agent {name}: {exc}")
    return token, None


@asynccontextmanager
async def connect_mcp(
    endpoint: AgentEndpoint,
    token: str | None,
    observed: _Observed,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> AsyncIterator[AgentSession]:
    """A session to ``endpoint`` with the SDK's client: Streamable HTTP (the token as a bearer
    header of this call's own HTTP client) or a stdio subprocess. ``transport``: tests."""
    if endpoint.url is not None:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}

        async def seen(response: httpx2.Response) -> None:
            observed.statuses.append(response.status_code)

        timeout = httpx2.Timeout(endpoint.call_timeout_seconds, read=endpoint.call_timeout_seconds * 5)
        async with (
            httpx2.AsyncClient(
                headers=headers, timeout=timeout, transport=transport, event_hooks={"response": [seen]}
            ) as http,
            Client(
                streamable_http_client(endpoint.url, http_client=http),
                read_timeout_seconds=endpoint.call_timeout_seconds,
            ) as client,
        ):
            yield client
        return
    assert endpoint.command is not None
    passed = {n: value for n in endpoint.pass_env if (value := token_from_environment(n)) is not None}
    env = {**endpoint.env, **passed}
    params = StdioServerParameters(
        command=endpoint.command[0], args=list(endpoint.command[1:]), env=env, cwd=endpoint.cwd
    )
    async with Client(params, read_timeout_seconds=endpoint.call_timeout_seconds) as client:
        yield client


@asynccontextmanager
async def open_session(
    url: str, token: str | None, call_timeout_seconds: float = 60.0
) -> AsyncIterator[AgentSession]:
    """A session to the MCP server at ``url`` (Streamable HTTP; ``token``: a bearer token), for a
    command that follows a running server (``runs tail --url``): the HTTP client code stays here."""
    endpoint = AgentEndpoint(name="server", url=url, call_timeout_seconds=call_timeout_seconds)
    async with connect_mcp(endpoint, token, _Observed()) as session:
        yield session


#: a classified failure inside a call (caught in :meth:`AgentWorker.delegate`)
_Failure = AgentFailure


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def classify(exc: BaseException, statuses: list[int], redact: Redactor, agent: str) -> TypedError:
    """The typed error of an exception raised by a call to ``agent`` (the SDK raises transport
    errors inside exception groups), given the HTTP statuses seen: every low-level failure is
    translated here, and every message is redacted."""
    leaves = _leaves(exc)
    failure = next((e for e in leaves if isinstance(e, _Failure)), None)
    bad = [s for s in statuses if s >= 400]
    status = bad[-1] if bad else None
    if failure is not None:
        code, message, status = failure.code, failure.message, failure.http_status or status
    elif status in (401, 403):
        code, message = "auth", f"agent {agent} refused the credentials (HTTP {status}); check its token_env"
    elif any(isinstance(e, TimeoutError | httpx2.TimeoutException) for e in leaves) or any(
        isinstance(e, MCPError) and e.code == REQUEST_TIMEOUT for e in leaves
    ):
        code, message = "timeout", f"agent {agent} did not answer in time"
    else:
        first = leaves[0] if leaves else exc
        detail = f"{type(first).__name__}: {first}" if str(first) else type(first).__name__
        code = "agent_unreachable"
        where = f" (HTTP {status})" if status is not None else ""
        message = f"agent {agent} could not be reached or stopped answering{where}: {detail}"
    return TypedError(
        code=code, message=redact(message), retryable=AGENT_ERROR_CODES.get(code, False), http_status=status
    )


def _text_of(result: CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))


def _view(result: CallToolResult, tool: str, agent: str) -> dict[str, Any]:
    """The structured answer of a construct-mcp tool, or a ``_Failure``."""
    if result.is_error:
        text = _text_of(result)
        code = refusal_code(text) or "tool_error"
        raise _Failure(code, f"agent {agent}: {tool} answered with an error: {text}")
    view = result.structured_content
    if not isinstance(view, dict) or not isinstance(view.get("run_id"), str):
        raise _Failure("malformed_response", f"agent {agent}: {tool} did not answer with a run view")
    return view


class ClientOptions(TypedDict, total=False):
    """What an agent client may be given besides its agents and its connector: ``env`` (the
    token lookup; the process environment at each call without it), ``clock``, ``rng``, ``policy``
    (retries), ``limits``, ``server_id``."""

    env: Mapping[str, str] | None
    clock: Clock | None
    rng: Rng | None
    policy: RetryPolicy | None
    limits: Limits | None
    server_id: str | None


#: how an agent client opens a connection to an agent (the MCP one, the A2A one)
C = TypeVar("C")


class AgentClient(Generic[C]):
    """What the agent clients share (this module's :class:`AgentWorker`, and the A2A client
    :class:`~orchestration.workers.a2a_agents.A2AWorker`): the configured agents, the token lookup
    (from the environment at each call unless ``env`` is given), the retry policy with its clock and
    jitter, and how a failure becomes an attempt's outcome."""

    #: what an agent this server lacks is called in ``agent_not_configured`` (``{agent}``: its name)
    MISSING = "this server has no [agents.{agent}] table; add it to construct.toml"

    def __init__(
        self, endpoints: Mapping[str, AgentEndpoint], connect: C, **options: Unpack[ClientOptions]
    ) -> None:
        env, server_id = options.get("env"), options.get("server_id")
        self._connect = connect
        self.endpoints = dict(endpoints)
        #: ``max_output_chars`` bounds what an agent may answer (:mod:`.agent_answers`)
        self.limits = options.get("limits") or Limits()
        #: this server in the delegation a call sends on (:func:`orchestration.core.hops.onward`);
        #: the runtime's ``server_id`` (the composition root gives both the same)
        self.server_id = server_id or new_server_id()
        self._lookup: Callable[[str], str | None] = token_from_environment if env is None else env.get
        self.clock = options.get("clock") or SystemClock()
        #: draws the jitter of the retries and of the follower's polls (uniform in [0, 1))
        self.rng: Rng = options.get("rng") or random.random
        self.policy = options.get("policy") or RetryPolicy()

    def not_configured(self, agent: str) -> TypedError:
        """``agent_not_configured`` for ``agent``."""
        return TypedError(code="agent_not_configured", message=self.MISSING.format(agent=agent))

    def failure(
        self,
        contract: ExecutionContract,
        call: AgentCall,
        previous_errors: tuple[TypedError, ...],
        error: TypedError,
    ) -> AttemptFailedOutcome:
        """``error`` as ``call``'s failed outcome, the retry policy's verdict folded in (what
        ``delegate`` answers a failure with; the follower of runs ``awaiting_agent`` records its
        polls' failures so)."""
        return self._failed(contract, call, previous_errors, error, Telemetry())

    def _failed(
        self,
        contract: ExecutionContract,
        call: AgentCall,
        previous_errors: tuple[TypedError, ...],
        error: TypedError,
        telemetry: Telemetry,
    ) -> AttemptFailedOutcome:
        """The failed outcome with the retry policy's verdict folded in (as the provider worker)."""
        return failed_outcome(
            self.policy, contract, call.attempt, previous_errors, error, telemetry, self.rng, self.clock
        )


class AgentWorker(AgentClient[Connector]):
    """Calls tools of the configured agents (see the module's docstring)."""

    def __init__(
        self,
        endpoints: Mapping[str, AgentEndpoint],
        *,
        connect: Connector | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        super().__init__(endpoints, connect or connect_mcp, **options)

    async def delegate(
        self,
        contract: ExecutionContract,
        call: AgentCall,
        previous_errors: tuple[TypedError, ...],
        remember: RemoteRunKnown,
    ) -> AttemptOutcome:
        """Make ``call`` (one attempt); never raises for the agent's failures. ``remember`` is
        awaited with a remote run's id as soon as it is known; what it raises (the run changed,
        the lease was lost) ends the call and is raised as itself."""
        name = call.agent.agent
        endpoint = self.endpoints.get(name)
        if endpoint is None:
            return self.failure(contract, call, previous_errors, self.not_configured(name))
        token, refused = call_token(endpoint, self._lookup)
        if refused is not None:
            return self.failure(contract, call, previous_errors, refused)
        redact = Redactor([token])
        observed = _Observed()
        started = time.monotonic()
        try:
            async with self._connect(endpoint, token, observed) as session:
                output, value = await self._call(session, endpoint, call, remember)
        except ConstructError:
            raise  # the drive's own (remember): not the agent's failure
        except Exception as exc:
            if any(isinstance(e, ConstructError) for e in _leaves(exc)):
                raise next(e for e in _leaves(exc) if isinstance(e, ConstructError)) from exc
            error = classify(exc, observed.statuses, redact, name)
            telemetry = Telemetry(latency_ms=_ms(started), http_status=error.http_status)
            return self._failed(contract, call, previous_errors, error, telemetry)
        telemetry = Telemetry(latency_ms=_ms(started))
        return AttemptSucceeded(output, telemetry, value)

    async def cancel_remote(self, agent: str, remote_run_id: str, reason: str) -> bool:
        """``orchestrate_cancel`` the remote run (see
        :class:`~orchestration.workers.agent_calls.AgentDelegate`); bounded by the agent's
        ``call_timeout_seconds``, logged, never raised."""
        endpoint = self.endpoints.get(agent)
        if endpoint is None:
            return False
        token = endpoint_token(endpoint, self._lookup)
        observed = _Observed()
        try:
            with anyio.fail_after(endpoint.call_timeout_seconds):
                async with self._connect(endpoint, token, observed) as session:
                    args = {"run_id": remote_run_id, "reason": reason}
                    result = await session.call_tool("orchestrate_cancel", args)
        except Exception as exc:
            error = classify(exc, observed.statuses, Redactor([token]), agent)
            log.warning(
                "could not cancel remote run %s on agent %s: %s",
                remote_run_id,
                agent,
                error.message,
                extra={"action": "remote_cancel_failed", "code": error.code},
            )
            return False
        cancelled = not result.is_error
        log.info(
            "remote run %s on agent %s: cancel %s",
            remote_run_id,
            agent,
            "recorded" if cancelled else "refused",
            extra={"action": "remote_cancelled" if cancelled else "remote_cancel_refused"},
        )
        return cancelled

    async def remote_status(self, agent: str, remote_run_id: str, wait_seconds: float) -> RemoteAnswer:
        """One ``run_status`` of a followed remote run with ``wait_seconds`` (see
        :class:`~orchestration.workers.agent_calls.AgentDelegate`): the status it names, or the
        poll's typed error (classified and redacted as a call's). Never raises for the agent's
        failures."""
        endpoint = self.endpoints.get(agent)
        if endpoint is None:
            return RemoteAnswer(None, self.not_configured(agent))
        token = endpoint_token(endpoint, self._lookup)
        observed = _Observed()
        started = time.monotonic()
        try:
            with anyio.fail_after(wait_seconds + endpoint.call_timeout_seconds * 2):
                async with self._connect(endpoint, token, observed) as session:
                    result = await session.call_tool(
                        "run_status",
                        {"run_id": remote_run_id, "wait_seconds": wait_seconds},
                        read_timeout_seconds=wait_seconds + endpoint.call_timeout_seconds,
                    )
            view = _view(result, "run_status", agent)
        except Exception as exc:
            error = classify(exc, observed.statuses, Redactor([token]), agent)
            return RemoteAnswer(None, error, time.monotonic() - started)
        return RemoteAnswer(status_of(view), None, time.monotonic() - started)

    async def _call(
        self, session: AgentSession, endpoint: AgentEndpoint, call: AgentCall, remember: RemoteRunKnown
    ) -> tuple[str, dict[str, Any] | None]:
        name = call.agent.agent
        sent = onward(call.delegation, self.server_id).model_dump(mode="json")
        meta = cast(RequestParamsMeta, {DELEGATION_META: sent})
        if not call.agent.follows_runs:
            result = await session.call_tool(call.agent.tool, call.arguments, meta=meta)
            if result.is_error:
                raise _Failure(
                    "tool_error",
                    f"agent {name}: {call.agent.tool} answered with an error: {_text_of(result)}",
                )
            text = _text_of(result)
            if not text and result.structured_content is not None:
                text = json.dumps(result.structured_content, ensure_ascii=False)
            return self._checked(call, text)
        run_id = call.remote_run_id
        if run_id is None:
            arguments = {**call.arguments, "idempotency_key": call.idempotency_key, "wait_seconds": 0}
            answer = await session.call_tool("orchestrate_start", arguments, meta=meta)
            view = _view(answer, "orchestrate_start", name)
            run_id = remote_run_id(view["run_id"], name, "orchestrate_start")
            await remember(run_id, status_of(view) in TERMINAL_STATUSES)
            # A drive that records the run as awaited outside it cancels this call: stop here.
            await anyio.lowlevel.checkpoint()
        view = await self._follow(session, endpoint, run_id, name)
        status = view.get("status")
        if status not in _COMPLETED:
            error = view.get("error") if isinstance(view.get("error"), dict) else {}
            why = f": {error.get('code')}: {error.get('message')}" if error else ""
            raise _Failure(ended_code(error), f"agent {name}: remote run {run_id} ended {status}{why}")
        # The whole record: a task's step (for output_step) and its whole output are not in the
        # compact answer the follow reads.
        full = _view(
            await session.call_tool("run_status", {"run_id": run_id, "detail": "full"}), "run_status", name
        )
        task_id = self._output_task(full, call.agent.output_step)
        if task_id is None:
            raise _Failure(
                "agent_run_failed", f"agent {name}: remote run {run_id} ended {status} with no output to use"
            )
        task = next((t for t in full.get("tasks", []) if t.get("task_id") == task_id), None)
        if task is None or not isinstance(task.get("output"), str):
            raise _Failure(
                "malformed_response", f"agent {name}: run_status did not show task {task_id}'s output"
            )
        return self._checked(call, task["output"])

    async def _follow(
        self, session: AgentSession, endpoint: AgentEndpoint, run_id: str, name: str
    ) -> dict[str, Any]:
        """``run_status`` with ``wait_seconds`` until the remote run ends, paced by
        :class:`~orchestration.workers.agent_polls.PollPacing` (an answer that comes at once
        without the run having ended — paused there, an unknown status — is followed by a
        backed-off sleep; unknown statuses past the bound are ``agent_protocol``)."""
        wait = endpoint.follow_wait_seconds
        pacing = PollPacing.for_endpoint(endpoint, self.rng)
        while True:
            asked = time.monotonic()
            result = await session.call_tool(
                "run_status",
                {"run_id": run_id, "wait_seconds": wait},
                read_timeout_seconds=wait + endpoint.call_timeout_seconds,
            )
            view = _view(result, "run_status", name)
            status = status_of(view)
            if status in TERMINAL_STATUSES:
                return view
            now = time.monotonic()
            delay = pacing.after(status, wait, now - asked, now)
            if pacing.stalled(now):
                seconds = endpoint.unknown_status_seconds
                raise _Failure("agent_protocol", protocol_message(name, run_id, status, seconds))
            await anyio.sleep(delay)

    @staticmethod
    def _output_task(view: dict[str, Any], output_step: str | None) -> str | None:
        done = [
            t
            for t in view.get("tasks", [])
            if t.get("status") == "done" and (output_step is None or t.get("step") == output_step)
        ]
        return str(done[-1]["task_id"]) if done else None

    def _checked(self, call: AgentCall, text: str) -> tuple[str, dict[str, Any] | None]:
        return checked_answer(text, call.output_schema, self.limits.max_output_chars, call.agent.agent)


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


class Workers:
    """The runtime's worker: provider steps go to ``provider`` (None: this server has no provider
    backend), agent steps to ``agents`` (:mod:`orchestration.engine.delegation` finds it here)."""

    def __init__(self, provider: TaskWorker | None, agents: AgentDelegate) -> None:
        self.provider = provider
        self.agents = agents

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        if self.provider is None:
            error = TypedError(code="invalid_request", message="the provider backend is not configured here")
            return AttemptFailedOutcome(error, Telemetry())
        return await self.provider.execute(contract, step, prompt, attempt, previous_errors, sink)


__all__ = [
    "AgentSession",
    "AgentWorker",
    "Connector",
    "Workers",
    "call_token",
    "classify",
    "connect_mcp",
    "endpoint_token",
    "token_from_environment",
]

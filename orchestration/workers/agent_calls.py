"""What an agent call is, without the MCP SDK: the configured endpoint, one attempt's call, and
the port the drive calls (:class:`AgentDelegate`). The SDK client that implements it is
:mod:`orchestration.workers.mcp_agents`, imported only by the composition root, so that importing the
runtime does not import the SDK."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from orchestration.core.models import AgentStep, Delegation, ExecutionContract, TypedError
from orchestration.core.outcomes import AttemptFailedOutcome, AttemptOutcome

#: how an agent is spoken to: a tool of an MCP server, or an A2A agent
AgentProtocol = Literal["mcp", "a2a"]


class RemoteRunKnown(Protocol):
    """``remember(remote_run_id, ended)``: record the remote run's id (the drive's write) before
    following it; ``ended``: whether the answer that named it showed it ended already. A drive
    that records a run that has not ended as awaited outside the drive stops the call (see
    :mod:`orchestration.engine.delegation`)."""

    async def __call__(self, remote_run_id: str, ended: bool = True) -> None: ...


@dataclass(frozen=True, slots=True)
class RemoteQuestion:
    """What a remote A2A task stopped at ``input-required`` asks: the question's text (its text
    parts; a data part as JSON), the task's context id (an answer names it) and an id of the
    asking (the status message's id, else its time), so that one question read twice is one."""

    text: str
    context_id: str | None = None
    asked_id: str | None = None


@dataclass(frozen=True, slots=True)
class RemoteAnswer:
    """One ``run_status`` answer about a followed remote run (:meth:`AgentDelegate.remote_status`):
    the status it names (None: none could be read), the typed error of a poll that failed (then
    ``status`` is None), and how long it took to come (monotonic seconds). ``question``: the
    remote task waits for an answer to it (an A2A task at ``input-required``)."""

    status: str | None
    error: TypedError | None = None
    answered_in: float = 0.0
    question: RemoteQuestion | None = None


@dataclass(frozen=True, slots=True)
class AgentEndpoint:
    """An ``[agents.NAME]`` table, resolved (see :mod:`server.settings.agents`). Holds no secret: the
    token's *variable name* only."""

    name: str
    #: Streamable HTTP endpoint (``http(s)://host:port/mcp``), or None for a stdio agent; for an
    #: A2A agent, the base URL its agent card is served under (or the card's own URL)
    url: str | None = None
    #: ``mcp`` (a tool of an MCP server) or ``a2a`` (an A2A agent: :mod:`.a2a_agents`)
    protocol: AgentProtocol = "mcp"
    #: the environment variable holding the bearer token for ``url`` (read at each call)
    token_env: str | None = None
    #: a stdio agent: the command and its arguments
    command: tuple[str, ...] | None = None
    #: a stdio agent: environment variables set for it, and names passed through from ours
    env: Mapping[str, str] = field(default_factory=dict)
    pass_env: tuple[str, ...] = ()
    cwd: str | None = None
    #: how long one request may go unanswered (a ``run_status`` wait comes on top)
    call_timeout_seconds: float = 60.0
    #: each ``run_status`` of a followed remote run waits this long for it to settle
    follow_wait_seconds: float = 30.0
    #: how often a paused remote run (waiting for its host or an approval) is polled at first;
    #: the polls back off (jittered, exponential) up to ``poll_cap_seconds`` while it stays so
    paused_poll_seconds: float = 5.0
    poll_cap_seconds: float = 30.0
    #: answers with a status no construct-mcp has for this long fail the attempt (agent_protocol)
    unknown_status_seconds: float = 60.0


@dataclass(frozen=True, slots=True)
class AgentCall:
    """One attempt's call, as the drive built it from the record."""

    run_id: str
    task_id: str
    attempt: int
    agent: AgentStep
    arguments: dict[str, Any]
    idempotency_key: str
    #: a recorded remote run to follow instead of starting one
    remote_run_id: str | None = None
    output_schema: dict[str, Any] | None = None
    #: the delegation that started the calling run (None: none): the call sends one hop more
    #: (:func:`orchestration.core.hops.onward`)
    delegation: Delegation | None = None


class AgentDelegate(Protocol):
    """What the drive needs to make an agent step's attempt, and the follower of runs
    ``awaiting_agent`` to follow its remote run (see
    :class:`~orchestration.workers.mcp_agents.AgentWorker`)."""

    @property
    def endpoints(self) -> Mapping[str, AgentEndpoint]:
        """The configured agents, by name."""
        ...

    @property
    def rng(self) -> Callable[[], float]:
        """Draws the jitter of the follower's polls (uniform in [0, 1))."""
        ...

    async def delegate(
        self,
        contract: ExecutionContract,
        call: AgentCall,
        previous_errors: tuple[TypedError, ...],
        remember: RemoteRunKnown,
    ) -> AttemptOutcome:
        """Make ``call`` (one attempt); never raises for the agent's failures (a failed outcome
        instead). ``remember`` is awaited with a remote run's id as soon as it is known."""
        ...

    async def cancel_remote(self, agent: str, remote_run_id: str, reason: str) -> bool:
        """Best effort: ``orchestrate_cancel`` the remote run on ``agent``; whether it was
        cancelled. Never raises."""
        ...

    def failure(
        self,
        contract: ExecutionContract,
        call: AgentCall,
        previous_errors: tuple[TypedError, ...],
        error: TypedError,
    ) -> AttemptFailedOutcome:
        """``error`` as ``call``'s failed outcome, with the retry policy's verdict."""
        ...

    async def remote_status(self, agent: str, remote_run_id: str, wait_seconds: float) -> RemoteAnswer:
        """One ``run_status`` of the remote run on ``agent`` with ``wait_seconds`` (a long poll);
        a failure is the answer's typed error. Never raises for the agent's failures."""
        ...


@runtime_checkable
class AnswersQuestions(Protocol):
    """An :class:`AgentDelegate` whose remote runs may ask questions (A2A's ``input-required``):
    it sends an answer back (see :mod:`orchestration.engine.agent_questions`)."""

    async def answer_question(
        self, agent: str, remote_run_id: str, context_id: str | None, message_id: str, text: str
    ) -> TypedError | None:
        """Send ``text`` as the next message of the remote task ``remote_run_id`` (in
        ``context_id``), with the message id ``message_id`` (the same on a resend); None when
        the agent took it, else the typed error (never raises for the agent's failures)."""
        ...


__all__ = [
    "AgentCall",
    "AgentDelegate",
    "AgentEndpoint",
    "AgentProtocol",
    "AnswersQuestions",
    "RemoteAnswer",
    "RemoteQuestion",
    "RemoteRunKnown",
]

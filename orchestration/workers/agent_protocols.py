"""Which client an agent step's call goes to: the agent's ``protocol`` (``mcp``, the default, or
``a2a``) picks :class:`~orchestration.workers.mcp_agents.AgentWorker` or
:class:`~orchestration.workers.a2a_agents.A2AWorker`, behind the one
:class:`~orchestration.workers.agent_calls.AgentDelegate` port the drive and the followers use.

The A2A SDK is an optional extra: it is imported only when an agent is configured with
``protocol = "a2a"``, and a server without it refuses to start with such an agent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from orchestration.core.inputs import Limits
from orchestration.core.models import ExecutionContract, TypedError
from orchestration.core.outcomes import AttemptFailedOutcome, AttemptOutcome
from orchestration.errors import ConfigError
from orchestration.workers.agent_calls import (
    AgentCall,
    AgentDelegate,
    AgentEndpoint,
    AnswersQuestions,
    RemoteAnswer,
    RemoteRunKnown,
)
from orchestration.workers.mcp_agents import AgentWorker

#: the install that brings the A2A SDK
A2A_EXTRA = "construct-mcp[a2a]"


class AgentsByProtocol:
    """An :class:`~orchestration.workers.agent_calls.AgentDelegate` that hands each call to the
    delegate of its agent's protocol (an agent this server does not know goes to the MCP one,
    which answers ``agent_not_configured``)."""

    def __init__(
        self, endpoints: Mapping[str, AgentEndpoint], mcp: AgentDelegate, a2a: AgentDelegate | None = None
    ) -> None:
        self._endpoints = dict(endpoints)
        self._mcp = mcp
        self._a2a = a2a

    @property
    def endpoints(self) -> Mapping[str, AgentEndpoint]:
        """The configured agents, by name."""
        return self._endpoints

    @property
    def rng(self) -> Callable[[], float]:
        """Draws the jitter of the follower's polls (uniform in [0, 1))."""
        return self._mcp.rng

    def _for(self, agent: str) -> AgentDelegate:
        endpoint = self._endpoints.get(agent)
        if endpoint is not None and endpoint.protocol == "a2a" and self._a2a is not None:
            return self._a2a
        return self._mcp

    async def delegate(
        self,
        contract: ExecutionContract,
        call: AgentCall,
        previous_errors: tuple[TypedError, ...],
        remember: RemoteRunKnown,
    ) -> AttemptOutcome:
        """The call, made by its agent's client."""
        return await self._for(call.agent.agent).delegate(contract, call, previous_errors, remember)

    async def cancel_remote(self, agent: str, remote_run_id: str, reason: str) -> bool:
        """The remote run (or A2A task) cancelled by its agent's client."""
        return await self._for(agent).cancel_remote(agent, remote_run_id, reason)

    def failure(
        self,
        contract: ExecutionContract,
        call: AgentCall,
        previous_errors: tuple[TypedError, ...],
        error: TypedError,
    ) -> AttemptFailedOutcome:
        """``error`` as ``call``'s failed outcome."""
        return self._for(call.agent.agent).failure(contract, call, previous_errors, error)

    async def remote_status(self, agent: str, remote_run_id: str, wait_seconds: float) -> RemoteAnswer:
        """One poll of the followed remote run (or A2A task) by its agent's client."""
        return await self._for(agent).remote_status(agent, remote_run_id, wait_seconds)

    async def answer_question(
        self, agent: str, remote_run_id: str, context_id: str | None, message_id: str, text: str
    ) -> TypedError | None:
        """The answer to a remote task's question, sent by its agent's client (only an A2A
        agent's tasks ask: any other answers ``agent_protocol``)."""
        client = self._for(agent)
        if not isinstance(client, AnswersQuestions):
            message = f"agent {agent} speaks no protocol whose runs ask questions; nothing was sent"
            return TypedError(code="agent_protocol", message=message)
        return await client.answer_question(agent, remote_run_id, context_id, message_id, text)


def agent_workers(
    endpoints: Mapping[str, AgentEndpoint], *, limits: Limits | None = None, server_id: str | None = None
) -> AgentsByProtocol:
    """The agent worker of a server with ``endpoints``: the MCP client, and the A2A client when an
    agent speaks A2A (``ConfigError`` when the A2A SDK is not installed then)."""
    mcp = AgentWorker(endpoints, limits=limits, server_id=server_id)
    a2a_agents = sorted(name for name, e in endpoints.items() if e.protocol == "a2a")
    if not a2a_agents:
        return AgentsByProtocol(endpoints, mcp)
    try:
        from orchestration.workers.a2a_agents import A2AWorker
    except ImportError as exc:
        raise ConfigError(
            "construct.toml",
            f"agents.{a2a_agents[0]}.protocol",
            f"an A2A agent needs the A2A SDK: install {A2A_EXTRA} ({exc})",
        ) from exc
    return AgentsByProtocol(endpoints, mcp, A2AWorker(endpoints, limits=limits, server_id=mcp.server_id))


__all__ = ["A2A_EXTRA", "AgentsByProtocol", "agent_workers"]

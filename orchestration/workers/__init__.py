"""Backends that execute a task: the :class:`TaskWorker` port, the ``inline`` host worker, the
provider adapters (Anthropic Messages, OpenAI-compatible Chat Completions) and the clients of agent
steps (MCP; A2A, imported only when an agent speaks it), and the OAuth token endpoint's client of
the run pages' sign-in. All of the project's HTTP client code
lives here. Imports :mod:`orchestration.core` and :mod:`orchestration.chains`."""

from __future__ import annotations

from orchestration.workers.agent_calls import AgentEndpoint, AgentProtocol
from orchestration.workers.agent_protocols import A2A_EXTRA, AgentsByProtocol, agent_workers
from orchestration.workers.mcp_agents import AgentSession, AgentWorker, Workers, open_session
from orchestration.workers.model_calls import StructuredOutputMode, make_http_client
from orchestration.workers.openai_compat import MaxTokensField
from orchestration.workers.provider_worker import (
    DEFAULT_BASE_URLS,
    KEY_VARIABLES,
    PROVIDERS,
    ProviderEndpoint,
    ProviderName,
    ProviderSettings,
    ProviderWorker,
    contract_resolver,
)
from orchestration.workers.token_endpoint import TokenEndpointError, exchange_code, introspect
from orchestration.workers.webhooks import Posted, post_notification, webhook_client

__all__ = [
    "A2A_EXTRA",
    "DEFAULT_BASE_URLS",
    "KEY_VARIABLES",
    "PROVIDERS",
    "AgentEndpoint",
    "AgentProtocol",
    "AgentSession",
    "AgentWorker",
    "AgentsByProtocol",
    "MaxTokensField",
    "Posted",
    "ProviderEndpoint",
    "ProviderName",
    "ProviderSettings",
    "ProviderWorker",
    "StructuredOutputMode",
    "TokenEndpointError",
    "Workers",
    "agent_workers",
    "contract_resolver",
    "exchange_code",
    "introspect",
    "make_http_client",
    "open_session",
    "post_notification",
    "webhook_client",
]

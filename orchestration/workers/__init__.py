"""Backends that execute a task: the :class:`TaskWorker` port, the ``inline`` host worker, the
provider adapters (Anthropic Messages, OpenAI-compatible Chat Completions) and the MCP client of agent
steps. All of the project's HTTP client code lives here. Imports :mod:`orchestration.core` and
:mod:`orchestration.chains`."""

from __future__ import annotations

from orchestration.workers.agent_calls import AgentEndpoint
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

__all__ = [
    "DEFAULT_BASE_URLS",
    "KEY_VARIABLES",
    "PROVIDERS",
    "AgentEndpoint",
    "AgentSession",
    "AgentWorker",
    "MaxTokensField",
    "ProviderEndpoint",
    "ProviderName",
    "ProviderSettings",
    "ProviderWorker",
    "StructuredOutputMode",
    "Workers",
    "contract_resolver",
    "make_http_client",
    "open_session",
]

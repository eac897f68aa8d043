"""Wiring shared by the server and the CLI: the runtime over a store, with this process's owner.

Kept apart from :mod:`server.app` so that the ``runs`` commands of the CLI, which need a runtime
but no MCP server, do not pay for importing the MCP SDK.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from orchestration.chains import Catalog
from orchestration.core import new_server_id, price_table, with_costs
from orchestration.engine import RunMemory, Runtime, RuntimeSettings
from orchestration.store import RunStore
from orchestration.workers import ProviderWorker, Workers, agent_workers, contract_resolver, make_http_client
from server.settings.agents import agent_endpoints
from server.settings.config import Settings
from server.settings.providers import provider_settings


def process_owner() -> str:
    """A lease owner unique to this process: host, pid and a random suffix (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@asynccontextmanager
async def runtime_for(
    settings: Settings,
    store: RunStore,
    catalog: Catalog,
    warnings: Sequence[str] = (),
    memory: RunMemory | None = None,
) -> AsyncIterator[Runtime]:
    """A runtime over ``store`` with both worker backends wired: ``inline`` (the host runs the
    tasks) and ``provider`` (this process calls the model, through one pooled HTTP client that
    is closed on exit); agent steps go to the ``[agents]`` of the settings (see
    :mod:`server.settings.agents`)."""
    providers = provider_settings(settings)
    # one identity for this process in agent delegations: the runtime refuses a start that lists
    # it, the agent worker adds it to what its calls send on (orchestration.core.hops)
    server_id = new_server_id()
    agents = agent_workers(agent_endpoints(settings.agents), limits=settings.limits(), server_id=server_id)
    async with make_http_client(max_connections=providers.max_connections) as http:
        yield Runtime(
            store,
            catalog,
            limits=settings.limits(),
            resolve_contract=with_costs(
                contract_resolver(settings.worker_backend, providers),
                prices=price_table(settings.prices),
                max_tokens=settings.max_tokens,
                budgets=settings.budgets,
            ),
            worker=Workers(ProviderWorker(providers, http), agents),
            server_id=server_id,
            warnings=warnings,
            memory=memory,
            settings=RuntimeSettings(
                owner=process_owner(),
                lease_ttl_seconds=settings.lease_ttl_seconds,
                in_memory_wait_cap_seconds=settings.retry_wait_cap_seconds,
                store_outage_seconds=settings.store_outage_seconds,
            ),
        )

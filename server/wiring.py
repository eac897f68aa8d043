"""Wiring shared by the server and the CLI: the runtime over a store, with this process's owner.

Kept apart from :mod:`server.app` so that the ``runs`` commands of the CLI, which need a runtime
but no MCP server, do not pay for importing the MCP SDK.
"""

from __future__ import annotations

import os
import secrets
import socket

from orchestration.catalog import Catalog
from orchestration.runtime import Runtime
from orchestration.store import RunStore
from orchestration.workers.provider import contract_resolver
from server.config import Settings


def process_owner() -> str:
    """A lease owner unique to this process: host, pid and a random suffix (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def build_runtime(settings: Settings, store: RunStore, catalog: Catalog, warnings: list[str]) -> Runtime:
    return Runtime(
        store,
        catalog,
        limits=settings.limits(),
        owner=process_owner(),
        lease_ttl_seconds=settings.lease_ttl_seconds,
        resolve_contract=contract_resolver(settings.worker_backend, None),
        warnings=warnings,
    )

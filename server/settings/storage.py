"""Open the store the settings ask for (the server's one door to :mod:`stores`).

Resolution and fallback are :func:`stores.open_configured_store`'s: ``--store`` > the config file's
``store`` > ``CONSTRUCT_ORCHESTRATION_STORE`` > ``CONSTRUCT_DEPLOYMENT_MODE`` > filesystem, and an
unreachable backend falls back to the filesystem store with a warning unless ``store_fallback`` is
false. When ``CONSTRUCT_FAULT_CRASH_AFTER_WRITES`` is set the store is wrapped in
:class:`stores.faults.CrashAfterWrites` (tests only).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from orchestration.store import RunStore
from server.settings.config import Settings
from stores import open_configured_store
from stores.faults import CrashAfterWrites

log = logging.getLogger("construct.server")


@dataclass(frozen=True, slots=True)
class OpenedRunStore:
    store: RunStore
    description: str
    warnings: tuple[str, ...] = ()


def _store_env(settings: Settings) -> dict[str, str]:
    """The environment :func:`stores.open_configured_store` reads, rebuilt from the resolved
    settings so that the config file's ``deployment_mode`` and ``database_url`` count too."""
    env: dict[str, str] = {}
    if settings.store is not None and settings.source_of("store") == "CONSTRUCT_ORCHESTRATION_STORE":
        env["CONSTRUCT_ORCHESTRATION_STORE"] = settings.store
    if "deployment_mode" in settings.sources:
        env["CONSTRUCT_DEPLOYMENT_MODE"] = settings.deployment_mode
    url = settings.database_url or os.environ.get("DATABASE_URL")
    if url:
        env["CONSTRUCT_DATABASE_URL"] = url
    return env


def store_inputs(settings: Settings) -> dict[str, Any]:
    """The ``explicit`` / ``config`` / ``env`` arguments of :func:`stores.resolve_store_spec` and
    :func:`stores.open_configured_store` for these settings."""
    source = settings.source_of("store")
    return {
        "explicit": settings.store if source.startswith("--") else None,
        "config": settings.store if source == "config" else None,
        "env": _store_env(settings),
    }


async def open_run_store(settings: Settings) -> OpenedRunStore:
    """Open the configured store. Raises ConfigError (not a store spec) or StoreUnavailable (cannot
    be opened and no fallback)."""
    opened = await open_configured_store(
        home=settings.home, fallback=settings.store_fallback, **store_inputs(settings)
    )
    store: RunStore = opened.store
    description = f"{store.name} ({opened.requested}, from {opened.source})"
    if settings.fault_crash_after_writes is not None:
        store = CrashAfterWrites(store, settings.fault_crash_after_writes)
        log.warning(
            "fault injection on: the process SIGKILLs itself after durable write %d",
            settings.fault_crash_after_writes,
            extra={"action": "fault_injection_enabled"},
        )
    return OpenedRunStore(store, description, tuple(opened.warnings))

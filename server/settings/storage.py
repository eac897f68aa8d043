"""Open the store the settings ask for: the server's one door to :mod:`stores`. Which store is
``--store`` > the file's ``store`` > ``CONSTRUCT_ORCHESTRATION_STORE`` > the deployment mode >
filesystem (:func:`store_inputs`); :mod:`stores` is given the result and reads no environment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from orchestration.errors import StoreUnavailable
from orchestration.store import RunStore
from server.settings.config import Settings
from stores import CrashAfterWrites, open_configured_store, parse_store_spec

log = logging.getLogger("construct.server")

#: The store of each deployment mode, when no store is named.
BACKEND_OF_MODE = {"solo": "filesystem", "team": "postgres", "enterprise": "postgres"}


@dataclass(frozen=True, slots=True)
class OpenedRunStore:
    store: RunStore
    description: str
    warnings: tuple[str, ...] = ()
    #: the store did not exist before (see :attr:`stores.OpenedStore.created`)
    created: bool = False


def store_choice(settings: Settings) -> tuple[str, str]:
    """``(spec, source)``: the store these settings name and where that came from (``--store``,
    ``config``, ``CONSTRUCT_ORCHESTRATION_STORE``, ``CONSTRUCT_DEPLOYMENT_MODE``, ``default``). A
    blank store counts as none."""
    if settings.store is not None and settings.store.strip():
        return settings.store.strip(), settings.source_of("store")
    if "deployment_mode" in settings.sources:
        # Labelled by its variable wherever it was set, as the store's source always was.
        return BACKEND_OF_MODE[settings.deployment_mode], "CONSTRUCT_DEPLOYMENT_MODE"
    return "filesystem", "default"


def store_inputs(settings: Settings) -> dict[str, Any]:
    """The ``spec`` / ``source`` / ``database_url`` arguments of :func:`stores.open_configured_store`
    for these settings."""
    spec, source = store_choice(settings)
    return {
        "spec": spec,
        "source": source,
        "database_url": settings.database_url,
        "pool_size": settings.store_pool_size,
    }


def store_url(settings: Settings) -> str:
    """The store these settings name, as a spec that needs no settings: the bare name ``postgres``
    becomes the database URL (when there is one; else it stays, and opening it says what is missing)."""
    spec, _source = store_choice(settings)
    if settings.database_url and spec.lower() in ("postgres", "postgresql"):
        return settings.database_url
    return spec


async def open_run_store(settings: Settings) -> OpenedRunStore:
    """Open the configured store. Raises ConfigError (not a store spec) or StoreUnavailable (cannot
    be opened and no fallback)."""
    try:
        opened = await open_configured_store(
            home=settings.home, fallback=settings.store_fallback, **store_inputs(settings)
        )
    except StoreUnavailable as exc:
        spec, source = store_choice(settings)
        if (
            settings.store_fallback
            or parse_store_spec(spec, home=settings.home, source=source).backend == "filesystem"
        ):
            raise
        # Said here, where the setting is known: the stores know nothing of settings.
        raise StoreUnavailable(f"{exc.message}; store_fallback is off") from exc
    store: RunStore = opened.store
    # A fallback's own warning says which store is used instead, and where.
    created = opened.created and not opened.fell_back
    made = ", created just now" if created else ""
    description = f"{store.name} ({opened.requested}, from {opened.source}{made})"
    if settings.fault_crash_after_writes is not None:
        store = CrashAfterWrites(store, settings.fault_crash_after_writes)
        log.warning(
            "fault injection on: the process SIGKILLs itself after durable write %d",
            settings.fault_crash_after_writes,
            extra={"action": "fault_injection_enabled"},
        )
    return OpenedRunStore(store, description, tuple(opened.warnings), created)

"""The persistent stores the reliability tests run real servers on: filesystem, sqlite, postgres.

A :class:`StoreTarget` is one empty store that one or several server processes share, addressed by
an absolute store URL (``file:///...``, ``sqlite:////...``, ``postgresql://...?schema=...``), so
that servers with different ``CONSTRUCT_HOME`` directories (and pid files) still meet in one store.
The servers run with ``store_fallback`` off: a store that cannot be opened fails the server instead
of quietly running it on a filesystem store the test does not look at.

PostgreSQL comes from ``CONSTRUCT_TEST_POSTGRES_DSN``; without it the postgres cases skip locally
and fail with ``CI=true`` (the rule of ``tests/stores/sql_adapters.py``). Each target gets a fresh
schema, migrated from empty and dropped afterwards, so a run left over by one test can never be
picked up by the servers of the next.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from orchestration.core.facts import Fact
from orchestration.core.models import RunHead
from orchestration.store import RunStore
from stores import migrate, open_store
from tests.acceptance.harness import server_env
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url

#: Every persistent backend; postgres skips (or fails in CI) without a test database.
BACKENDS = ("filesystem", "sqlite", "postgres")


@dataclass(frozen=True)
class StoreTarget:
    backend: str
    #: the store URL the servers get (may hold a password: not for logs)
    url: str
    #: a directory for this target's server homes and logs
    workdir: Path

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """A server environment on this store, with its own home (pid file, logs) at ``home``."""
        home.mkdir(parents=True, exist_ok=True)
        return server_env(
            home, CONSTRUCT_ORCHESTRATION_STORE=self.url, CONSTRUCT_STORE_FALLBACK="false", **extra
        )

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[RunStore]:
        """The store, opened in the test process (to read what the servers recorded)."""
        store = await open_store(self.url, home=self.workdir)
        try:
            yield store
        finally:
            await store.close()

    async def runs(self) -> list[tuple[RunHead, list[Fact]]]:
        """Every run in the store with its facts, oldest first."""
        async with self.opened() as store:
            heads: list[RunHead] = []
            cursor: str | None = None
            while True:
                page = await store.list_runs(limit=500, cursor=cursor)
                heads += page.runs
                cursor = page.next_cursor
                if cursor is None:
                    break
            heads.reverse()
            return [(head, await store.read_facts(head.run_id)) for head in heads]


@asynccontextmanager
async def store_target(backend: str, workdir: Path) -> AsyncIterator[StoreTarget]:
    """A fresh, empty store of ``backend`` (see the module docstring)."""
    await anyio.Path(workdir).mkdir(parents=True, exist_ok=True)
    if backend == "filesystem":
        yield StoreTarget(backend, f"file://{workdir / 'store'}", workdir)
    elif backend == "sqlite":
        yield StoreTarget(backend, f"sqlite:///{workdir / 'construct.db'}", workdir)
    elif backend == "postgres":
        dsn = await postgres_dsn()
        async with postgres_schema(dsn) as schema:
            url = schema_url(dsn, schema)
            await migrate(url, home=workdir)
            yield StoreTarget(backend, url, workdir)
    else:  # pragma: no cover - the parametrization lists the backends
        raise ValueError(backend)

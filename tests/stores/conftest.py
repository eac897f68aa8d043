"""The ``store`` fixture: every conformance test runs once per adapter in :data:`ADAPTERS`.

Adding an adapter is one line in :data:`ADAPTERS`: an async context manager that takes the test's
``tmp_path`` and yields an open, empty store (and closes it afterwards). A factory whose backend is
not available (no ``CONSTRUCT_TEST_POSTGRES_DSN``, say) calls ``pytest.skip`` before yielding.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from orchestration.store import RunStore
from stores.filesystem import FilesystemStore
from stores.memory import MemoryStore
from tests.stores.sql_adapters import make_postgres, make_sqlite

StoreFactory = Callable[[Path], AbstractAsyncContextManager[RunStore]]


@asynccontextmanager
async def make_memory(tmp_path: Path) -> AsyncIterator[RunStore]:
    store = MemoryStore()
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def make_filesystem(tmp_path: Path) -> AsyncIterator[RunStore]:
    store = FilesystemStore(tmp_path / "store")
    try:
        yield store
    finally:
        await store.close()


ADAPTERS: dict[str, StoreFactory] = {
    "memory": make_memory,
    "filesystem": make_filesystem,
    "sqlite": make_sqlite,
    "postgres": make_postgres,
}


@pytest.fixture(params=list(ADAPTERS), ids=list(ADAPTERS))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RunStore]:
    factory = ADAPTERS[request.param]
    async with factory(tmp_path) as opened:
        yield opened

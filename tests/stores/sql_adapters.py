"""Store factories for the SQL adapters, used by the conformance table in ``conftest.py`` and by the
adapter-specific tests.

PostgreSQL runs against ``CONSTRUCT_TEST_POSTGRES_DSN``. Without it (or with a server that does not
answer) the postgres tests skip locally; with ``CI=true`` they fail instead, because a CI run that
silently skipped every postgres test would prove nothing. Each store gets a fresh schema, migrated
from empty and dropped afterwards, so tests never see each other's runs and leave nothing behind.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.core.models import RECORD_FORMAT
from orchestration.store import RunStore
from stores import migrate, parse_store_spec
from stores.postgres import PostgresStore
from stores.sqlite import SqliteStore

POSTGRES_DSN_ENV = "CONSTRUCT_TEST_POSTGRES_DSN"


@asynccontextmanager
async def make_sqlite(tmp_path: Path) -> AsyncIterator[RunStore]:
    store = await SqliteStore.open(tmp_path / "construct.db")
    try:
        yield store
    finally:
        await store.close()


def _unavailable(reason: str) -> None:
    """Skip locally; fail in CI (``CI=true``), where the postgres tests must run."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but the postgres tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


async def postgres_dsn() -> str:
    """The test server's DSN, after checking that it answers (skip or fail otherwise)."""
    dsn = os.environ.get(POSTGRES_DSN_ENV, "").strip()
    if not dsn:
        _unavailable(f"{POSTGRES_DSN_ENV} is not set")
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        _unavailable(f"{POSTGRES_DSN_ENV} does not answer: {type(exc).__name__}: {exc}")
    await conn.close()
    return dsn


def new_schema_name() -> str:
    return f"construct_test_{os.getpid()}_{secrets.token_hex(4)}"


@asynccontextmanager
async def postgres_schema(dsn: str) -> AsyncIterator[str]:
    """A fresh schema name; the schema (created by whoever migrates it) is dropped on exit."""
    schema = new_schema_name()
    try:
        yield schema
    finally:
        conn = await asyncpg.connect(dsn, timeout=5)
        try:
            # The name comes from new_schema_name: a plain identifier, safe to inline.
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


def schema_url(dsn: str, schema: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"


@asynccontextmanager
async def make_postgres(tmp_path: Path) -> AsyncIterator[RunStore]:
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        url = schema_url(dsn, schema)
        await migrate(url, home=tmp_path)
        spec = parse_store_spec(url, home=tmp_path)
        assert spec.dsn is not None
        store = await PostgresStore.open(spec.dsn, schema=spec.schema)
        try:
            yield store
        finally:
            await store.close()


@dataclass
class PostgresDatabase:
    """A migrated schema of its own, opened as often as a test needs (each open a new pool)."""

    dsn: str
    schema: str

    async def open(self, reads_format: int = RECORD_FORMAT) -> PostgresStore:
        return await PostgresStore.open(self.dsn, schema=self.schema, reads_format=reads_format)


@asynccontextmanager
async def migrated_postgres(home: Path) -> AsyncIterator[PostgresDatabase]:
    """A fresh schema migrated from empty, dropped afterwards."""
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        await migrate(schema_url(dsn, schema), home=home)
        yield PostgresDatabase(parse_store_spec(dsn, home=home).dsn or dsn, schema)

"""Which store is opened: spec parsing, the filesystem fallback with its warning, the error when
fallback is off, password redaction, and lazy driver imports. Which spec the settings choose
(explicit > config > CONSTRUCT_ORCHESTRATION_STORE > CONSTRUCT_DEPLOYMENT_MODE) is
tests/unit/server/test_store_choice.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.errors import ConfigError, StoreUnavailable
from server.settings.config import load_settings
from server.settings.storage import open_run_store
from stores import (
    OpenedStore,
    open_configured_store,
    open_store,
    parse_store_spec,
    redact_url,
)
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url

SECRET = "s3cr3t-pa55"
#: What the settings give for CONSTRUCT_DEPLOYMENT_MODE=team and no store (see test_store_choice.py).
TEAM: dict[str, Any] = {"spec": "postgres", "source": "CONSTRUCT_DEPLOYMENT_MODE"}


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def unreachable_url() -> str:
    return f"postgresql://construct:{SECRET}@127.0.0.1:{closed_port()}/construct"


# ----------------------------------------------------------------------------------- spec parsing


def test_names_and_urls(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cases = {
        "memory": ("memory", None),
        "filesystem": ("filesystem", home),
        "sqlite": ("sqlite", home / "construct.db"),
        "sqlite:///relative.db": ("sqlite", home / "relative.db"),
        "sqlite:///sub/dir/x.db": ("sqlite", home / "sub/dir/x.db"),
        "sqlite:////abs/path/x.db": ("sqlite", Path("/abs/path/x.db")),
        "SQLite:////abs/y.db": ("sqlite", Path("/abs/y.db")),
        "file:///srv/construct": ("filesystem", Path("/srv/construct")),
        "file://localhost/srv/c": ("filesystem", Path("/srv/c")),
    }
    for spec, (backend, path) in cases.items():
        parsed = parse_store_spec(spec, home=home)
        assert (parsed.backend, parsed.path) == (backend, path), spec


def test_postgres_urls_and_the_schema_parameter(tmp_path: Path) -> None:
    parsed = parse_store_spec(
        f"postgres://u:{SECRET}@db:5433/app?schema=team_a&sslmode=disable", home=tmp_path
    )
    assert parsed.backend == "postgres"
    assert parsed.schema == "team_a"
    assert parsed.dsn == f"postgresql://u:{SECRET}@db:5433/app?sslmode=disable"
    assert SECRET not in parsed.display and SECRET not in repr(parsed)
    assert parse_store_spec("postgresql://db/app", home=tmp_path).schema == "public"


def test_the_postgres_name_takes_the_database_url_it_is_given(tmp_path: Path) -> None:
    # Which URL (CONSTRUCT_DATABASE_URL over DATABASE_URL) is the settings' choice: test_store_choice.py.
    assert parse_store_spec("postgres", home=tmp_path, database_url="postgresql://a/one").dsn == (
        "postgresql://a/one"
    )
    with pytest.raises(StoreUnavailable, match="CONSTRUCT_DATABASE_URL"):
        parse_store_spec("postgres", home=tmp_path)


@pytest.mark.parametrize(
    "spec",
    [
        "mysql://db/app",
        "redis",
        "sqlite://relative.db",
        "sqlite:///:memory:",
        "sqlite:///",
        "file://otherhost/dir",
        "postgresql://db/app?schema=Robert');DROP",
        f"postgresql://db/app?schema={'x' * 60}",
    ],
)
def test_a_bad_spec_is_a_config_error(tmp_path: Path, spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_store_spec(spec, home=tmp_path)


def test_a_bad_spec_never_shows_its_password(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_store_spec(f"postgresql://u:{SECRET}@db/app?schema=Bad-Name", home=tmp_path)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (f"postgresql://user:{SECRET}@host:5432/db", "postgresql://user:***@host:5432/db"),
        (f"postgres://user:{SECRET}@h1,h2/db", "postgres://user:***@h1,h2/db"),
        (
            f"postgresql://host/db?password={SECRET}&sslmode=require",
            "postgresql://host/db?password=***&sslmode=require",
        ),
        ("postgresql://user@host/db", "postgresql://user@host/db"),
        ("sqlite:////var/x.db", "sqlite:////var/x.db"),
        ("filesystem", "filesystem"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


# ------------------------------------------------------------------------------ opening & fallback


async def test_an_unreachable_postgres_falls_back_to_filesystem_with_a_warning(tmp_path: Path) -> None:
    url = unreachable_url()
    opened = await open_configured_store(home=tmp_path, spec=url, source="--store", connect_timeout=2)
    try:
        assert opened.store.name == "filesystem"
        assert opened.fell_back
        assert opened.source == "--store"
        assert SECRET not in opened.requested
        [warning] = opened.warnings
        assert SECRET not in warning
        assert "construct:***@127.0.0.1" in warning
        assert "using the filesystem store" in warning
    finally:
        await opened.store.close()


async def test_with_fallback_off_an_unreachable_postgres_is_an_error_naming_the_cause(tmp_path: Path) -> None:
    url = unreachable_url()
    with pytest.raises(StoreUnavailable) as caught:
        await open_configured_store(
            home=tmp_path, spec=url, source="config", fallback=False, connect_timeout=2
        )
    message = str(caught.value)
    assert SECRET not in message
    assert "from config" in message
    assert "127.0.0.1" in message
    assert "refused" in message.lower() or "connect" in message.lower()
    assert not (tmp_path / "runs").exists()
    assert "store_fallback" not in message  # the stores know no settings: their caller says it


async def test_the_server_says_the_fallback_setting_was_off(tmp_path: Path) -> None:
    url = unreachable_url()
    off = load_settings(
        env={
            "CONSTRUCT_HOME": str(tmp_path),
            "CONSTRUCT_ORCHESTRATION_STORE": url,
            "CONSTRUCT_STORE_FALLBACK": "false",
        }
    )
    with pytest.raises(StoreUnavailable, match=r"; store_fallback is off$"):
        await open_run_store(off)


async def test_team_mode_without_a_database_url_falls_back(tmp_path: Path) -> None:
    opened = await open_configured_store(home=tmp_path, **TEAM)
    try:
        assert opened.store.name == "filesystem"
        assert opened.source == "CONSTRUCT_DEPLOYMENT_MODE"
        assert "CONSTRUCT_DATABASE_URL" in opened.warnings[0]
    finally:
        await opened.store.close()
    with pytest.raises(StoreUnavailable, match="CONSTRUCT_DATABASE_URL"):
        await open_configured_store(home=tmp_path, **TEAM, fallback=False)


async def test_a_bad_spec_is_raised_even_with_fallback_on(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        await open_configured_store(home=tmp_path, spec="mongodb://x", source="--store")


async def test_the_default_opens_the_filesystem_store_under_home(tmp_path: Path) -> None:
    opened = await open_configured_store(home=tmp_path)
    try:
        assert (opened.store.name, opened.source, opened.warnings, opened.fell_back) == (
            "filesystem",
            "default",
            [],
            False,
        )
    finally:
        await opened.store.close()


async def test_sqlite_by_name_opens_home_construct_db(tmp_path: Path) -> None:
    opened = await open_configured_store(
        home=tmp_path, spec="sqlite", source="CONSTRUCT_ORCHESTRATION_STORE", fallback=False
    )
    try:
        assert opened.store.name == "sqlite"
        assert (tmp_path / "construct.db").exists()
    finally:
        await opened.store.close()


async def test_a_postgres_schema_that_is_behind_falls_back_with_the_migrate_hint(tmp_path: Path) -> None:
    from stores import migrate
    from stores._sql import migrations

    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        url = schema_url(dsn, schema)
        await migrate(url, home=tmp_path, migrations=migrations("postgres")[:1])
        opened = await open_configured_store(home=tmp_path, spec=url, source="CONSTRUCT_ORCHESTRATION_STORE")
        try:
            assert opened.fell_back
            assert "run `construct-mcp migrate`" in opened.warnings[0]
        finally:
            await opened.store.close()


async def test_an_empty_postgres_schema_is_initialized_at_first_open_and_said(tmp_path: Path) -> None:
    """Nothing can be lost in an empty schema: the first open creates it (issue 26); two opens
    racing on it both succeed; later opens say nothing was created."""
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        url = schema_url(dsn, schema)
        opened: list[OpenedStore] = []

        async def one() -> None:
            opened.append(
                await open_configured_store(home=tmp_path, spec=url, source="--store", fallback=False)
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
        assert sorted(o.created for o in opened) == [False, True]
        again = await open_configured_store(home=tmp_path, spec=url, source="--store", fallback=False)
        try:
            assert (again.store.name, again.created, again.warnings) == ("postgres", False, [])
        finally:
            for o in (*opened, again):
                await o.store.close()


async def test_a_postgres_schema_with_other_tables_is_not_initialized(tmp_path: Path) -> None:
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'CREATE SCHEMA "{schema}"; CREATE TABLE "{schema}".theirs (id int)')
        finally:
            await conn.close()
        url = schema_url(dsn, schema)
        with pytest.raises(StoreUnavailable, match="run `construct-mcp migrate`"):
            await open_configured_store(home=tmp_path, spec=url, source="--store", fallback=False)


async def test_filesystem_and_sqlite_stores_say_when_they_were_created(tmp_path: Path) -> None:
    for spec in ("filesystem", "sqlite"):
        for created in (True, False):
            opened = await open_configured_store(home=tmp_path, spec=spec, fallback=False)
            # The filesystem store lays out its directory at its first use (here: a listing).
            await opened.store.list_runs()
            await opened.store.close()
            assert opened.created is created, (spec, created)
    memory = await open_configured_store(home=tmp_path, spec="memory")
    assert memory.created is False


async def test_a_reachable_migrated_postgres_is_opened(tmp_path: Path) -> None:
    from stores import migrate

    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        url = schema_url(dsn, schema)
        await migrate(url, home=tmp_path)
        opened = await open_configured_store(home=tmp_path, spec=url, source="--store", fallback=False)
        try:
            assert (opened.store.name, opened.warnings) == ("postgres", [])
        finally:
            await opened.store.close()


async def test_open_store_by_name(tmp_path: Path) -> None:
    store = await open_store("memory", home=tmp_path)
    assert store.name == "memory"
    await store.close()


def test_drivers_are_imported_only_for_their_adapter(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from pathlib import Path
        import stores
        from stores import open_store

        async def main():
            for name in ("memory", "filesystem"):
                store = await open_store(name, home=Path({str(tmp_path)!r}))
                await store.close()
            assert "aiosqlite" not in sys.modules, "aiosqlite"
            assert "asyncpg" not in sys.modules, "asyncpg"
            store = await open_store("sqlite", home=Path({str(tmp_path)!r}))
            await store.close()
            assert "aiosqlite" in sys.modules
            assert "asyncpg" not in sys.modules, "asyncpg after sqlite"

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr


async def test_the_database_url_of_the_postgres_name_is_redacted_too(tmp_path: Path) -> None:
    given: dict[str, Any] = {**TEAM, "database_url": unreachable_url()}
    opened = await open_configured_store(home=tmp_path, **given, connect_timeout=2)
    try:
        assert opened.fell_back
        assert SECRET not in opened.warnings[0] and SECRET not in opened.requested
        assert "construct:***@127.0.0.1" in opened.warnings[0]
    finally:
        await opened.store.close()
    with pytest.raises(StoreUnavailable) as caught:
        await open_configured_store(home=tmp_path, **given, fallback=False, connect_timeout=2)
    assert SECRET not in str(caught.value)

"""Migrations: from empty to head, re-running is a no-op, ``--check`` on an older schema fails with the
sentence that says what to do, a failed migration leaves nothing behind, and adapters refuse a schema
that is not at the packaged head. Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import anyio
import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.errors import StoreError, StoreUnavailable
from orchestration.store import ClaimsRunnable, RunStore
from stores import SchemaOutOfDate, SchemaTooNew, migrate, open_store, parse_store_spec
from stores._sql import Migration, head_version, migrations, parse_queries, queries, split_sqlite_script
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url

EXTRA = Migration(2, "0002_extra.sql", "CREATE TABLE extra (id integer PRIMARY KEY);\n")
BROKEN = Migration(
    2, "0002_broken.sql", "CREATE TABLE half_done (id integer);\nSELECT * FROM no_such_table;\n"
)


@dataclass
class Target:
    """A store URL on an empty database, and a way to look inside it."""

    dialect: str
    url: str
    home: Path

    async def tables(self) -> set[str]:
        spec = parse_store_spec(self.url, home=self.home)
        if self.dialect == "sqlite":
            assert spec.path is not None
            if not spec.path.exists():
                return set()
            with sqlite3.connect(spec.path) as conn:
                rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
            conn.close()
            return {r[0] for r in rows}
        conn = await asyncpg.connect(spec.dsn)
        try:
            rows = await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", spec.schema
            )
        finally:
            await conn.close()
        return {r[0] for r in rows}

    async def execute(self, sql: str) -> None:
        spec = parse_store_spec(self.url, home=self.home)
        if self.dialect == "sqlite":
            assert spec.path is not None
            with sqlite3.connect(spec.path) as conn:
                conn.execute(sql)
            conn.close()
            return
        conn = await asyncpg.connect(spec.dsn, server_settings={"search_path": spec.schema})
        try:
            await conn.execute(sql)
        finally:
            await conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    if request.param == "sqlite":
        yield Target("sqlite", "sqlite:///construct.db", tmp_path)
        return
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        yield Target("postgres", schema_url(dsn, schema), tmp_path)


async def test_from_empty_to_head(target: Target) -> None:
    report = await migrate(target.url, home=target.home)
    head = head_version(target.dialect)  # type: ignore[arg-type]
    assert (report.from_version, report.to_version, report.head_version) == (0, head, head)
    assert report.applied == tuple(m.name for m in migrations(target.dialect))
    assert {"runs", "facts", "leases", "schema_migrations"} <= await target.tables()
    store = await open_store(target.url, home=target.home)
    await store.close()


async def test_migrating_twice_is_a_no_op(target: Target) -> None:
    await migrate(target.url, home=target.home)
    again = await migrate(target.url, home=target.home)
    assert again.applied == ()
    assert again.from_version == again.to_version == again.head_version
    assert "nothing to do" in again.summary()
    checked = await migrate(target.url, check_only=True, home=target.home)
    assert checked.up_to_date


async def test_concurrent_migrators_apply_each_migration_once(target: Target) -> None:
    reports = []

    async def run() -> None:
        reports.append(await migrate(target.url, home=target.home))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(run)
    applied = [name for report in reports for name in report.applied]
    assert sorted(applied) == sorted(m.name for m in migrations(target.dialect))


async def test_check_on_an_empty_database_fails_and_creates_nothing(target: Target) -> None:
    with pytest.raises(SchemaOutOfDate) as caught:
        await migrate(target.url, check_only=True, home=target.home)
    head = head_version(target.dialect)  # type: ignore[arg-type]
    assert f"schema is at version 0, head is {head}, run `construct-mcp migrate`" in str(caught.value)
    assert await target.tables() == set()


async def test_check_on_an_older_schema_names_both_versions_and_the_command(target: Target) -> None:
    first = migrations(target.dialect)[0]
    await migrate(target.url, home=target.home, migrations=[first])
    with pytest.raises(SchemaOutOfDate) as caught:
        await migrate(target.url, check_only=True, home=target.home, migrations=[first, EXTRA])
    message = str(caught.value)
    assert "schema is at version 1, head is 2, run `construct-mcp migrate`" in message
    assert caught.value.code == "schema_out_of_date"
    assert isinstance(caught.value, StoreUnavailable)
    assert "extra" not in await target.tables()

    report = await migrate(target.url, home=target.home, migrations=[first, EXTRA])
    assert report.applied == ("0002_extra.sql",)
    assert (report.from_version, report.to_version) == (1, 2)
    assert "extra" in await target.tables()


async def test_a_failing_migration_is_rolled_back_whole(target: Target) -> None:
    first = migrations(target.dialect)[0]
    await migrate(target.url, home=target.home, migrations=[first])
    with pytest.raises(StoreError):
        await migrate(target.url, home=target.home, migrations=[first, BROKEN])
    assert "half_done" not in await target.tables()
    report = await migrate(target.url, check_only=True, home=target.home, migrations=[first])
    assert report.to_version == 1


async def test_the_adapter_refuses_a_schema_that_is_behind(target: Target) -> None:
    await migrate(target.url, home=target.home)
    await target.execute("DELETE FROM schema_migrations")
    if target.dialect == "sqlite":
        # The sqlite adapter migrates its own file at open; asked not to, it must refuse.
        from stores.sqlite import SqliteStore

        spec = parse_store_spec(target.url, home=target.home)
        assert spec.path is not None
        with pytest.raises(SchemaOutOfDate, match=r"run `construct-mcp migrate`"):
            await SqliteStore.open(spec.path, auto_migrate=False)
        return
    head = head_version(target.dialect)  # type: ignore[arg-type]
    with pytest.raises(
        SchemaOutOfDate, match=rf"schema is at version 0, head is {head}, run `construct-mcp migrate`"
    ):
        await open_store(target.url, home=target.home)


async def test_the_adapter_refuses_a_schema_from_a_newer_release(target: Target) -> None:
    await migrate(target.url, home=target.home)
    await target.execute(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'x', '2030-01-01')"
    )
    with pytest.raises(SchemaTooNew, match="upgrade construct-mcp"):
        store: RunStore = await open_store(target.url, home=target.home)
        await store.close()
    with pytest.raises(SchemaTooNew):
        await migrate(target.url, home=target.home)


@pytest.mark.parametrize("target", ["postgres"], indirect=True)
async def test_postgres_fact_bodies_written_as_jsonb_read_back_after_the_text_migration(
    target: Target,
) -> None:
    """Migration 0008 (facts as text): the facts a version-7 store wrote (JSONB bodies) read back
    the same once migrated; the bodies become text, the foreign key to
    runs goes, and the run goes on appending."""
    from tests.stores.builders import complete_task, new_run, run_id, start_attempt

    await migrate(target.url, home=target.home)
    head, facts = new_run(run_id(8))
    store: RunStore = await open_store(target.url, home=target.home)
    try:
        await store.create(head, facts)
        write = start_attempt(head)
        await store.append(run_id(8), write.expected_version, write.facts, write.head)
        before = await store.read_facts(run_id(8))
    finally:
        await store.close()
    # Back to how version 7 kept them, then the migration.
    await target.execute(
        "ALTER TABLE facts ALTER COLUMN body TYPE jsonb USING body::jsonb;"
        "ALTER TABLE facts ADD CONSTRAINT facts_run_id_fkey FOREIGN KEY (run_id) REFERENCES runs (run_id);"
        "ALTER TABLE runs DROP COLUMN lease_token;"
        "ALTER TABLE runs ALTER COLUMN head TYPE jsonb USING head::jsonb;"
        "DELETE FROM schema_migrations WHERE version >= 8"
    )
    report = await migrate(target.url, home=target.home)
    assert report.applied == (
        "0008_facts_as_text.sql",
        "0009_lease_token_on_runs.sql",
        "0010_head_as_text.sql",
        "0011_claim_candidates.sql",
        "0012_keyed_create_in_one_statement.sql",
        "0013_chain_versions.sql",
    )
    spec = parse_store_spec(target.url, home=target.home)
    conn = await asyncpg.connect(spec.dsn, server_settings={"search_path": spec.schema})
    try:
        kind = await conn.fetchval(
            "SELECT data_type FROM information_schema.columns "
            "WHERE table_schema = $1 AND table_name = 'facts' AND column_name = 'body'",
            spec.schema,
        )
        assert kind == "text"
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND conrelid = 'facts'::regclass"
            )
            == 0
        )
    finally:
        await conn.close()
    store = await open_store(target.url, home=target.home)
    try:
        assert await store.read_facts(run_id(8)) == before
        assert await store.read_fact(run_id(8), before[-1].seq) == before[-1]
        done = complete_task(write.head)
        await store.append(run_id(8), done.expected_version, done.facts, done.head)
        assert await store.read_facts(run_id(8)) == [*before, *done.facts]
    finally:
        await store.close()


@pytest.mark.parametrize("target", ["postgres"], indirect=True)
async def test_postgres_leases_held_before_the_token_moved_to_the_run_row_still_fence(
    target: Target,
) -> None:
    """Migration 0009 (the lease token on the run row): a lease claimed by version 8 keeps its token
    through the migration; its holder appends on, a stale holder is refused, and a release and a
    new claim go on fencing."""
    from orchestration.errors import LeaseLost
    from tests.stores.builders import BASE_TIME, complete_task, new_run, run_id, start_attempt

    await migrate(target.url, home=target.home)
    head, facts = new_run(run_id(9))
    store: RunStore = await open_store(target.url, home=target.home)
    try:
        await store.create(head, facts)
        stale = await store.claim_lease(run_id(9), "worker-a", 10, BASE_TIME)
        held = await store.claim_lease(run_id(9), "worker-b", 10, BASE_TIME + timedelta(seconds=11))
        assert stale is not None and held is not None
    finally:
        await store.close()
    # Back to how version 8 kept leases (no token on the run row), then the migration.
    await target.execute(
        "ALTER TABLE runs DROP COLUMN lease_token;"
        "ALTER TABLE runs ALTER COLUMN head TYPE jsonb USING head::jsonb;"
        "DELETE FROM schema_migrations WHERE version >= 9"
    )
    report = await migrate(target.url, home=target.home)
    assert report.applied == (
        "0009_lease_token_on_runs.sql",
        "0010_head_as_text.sql",
        "0011_claim_candidates.sql",
        "0012_keyed_create_in_one_statement.sql",
        "0013_chain_versions.sql",
    )
    store = await open_store(target.url, home=target.home)
    try:
        write = start_attempt(head)
        with pytest.raises(LeaseLost):
            await store.append(run_id(9), write.expected_version, write.facts, write.head, lease=stale)
        await store.append(run_id(9), write.expected_version, write.facts, write.head, lease=held)
        await store.release_lease(held)
        done = complete_task(write.head)
        with pytest.raises(LeaseLost):
            await store.append(run_id(9), done.expected_version, done.facts, done.head, lease=held)
        again = await store.claim_lease(run_id(9), "worker-a", 10, BASE_TIME + timedelta(seconds=12))
        assert again is not None
        await store.append(run_id(9), done.expected_version, done.facts, done.head, lease=again)
        assert (await store.load(run_id(9))).version == done.head.version
    finally:
        await store.close()


@pytest.mark.parametrize("target", ["postgres"], indirect=True)
async def test_postgres_heads_written_as_jsonb_read_back_after_the_text_migration(target: Target) -> None:
    """Migration 0010 (heads as text): heads a version-9 store wrote (JSONB, with U+0000 escaped)
    read back the same once migrated, with their chain snapshot put back in; the column becomes
    text and keeps its compression; the run goes on appending and is found by its key."""
    from tests.stores.builders import complete_task, new_run, run_id, start_attempt

    await migrate(target.url, home=target.home)
    head, facts = new_run(run_id(10), key="key-10", request="a request with \x00 and \ue000 in it")
    store: RunStore = await open_store(target.url, home=target.home)
    try:
        await store.create(head, facts)
        write = start_attempt(head)
        await store.append(run_id(10), write.expected_version, write.facts, write.head)
        before = await store.load(run_id(10))
    finally:
        await store.close()
    assert before == write.head
    spec = parse_store_spec(target.url, home=target.home)
    column = (
        "SELECT format_type(atttypid, atttypmod), attcompression::text FROM pg_attribute "
        "WHERE attrelid = 'runs'::regclass AND attname = 'head'"
    )
    conn = await asyncpg.connect(spec.dsn, server_settings={"search_path": spec.schema})
    try:
        _, compression = await conn.fetchrow(column)
    finally:
        await conn.close()
    await target.execute(
        "ALTER TABLE runs ALTER COLUMN head TYPE jsonb USING head::jsonb;"
        "DELETE FROM schema_migrations WHERE version >= 10"
    )
    report = await migrate(target.url, home=target.home)
    assert report.applied == (
        "0010_head_as_text.sql",
        "0011_claim_candidates.sql",
        "0012_keyed_create_in_one_statement.sql",
        "0013_chain_versions.sql",
    )
    conn = await asyncpg.connect(spec.dsn, server_settings={"search_path": spec.schema})
    try:
        assert tuple(await conn.fetchrow(column)) == ("text", compression)
    finally:
        await conn.close()
    store = await open_store(target.url, home=target.home)
    try:
        assert await store.load(run_id(10)) == before
        again = await store.create(head, facts)
        assert not again.created and again.head == before
        done = complete_task(before)
        await store.append(run_id(10), done.expected_version, done.facts, done.head)
        assert await store.load(run_id(10)) == done.head
    finally:
        await store.close()


@pytest.mark.parametrize("target", ["postgres"], indirect=True)
async def test_postgres_runs_in_flight_are_claimed_as_before_after_the_candidate_indexes(
    target: Target,
) -> None:
    """Migration 0011 (claims read only candidates): a version-10 store with runs in flight — two
    leased live, one whose holder died, one free — is refused until migrated, then upgrades to the
    two indexes, and a claim hands out exactly the expired and the free run, through them."""
    from tests.stores.builders import BASE_TIME, new_run, run_id

    await migrate(target.url, home=target.home)
    store: RunStore = await open_store(target.url, home=target.home)
    try:
        assert isinstance(store, ClaimsRunnable)
        for n in range(1, 4):
            await store.create(*new_run(run_id(n), at=BASE_TIME + timedelta(seconds=n)))
        assert len(await store.claim_runnable("dead", 1, BASE_TIME, 1)) == 1
        assert len(await store.claim_runnable("live", 3600, BASE_TIME, 10)) == 2
        await store.create(*new_run(run_id(4), at=BASE_TIME + timedelta(seconds=4)))
    finally:
        await store.close()
    # Back to version 10, then the migration.
    await target.execute(
        "DROP INDEX runs_claimable; DROP INDEX leases_expires_at;"
        "DELETE FROM schema_migrations WHERE version >= 11"
    )
    with pytest.raises(SchemaOutOfDate):
        await open_store(target.url, home=target.home)
    report = await migrate(target.url, home=target.home)
    assert (report.from_version, report.applied) == (
        10,
        (
            "0011_claim_candidates.sql",
            "0012_keyed_create_in_one_statement.sql",
            "0013_chain_versions.sql",
        ),
    )
    spec = parse_store_spec(target.url, home=target.home)
    conn = await asyncpg.connect(spec.dsn, server_settings={"search_path": spec.schema})
    try:
        names = {
            r[0]
            for r in await conn.fetch("SELECT indexname FROM pg_indexes WHERE schemaname = $1", spec.schema)
        }
    finally:
        await conn.close()
    assert {"runs_claimable", "leases_expires_at"} <= names
    store = await open_store(target.url, home=target.home)
    try:
        assert isinstance(store, ClaimsRunnable)
        claimed = await store.claim_runnable("me", 30, BASE_TIME + timedelta(seconds=10), 10)
        assert [lease.run_id for lease in claimed] == [run_id(1), run_id(4)]
    finally:
        await store.close()


async def test_stores_without_a_schema_have_nothing_to_migrate(tmp_path: Path) -> None:
    for url in ("memory", "filesystem", f"file://{tmp_path}"):
        report = await migrate(url, home=tmp_path)
        assert report.head_version == 0 and report.applied == ()
        assert "no schema" in report.summary()


# ------------------------------------------------------------------------------ the SQL files


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_packaged_sql_is_found_and_numbered(dialect: str) -> None:
    found = migrations(dialect)
    assert [m.version for m in found] == list(range(1, len(found) + 1))
    assert found[0].name == "0001_initial.sql"
    named = queries(dialect)
    for name in ("load_head", "insert_run", "claim_lease", "claim_runnable", "list_runs"):
        assert named[name].strip(), name


def test_query_files_are_split_by_name() -> None:
    text = "-- header\n-- name: one\nSELECT 1\n\n-- name: two\n-- why\nSELECT 2;\n"
    assert parse_queries(text) == {"one": "SELECT 1", "two": "-- why\nSELECT 2;"}
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")


def test_sqlite_scripts_split_on_statements_not_on_every_semicolon() -> None:
    script = (
        "-- a comment; with a semicolon\n"
        "CREATE TABLE t (x TEXT DEFAULT 'a;b');\n"
        "CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = 'c;d'; SELECT 1; END;\n"
        "-- trailing comment\n"
    )
    statements = split_sqlite_script(script)
    assert len(statements) == 2
    assert statements[0].endswith("DEFAULT 'a;b');")
    assert re.search(r"SELECT 1; END;$", statements[1])

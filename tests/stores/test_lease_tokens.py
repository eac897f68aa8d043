"""Lease tokens in the SQL stores: the migration that adds them gives the leases held at upgrade
time the empty token, which no claim hands out, so such a lease keeps its run for its owner until
it expires or is claimed again — and fences every fenced append meanwhile. (The fence itself is
checked on every adapter by the conformance suite.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from orchestration.errors import LeaseLost
from orchestration.store import Lease, RunStore
from stores import migrate, open_store
from stores._sql import migrations
from tests.stores.builders import BASE_TIME, new_run, run_id, start_attempt
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url
from tests.stores.test_wake_at import Target, _time_value


@pytest.fixture(params=["sqlite", "postgres"])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    if request.param == "sqlite":
        yield Target("sqlite", "sqlite:///construct.db", tmp_path)
        return
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        yield Target("postgres", schema_url(dsn, schema), tmp_path)


async def test_a_lease_held_at_the_upgrade_fences_until_claimed_again(target: Target) -> None:
    found = migrations(target.dialect)
    tokens = next(m for m in found if m.name.endswith("_lease_token.sql"))
    await migrate(target.url, home=target.home, migrations=[m for m in found if m.version < tokens.version])
    # A run and a lease as the schema before tokens held them.
    head, facts = new_run(run_id(1))
    created = _time_value(target, head.created_at)
    cast = "::jsonb" if target.dialect == "postgres" else ""
    await target.execute(
        "INSERT INTO runs (run_id, version, status, created_at, updated_at, head) "
        f"VALUES ($1, $2, $3, $4, $5, $6{cast})",
        head.run_id,
        head.version,
        head.status.value,
        created,
        created,
        head.model_dump_json(),
    )
    await target.execute(
        f"INSERT INTO facts (run_id, seq, type, body) VALUES ($1, 1, $2, $3{cast})",
        head.run_id,
        facts[0].type,
        facts[0].model_dump_json(),
    )
    expires = BASE_TIME + timedelta(seconds=30)
    await target.execute(
        "INSERT INTO leases (run_id, owner, expires_at) VALUES ($1, $2, $3)",
        head.run_id,
        "worker-a",
        _time_value(target, expires),
    )
    report = await migrate(target.url, home=target.home)
    assert tokens.name in report.applied

    store: RunStore = await open_store(target.url, home=target.home)
    try:
        assert await store.claim_lease(run_id(1), "worker-b", 30, BASE_TIME + timedelta(seconds=10)) is None
        write = start_attempt(head)
        with pytest.raises(LeaseLost):
            await store.append(
                run_id(1),
                write.expected_version,
                write.facts,
                write.head,
                lease=Lease(run_id(1), "worker-a", expires, "0" * 32),
            )
        # Its owner claims the run again (a restarted server): a real token, which fences in.
        again = await store.claim_lease(run_id(1), "worker-a", 30, BASE_TIME + timedelta(seconds=10))
        assert again is not None and again.token
        stored = await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=again)
        assert stored == write.head
    finally:
        await store.close()

"""Claims read only their candidates (issue 24): with thousands of runs in flight, all leased, a
batch claim finds the free and the expired runs without probing the lease of every active run
(PostgreSQL: through the indexes of migration 0011, shown with EXPLAIN ANALYZE), and still never
hands out a run whose lease is live."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.core.models import RECORD_FORMAT
from orchestration.store import ClaimsRunnable, RunStore
from stores import migrate, parse_store_spec
from stores._postgres_rows import utc
from stores._sql import queries
from stores.postgres import PostgresStore
from tests.stores.builders import BASE_TIME, new_run, run_id
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url

#: runs in flight, each leased by a live server
LIVE = 2000
#: runs whose holder died (leases expired), the oldest ones
DEAD = 3
#: runs nobody holds, the newest ones
FREE = 5


async def _plant(store: RunStore) -> tuple[list[str], list[str]]:
    """DEAD + LIVE leased runs and FREE free ones; the ids of the expired and of the free runs."""
    assert isinstance(store, ClaimsRunnable)
    for n in range(1, DEAD + LIVE + FREE + 1):
        if n == DEAD + LIVE + 1:
            # Everything created so far gets a lease: DEAD of them short ones, the rest live ones.
            dead = await store.claim_runnable("dead-server", 1, BASE_TIME, DEAD)
            live = await store.claim_runnable("live-server", 3600, BASE_TIME, LIVE)
            assert len(dead) == DEAD and len(live) == LIVE
        head, facts = new_run(run_id(n), at=BASE_TIME + timedelta(milliseconds=n))
        await store.create(head, facts)
    return [run_id(n) for n in range(1, DEAD + 1)], [
        run_id(n) for n in range(DEAD + LIVE + 1, DEAD + LIVE + FREE + 1)
    ]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_claim_returns_the_expired_and_the_free_runs_and_never_a_live_lease(
    backend: str, tmp_path: Path
) -> None:
    from tests.stores.sql_adapters import make_postgres, make_sqlite

    factory = make_sqlite if backend == "sqlite" else make_postgres
    async with factory(tmp_path) as store:
        expired, free = await _plant(store)
        assert isinstance(store, ClaimsRunnable)
        now = BASE_TIME + timedelta(seconds=10)
        claimed = await store.claim_runnable("me", 30, now, 100)
        assert [lease.run_id for lease in claimed] == expired + free, "oldest first, only the claimable"
        assert all(lease.owner == "me" for lease in claimed)
        # Claimed now: nobody else gets them, nor any live lease.
        assert await store.claim_runnable("another", 30, now, 100) == []


def _scanned(plan: dict[str, Any]) -> dict[str, int]:
    """Rows each relation's scans produced or threw away, over all their loops, in an
    EXPLAIN (ANALYZE, FORMAT JSON) plan; a bitmap index scan's entries count under the index's
    name (a bitmap heap scan above it shows only the rows that passed)."""
    rows: dict[str, int] = {}
    relation = plan.get("Relation Name")
    if relation is None and plan.get("Node Type") == "Bitmap Index Scan":
        relation = plan["Index Name"]
    if relation is not None:
        loops = int(plan.get("Actual Loops", 1))
        read = float(plan.get("Actual Rows", 0)) + float(plan.get("Rows Removed by Filter", 0))
        rows[relation] = rows.get(relation, 0) + round(read * loops)
    for child in plan.get("Plans", []):
        for name, count in _scanned(child).items():
            rows[name] = rows.get(name, 0) + count
    return rows


@pytest.mark.postgres
async def test_postgres_claim_reads_only_candidates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        await migrate(schema_url(dsn, schema), home=tmp_path)
        spec_dsn = parse_store_spec(dsn, home=tmp_path).dsn or dsn
        store = await PostgresStore.open(spec_dsn, schema=schema)
        try:
            await _plant(store)
        finally:
            await store.close()
        conn = await asyncpg.connect(spec_dsn, server_settings={"search_path": schema})
        try:
            await conn.execute("ANALYZE runs; ANALYZE leases")
            # The live servers renew their leases after the statistics were taken, as they do
            # every few seconds (the statistics then date from younger leases: by them, every
            # lease has expired), leaving a dead index entry per renewal.
            for _ in range(3):
                renew = "UPDATE leases SET expires_at = expires_at + interval '1 hour'"
                await conn.execute(f"{renew} WHERE owner = 'live-server'")
            now = BASE_TIME + timedelta(seconds=3610)
            # As a dispatcher with 1,000 free slots asks, of the runs this code reads.
            args = ("me", utc(now + timedelta(seconds=30)), utc(now), 1000, RECORD_FORMAT)
            sql = queries("postgres")["claim_runnable"]
            raw = await _explain(conn, f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", args)
            text = await _explain(conn, f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {sql}", args)
        finally:
            await conn.close()
    plan = json.loads(raw[0][0])[0]["Plan"]
    scanned = _scanned(plan)
    with capsys.disabled():
        print(f"\nclaim with {LIVE} live leases, {DEAD} expired, {FREE} free: rows scanned {scanned}")
        print("\n".join(row[0] for row in text))
    # The claims before walked every active run (> LIVE rows or index entries of runs): first
    # probing each one's lease, then (joined from the runs' side, as the planner chose on stale
    # statistics) reading every active run's entry of runs_status_created.
    assert scanned and all(count <= 4 * (DEAD + FREE) + 10 for count in scanned.values()), scanned


class _RolledBack(Exception):
    """Raised to roll a transaction back."""


async def _explain(conn: Any, sql: str, args: tuple[Any, ...]) -> list[Any]:
    """The rows of an EXPLAIN ANALYZE, which runs the claim: in a transaction rolled back after."""
    rows: list[Any] = []
    try:
        async with conn.transaction():
            rows = list(await conn.fetch(sql, *args))
            raise _RolledBack
    except _RolledBack:
        pass
    return rows

"""The planted scenario of ``bench/scale.py``: many ended runs in the tables, planted by SQL, and
the store's claim and ``runs_list`` timed among them (issue 24: with 1,000,000 ended runs, claim
p99 ≤ 50 ms and ``runs_list`` first page ≤ 50 ms).

The rows are the Postgres store's own: one run is created and cancelled through the store's API
(``bench/list_runs.py``'s :func:`~bench.list_runs.fill`: a 3-step chain, a 2 KB request), and its
rows in ``runs`` and ``facts`` are copied ``generate_series``-wise by ``INSERT ... SELECT``, every
column as the store wrote it (whatever columns the schema has: a migration that adds one is copied
too) except the run id, the times (one second older per copy, also inside the head and the fact
bodies, where they are JSON text) and the idempotency key and lease token (none). A planted run
reads back through the store (checked). Beside them, ``--planted-live`` runs are queued, half of
them leased by another owner for the whole measurement (runs being driven elsewhere), and then:

* ``claim_runnable`` (the dispatcher's claim, up to 10 runs), each claim's leases released again;
* the same claim by an older server (a store opened with ``reads_format`` one below this code's)
  once every free run is of this code's record format: it leaves them all, reading each one's head
  (printed, not held to the target: the worst case of a rolling deploy, with no newer server there
  to take the runs);
* ``list_runs`` first page (20 runs, as ``runs_list`` by default), and filtered on ``cancelled``
  (printed, not held to the target: the issue's target is the first page);
* the ``runs_list`` tool over Streamable HTTP, on one server started on the schema afterwards (the
  live runs cancelled first, so that it has nothing to drive).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]
from pydantic import TypeAdapter

from bench.harness import repeat
from bench.list_runs import T0, fill
from bench.scale_figures import PlantedFigures, Timings
from bench.scale_postgres import bench_database
from orchestration.core import RECORD_FORMAT, RunCancelled, RunStatus, apply_write
from orchestration.store import ClaimsRunnable, Lease, RunStore
from stores import parse_store_spec
from stores.postgres import PostgresStore
from tests.acceptance.cluster import clients, server
from tests.acceptance.harness import call
from tests.acceptance.store_targets import store_target

#: fill's names: the first run is the template, the others stay queued
TEMPLATE = "run-list-0000000"
PREFIX = "planted-"
CHUNK = 100_000
#: the JSON text of a whole-second UTC time, as the store writes it (checked against the template)
JSON_TIME = 'YYYY-MM-DD"T"HH24:MI:SS"Z"'
CLAIM_LIMIT = 10
#: the free queued runs' heads, restated as of this code's record format (the last key of a head)
RESTATE_FREE = (
    "UPDATE runs SET head = regexp_replace(head, '\"format\":[0-9]+}$', '\"format\":' || $1 || '}') "
    "WHERE status = 'queued' AND lease_token IS NULL"
)

T = TypeVar("T")


def _json_time(at: datetime) -> str:
    return TypeAdapter(datetime).dump_json(at).decode().strip('"')


async def _columns(conn: Any, schema: str, table: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 "
        "ORDER BY ordinal_position",
        schema,
        table,
    )
    return [str(r[0]) for r in rows]


def _copy_sql(table: str, columns: list[str], texts: set[str]) -> str:
    """``INSERT ... SELECT`` of the template's rows in ``table``, once per ``g`` of $2..$3: the run
    id ``$4 || g``, times ``g`` seconds older, in the text columns ``texts`` too ($5/$6: the
    template's created/updated times as JSON text; $1: the template's id)."""
    new_id = "($4 || lpad(g::text, 8, '0'))"
    created = "(t.created_at - make_interval(secs => g))"
    updated = "(t.updated_at - make_interval(secs => g))"
    run = "r" if table == "facts" else "t"
    exprs = []
    for col in columns:
        if col == "run_id":
            exprs.append(new_id)
        elif col in ("created_at", "updated_at") and table == "runs":
            exprs.append(created if col == "created_at" else updated)
        elif col in ("idempotency_key", "lease_token"):
            exprs.append("NULL")
        elif col in texts:
            c, u = created.replace("t.", f"{run}."), updated.replace("t.", f"{run}.")
            exprs.append(
                f"replace(replace(replace(t.{col}, $1, {new_id}), $5, to_char({c} AT TIME ZONE 'UTC', "
                f"'{JSON_TIME}')), $6, to_char({u} AT TIME ZONE 'UTC', '{JSON_TIME}'))"
            )
        else:
            exprs.append(f"t.{col}")
    joined = "" if table == "runs" else " JOIN runs r ON r.run_id = t.run_id"
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(exprs)} "
        f"FROM {table} t{joined} CROSS JOIN generate_series($2::int, $3::int) AS g WHERE t.run_id = $1"
    )


async def plant(store: RunStore, dsn: str, schema: str, rows: int) -> float:
    """``rows`` copies of the template run (see the module docstring); returns the seconds taken."""
    head = await store.load(TEMPLATE)
    assert head.idempotency_key is None
    stamps = (_json_time(head.created_at), _json_time(head.updated_at))
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        for stamp, column in zip(stamps, ("created_at", "updated_at"), strict=True):
            shown = await conn.fetchval(
                f"SELECT to_char({column} AT TIME ZONE 'UTC', '{JSON_TIME}') FROM runs WHERE run_id = $1",
                TEMPLATE,
            )
            assert shown == stamp, f"the store writes {column} as {stamp}, the planting as {shown}"
        run_sql = _copy_sql("runs", await _columns(conn, schema, "runs"), {"head"})
        fact_sql = _copy_sql("facts", await _columns(conn, schema, "facts"), {"body"})
        began = time.perf_counter()
        for first in range(1, rows + 1, CHUNK):
            last = min(rows, first + CHUNK - 1)
            async with conn.transaction():
                for sql in (run_sql, fact_sql):
                    await conn.execute(sql, TEMPLATE, first, last, PREFIX, *stamps)
        await conn.execute("ANALYZE runs")
        await conn.execute("ANALYZE facts")
        return time.perf_counter() - began
    finally:
        await conn.close()


async def check_planted(store: RunStore, rows: int) -> None:
    """A planted run reads back as a run of the store's: its id, its times, its facts."""
    template = await store.load(TEMPLATE)
    run_id = f"{PREFIX}{rows:08d}"
    head = await store.load(run_id)
    facts = await store.read_facts(run_id)
    older = timedelta(seconds=rows)
    assert head.run_id == run_id and head.status == RunStatus.CANCELLED, head
    assert head.created_at == template.created_at - older, (head.created_at, template.created_at)
    assert [f.seq for f in facts] == [1, 2] and facts[0].at == template.created_at - older, facts


async def timed(
    name: str,
    repeats: int,
    once: Callable[[], Awaitable[T]],
    after: Callable[[T], Awaitable[None]] | None = None,
    *,
    targeted: bool = True,
) -> Timings:
    """``once()`` timed ``repeats`` times (after 3 untimed calls: prepared statements, caches),
    each followed by ``after(its result)``, untimed."""
    seconds = await repeat(once, repeats, warmup=3, after=after)
    return Timings(name, tuple(s * 1000 for s in seconds), targeted)


async def cancel(store: RunStore, run_id: str, at: datetime | None = None) -> None:
    head = await store.load(run_id)
    fact = RunCancelled(seq=head.last_seq + 1, at=at or datetime.now(UTC), reason="bench")
    await store.append(run_id, head.version, [fact], apply_write(head, [fact]))


async def older_claims(dsn: str, schema: str, repeats: int) -> Timings:
    """The claim of an older server among free runs that are all of a newer format than it reads
    (it claims none of them)."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        restated = await conn.execute(RESTATE_FREE, str(RECORD_FORMAT))
        assert restated != "UPDATE 0", "no free run to restate"
    finally:
        await conn.close()
    older = await PostgresStore.open(dsn, schema=schema, reads_format=RECORD_FORMAT - 1)
    try:

        async def claim() -> list[Lease]:
            return await older.claim_runnable("bench-older", 30, datetime.now(UTC), limit=CLAIM_LIMIT)

        async def none(leases: list[Lease]) -> None:
            assert not leases, "an older server claimed a run of a newer format"

        name = f"claim_runnable (up to {CLAIM_LIMIT}), older server, every free run newer"
        return await timed(name, repeats, claim, none, targeted=False)
    finally:
        await older.close()


async def measure_planted(admin_dsn: str, rows: int, *, live: int, repeats: int) -> PlantedFigures:
    with tempfile.TemporaryDirectory(prefix="construct-planted-") as tmp:
        workdir = Path(tmp)
        async with bench_database(admin_dsn) as db:
            os.environ["CONSTRUCT_TEST_POSTGRES_DSN"] = db.dsn
            async with store_target("postgres", workdir / "store") as target, target.opened() as store:
                schema = parse_store_spec(target.url, home=target.workdir).schema
                await fill(store, live + 1, 100)  # every run queued
                if not isinstance(store, ClaimsRunnable):  # pragma: no cover - the postgres store does
                    raise TypeError(f"{type(store).__name__} cannot claim_runnable")
                # Whole seconds, as the planting writes them (JSON_TIME).
                await cancel(store, TEMPLATE, at=T0 + timedelta(seconds=1))
                seconds = await plant(store, db.dsn, schema, rows)
                await check_planted(store, rows)
                claims: ClaimsRunnable = store
                held = await claims.claim_runnable("bench-holder", 3600, datetime.now(UTC), limit=live // 2)

                async def claim() -> list[Lease]:
                    now = datetime.now(UTC)
                    return await claims.claim_runnable("bench-claimer", 30, now, limit=CLAIM_LIMIT)

                async def release(leases: list[Lease]) -> None:
                    assert leases, "nothing to claim"
                    for lease in leases:
                        await store.release_lease(lease)

                timings = [
                    await timed(f"claim_runnable (up to {CLAIM_LIMIT})", repeats, claim, release),
                    await older_claims(db.dsn, schema, repeats),
                    await timed("list_runs first page (20)", repeats, lambda: store.list_runs(limit=20)),
                    await timed(
                        "list_runs first page, cancelled only",
                        repeats,
                        lambda: store.list_runs(frozenset({RunStatus.CANCELLED}), limit=20),
                        targeted=False,
                    ),
                ]
                for n in range(1, live + 1):
                    await cancel(store, f"run-list-{n:07d}")
                home = workdir / "p0"
                env = target.env(home, CONSTRUCT_LOG_LEVEL="WARNING")
                async with server("p0", env, home) as running, clients([running]) as (client,):
                    timings.append(
                        await timed(
                            "runs_list tool over HTTP (20)",
                            repeats,
                            lambda: call(client, "runs_list", limit=20),
                        )
                    )
    return PlantedFigures(rows, live, len(held), seconds, tuple(timings))

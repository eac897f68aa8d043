"""Server memory and upkeep per live run: one ``construct-mcp serve`` process (provider backend)
with ``--runs`` runs waiting at once on a slow fake provider (not a test: run it and read the
figures).

It starts the fake provider (each call answered after ``--delay`` seconds, long enough that every
run is still waiting when measured) and one server with ``dispatch_concurrency`` = ``--runs`` (and
the provider's ``max_concurrency`` as large), reads the server's RSS once it is idle, starts
``--runs`` runs through ``orchestrate_start``, waits until the fake has received a call from each
(every run is then live: claimed, leased, its first task's call in flight), reads the RSS again and
prints the difference per live run. Then, for ``--window`` seconds of that steady state (every
run waiting on its call), it measures the server's upkeep: its CPU time (``/proc``), and on
PostgreSQL the statements it sent — the store is a database of its own, created for the bench and
dropped afterwards, so that ``pg_stat_database``'s transaction count (every statement of the
adapter is one autocommit transaction) and rows read are the server's alone. The servers are
stopped without waiting for the runs.

    python bench/live_run_memory.py [--runs 500] [--delay 300] [--window 20]
                                    [--store sqlite|postgres|filesystem]

PostgreSQL comes from ``--postgres-dsn`` or ``CONSTRUCT_TEST_POSTGRES_DSN``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg  # type: ignore[import-untyped]

# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import cpu_seconds, parser, rss_kib
from stores import migrate
from tests.acceptance.cluster import (
    FakeProcess,
    clients,
    fake_provider_process,
    server_env,
    servers,
    start_runs,
)
from tests.acceptance.store_targets import StoreTarget, store_target
from tests.stores.sql_adapters import postgres_dsn


def _with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@asynccontextmanager
async def own_database(workdir: Path) -> AsyncIterator[tuple[StoreTarget, str, str]]:
    """A PostgreSQL store in a database of its own (created, migrated, dropped afterwards): the
    target, the DSN to read statistics through (the maintenance database), and the database's name."""
    dsn = await postgres_dsn()
    name = f"construct_upkeep_{secrets.token_hex(4)}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')  # a generated, plain identifier
    finally:
        await conn.close()
    try:
        url = _with_database(dsn, name)
        await migrate(url, home=workdir)
        yield StoreTarget("postgres", url, workdir), dsn, name
    finally:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


async def database_counters(dsn: str, name: str) -> tuple[int, int]:
    """(transactions, rows fetched) of database ``name`` so far (``pg_stat_database``, read from
    another database so that the reading is not counted)."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT xact_commit + xact_rollback, tup_fetched FROM pg_stat_database WHERE datname = $1", name
        )
    finally:
        await conn.close()
    return int(row[0]), int(row[1])


@asynccontextmanager
async def bench_store(
    backend: str, workdir: Path
) -> AsyncIterator[tuple[StoreTarget, str | None, str | None]]:
    if backend == "postgres":
        async with own_database(workdir) as (target, dsn, name):
            yield target, dsn, name
    else:
        async with store_target(backend, workdir) as target:
            yield target, None, None


async def calls_in_flight(fake: FakeProcess, prefix: str = "r") -> int:
    """The runs whose first call reached the fake (their calls are keyed ``rN/task``)."""
    return sum(1 for key in await fake.calls() if key.startswith(prefix) and key.endswith("/architect"))


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="construct-live-memory-") as tmp:
        workdir = Path(tmp)
        scenario = {"default": [{"text": "done", "delay_seconds": args.delay}]}
        async with (
            bench_store(args.store, workdir / "store") as (target, stats_dsn, database),
            fake_provider_process(scenario, workdir / "fake") as fake,
        ):
            home = workdir / "s0"
            env = server_env(
                target, home, fake, {"CONSTRUCT_LOG_LEVEL": "WARNING"}, concurrency=args.runs + 1
            )
            async with servers([("s0", env, home)]) as running, clients(running) as via:
                pid = running[0].pid
                # one run first, so that lazily imported code and warm caches are in the baseline
                await start_runs(via, ["warm-up"])
                with anyio.fail_after(60):
                    while (await calls_in_flight(fake, "warm-up")) < 1:  # noqa: ASYNC110 (another process)
                        await anyio.sleep(0.2)
                await anyio.sleep(1)
                idle = rss_kib(pid)
                started = anyio.current_time()
                await start_runs(via, [f"r{n}" for n in range(args.runs)])
                while (waiting := await calls_in_flight(fake)) < args.runs:
                    if anyio.current_time() - started > args.delay / 2:
                        raise SystemExit(f"only {waiting} of {args.runs} runs reached the provider")
                    await anyio.sleep(0.2)
                live_after = anyio.current_time() - started
                await anyio.sleep(2)
                live = rss_kib(pid)
                # Steady state: every run waits on its call; what does the server spend meanwhile?
                counters = await database_counters(stats_dsn, database) if stats_dsn and database else None
                cpu, began = cpu_seconds(pid), anyio.current_time()
                await anyio.sleep(args.window)
                cpu, window = cpu_seconds(pid) - cpu, anyio.current_time() - began
                later = await database_counters(stats_dsn, database) if stats_dsn and database else None
                still = await calls_in_flight(fake)
    per_run = (live - idle) / args.runs
    print(f"{args.store}: {args.runs} live runs (each waiting on a {args.delay:.0f} s provider call)")
    print(f"  all {args.runs} runs had their call in flight {live_after:.1f} s after the first start")
    print(
        f"  server RSS: {idle / 1024:.1f} MiB with one live run, {live / 1024:.1f} MiB with {args.runs + 1}"
    )
    print(f"  {per_run:.0f} KiB per live run")
    live_runs = args.runs + 1
    print(
        f"  steady state, {window:.1f} s with {live_runs} runs waiting: server CPU "
        f"{cpu * 1000 / window:.1f} ms/s, {cpu * 1000 / window / live_runs:.3f} ms per live run per second"
    )
    if counters is not None and later is not None:
        statements, fetched = (later[0] - counters[0]) / window, (later[1] - counters[1]) / window
        print(
            f"  statements (transactions) {statements:.2f}/s, rows fetched {fetched:.0f}/s, "
            "for the one server"
        )
    if still < args.runs:
        print(
            f"  (only {still} of {args.runs} calls were still in flight at the end: "
            "a longer --delay is needed)"
        )


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=500)
    p.add_argument("--delay", type=float, default=300.0, help="seconds per provider call")
    p.add_argument("--window", type=float, default=20.0, help="seconds of steady state measured")
    p.add_argument("--store", choices=["postgres", "sqlite", "filesystem"], default="sqlite")
    p.add_argument("--postgres-dsn", default=None)
    args = p.parse_args()
    if args.postgres_dsn:
        os.environ["CONSTRUCT_TEST_POSTGRES_DSN"] = args.postgres_dsn
    if args.store == "postgres" and not os.environ.get("CONSTRUCT_TEST_POSTGRES_DSN"):
        p.error("PostgreSQL needs --postgres-dsn or CONSTRUCT_TEST_POSTGRES_DSN")
    anyio.run(bench, args)


if __name__ == "__main__":
    main()

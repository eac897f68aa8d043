"""A team deployment at scale (issue 24; not a test: run it and read the figures, or with
``--check`` as a guard): N ``construct-mcp serve`` processes on one PostgreSQL, the provider
backend against a fake provider that answers each request after ``D`` seconds (a slow model).

Each cluster scenario starts ``--servers`` servers (Streamable HTTP, ``--concurrency`` runs driven
at once each) on a schema of a throwaway database of its own, starts ``--runs`` runs of the
three-task chain through ``orchestrate_start`` from ``--clients`` concurrent MCP clients (spread
round-robin over the servers; ``--client thin``, the default, makes them plain JSON-RPC POSTs on an
initialized session, ``bench/scale_client.py``, so that they leave the cores to the servers;
``--client sdk`` uses ``mcp.Client``), waits until every run has ended, and prints:

* the issue's table: servers x dispatch concurrency, runs, D | completed | runs/s (ideal) | calls in
  flight, max (ideal) | start → first provider request p50 / p99;
* beside it: p99 run duration (start answer → completed), ``orchestrate_start`` starts/s, whether
  every task was called exactly once (the fake counts calls per run and task, and the records are
  checked as ``tests/acceptance/test_scale_out.py`` checks them), statements/s and row writes/s per
  server in steady state (``pg_stat_database`` / ``pg_stat_user_tables`` deltas, and statements
  sampled from ``pg_stat_activity``: see ``bench/scale_postgres.py``) over a window in which every
  run driven waits on its provider, Postgres CPU per 1,000 boundaries (utime + stime of the
  database's backends, and of every postgres process, from ``/proc``) and server RSS per live run.

The planted scenario puts ``--planted-rows`` ended runs into a schema by SQL (``bench/scale_planted.py``)
and times the store's claim and ``runs_list`` (the store's call, and the tool over HTTP).

    python bench/scale.py --scenario target|table|planted|all [--check]
    python bench/scale.py --servers 2 --concurrency 64 --runs 200 --delay 2 [--clients 16]
    python bench/scale.py --scenario planted --planted-rows 100000

``--check`` exits 1 when a target of issue 24 is missed. PostgreSQL comes from ``--postgres-dsn`` or
``CONSTRUCT_TEST_POSTGRES_DSN``; the bench's database is dropped afterwards. Before it starts the
servers, the bench checks that their pools (``--store-pool-size``, the server's default unless
given, plus one listener each) fit in what ``max_connections`` leaves.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Check, add_postgres_dsn, conclude, parser, rss_kib
from bench.scale_client import thin_clients
from bench.scale_figures import (
    TABLE,
    TARGET,
    TASKS_PER_RUN,
    ClusterFigures,
    PlantedFigures,
    Scenario,
    Steady,
    called_more_than_once,
    issue_table,
    planted_checks,
    planted_table,
    steady_window_end,
    table_checks,
    target_checks,
    upkeep_table,
)
from bench.scale_planted import measure_planted
from bench.scale_postgres import (
    BenchDatabase,
    Observer,
    bench_database,
    connection_room,
    cpu_of,
    cpu_spent,
    postgres_pids,
)
from orchestration.core import RunStatus
from stores import DEFAULT_POOL_SIZE, parse_store_spec
from tests.acceptance.cluster import (
    TASKS,
    FakeProcess,
    check_runs,
    clients,
    fake_provider_process,
    records,
    server_env,
    servers,
    start_runs,
)
from tests.acceptance.store_targets import store_target

TERMINAL = [s.value for s in RunStatus if s.is_terminal]
#: the shortest window worth calling a steady state
MIN_WINDOW = 2.0
#: connections the bench itself holds (its observer, the store it reads the records through)
BENCH_CONNECTIONS = 4
#: the warm-up runs' names start so (their calls are answered at once, and left out of the figures)
WARM = "warm"


@dataclass(frozen=True)
class Options:
    admin_dsn: str
    pool_size: int
    log_level: str
    #: which MCP client starts the runs: ``thin`` (bench/scale_client.py) or ``sdk`` (mcp.Client)
    client: str = "thin"


def fake_scenario(sc: Scenario) -> dict[str, Any]:
    """Every call answered after D seconds, except the warm-up runs' (one per server, answered at
    once, so that the servers' idle RSS is read with their code loaded)."""
    warm = {f"{WARM}{n}/{task}": [{"text": "done"}] for n in range(sc.servers) for task in TASKS}
    return {"default": [{"text": "done", "delay_seconds": sc.delay}], **warm}


async def wait_ended(obs: Observer, schema: str, count: int, within: float) -> bool:
    """Until ``count`` runs have ended (polled once a second); False when ``within`` ran out."""
    with anyio.move_on_after(within):
        while await obs.count_runs(schema, TERMINAL) < count:  # noqa: ASYNC110 (other processes write)
            await anyio.sleep(1.0)
        return True
    return False


async def steady_state(
    sc: Scenario, fake: FakeProcess, obs: Observer, schema: str
) -> tuple[Steady | None, int, float]:
    """Once every run the servers can drive has its call in flight: the window until the first
    of those calls is answered, measured if long enough. Returns (the window's figures or None,
    the runs live, when they were live: ``time.time()``)."""
    deadline = anyio.current_time() + sc.delay
    while (stats := await fake.stats()).in_flight < sc.ideal_in_flight:
        if anyio.current_time() > deadline:
            return None, stats.in_flight, time.time()
        await anyio.sleep(0.1)
    live, live_at = stats.in_flight, time.time()
    measured = [at for key, at in stats.first_at.items() if not key.startswith(WARM)]
    end = steady_window_end(live_at, measured, sc.delay)
    if end - time.time() < MIN_WINDOW:
        return None, live, live_at
    began = time.time()
    before = await obs.counters(schema)
    sampled = await obs.sample_statements(end - time.time())
    after = await obs.counters(schema)
    ended = time.time()
    transactions, writes = before.rates(after)
    calls_started = sum(1 for at in (await fake.stats()).first_at.values() if began <= at <= ended)
    steady = Steady(
        seconds=after.at - before.at,
        live_runs=live,
        statements_per_server=transactions / sc.servers,
        sampled_statements_per_server=sampled / (ended - began) / sc.servers,
        row_writes_per_server=writes / sc.servers,
        calls_started=calls_started,
    )
    return steady, live, live_at


async def run_cluster(sc: Scenario, opts: Options) -> ClusterFigures:
    pool = opts.pool_size
    room, used = await connection_room(opts.admin_dsn)
    needed = sc.servers * (pool + 1) + BENCH_CONNECTIONS
    if needed > room - used:
        raise SystemExit(
            f"{sc.label}: {sc.servers} servers x ({pool} + 1 listener) + {BENCH_CONNECTIONS} connections "
            f"do not fit: max_connections leaves {room}, {used} are in use (--store-pool-size)"
        )
    with tempfile.TemporaryDirectory(prefix="construct-scale-") as tmp:
        workdir = Path(tmp)
        async with bench_database(opts.admin_dsn) as db:
            # store_target makes its schema in the database this names.
            os.environ["CONSTRUCT_TEST_POSTGRES_DSN"] = db.dsn
            async with (
                store_target("postgres", workdir / "store") as target,
                Observer.opened(db) as obs,
                fake_provider_process(fake_scenario(sc), workdir / "fake") as fake,
            ):
                schema = parse_store_spec(target.url, home=target.workdir).schema
                # The servers poll as shipped (every 1 s, sweeps every 5 s), not as the acceptance
                # tests' fast 0.2 s: that made each server send 5 claims and 7 sweep reads a second
                # (4,291 of the target scenario's statements, 10 s of Postgres time).
                extra = {"CONSTRUCT_LOG_LEVEL": opts.log_level, "CONSTRUCT_POLL_SECONDS": "1"}
                # Always said, so that the connections counted above are the ones opened.
                extra["CONSTRUCT_STORE_POOL_SIZE"] = str(opts.pool_size)
                envs = []
                for n in range(sc.servers):
                    home = workdir / f"s{n}"
                    envs.append(
                        (f"s{n}", server_env(target, home, fake, extra, concurrency=sc.concurrency), home)
                    )
                async with servers(envs) as running:
                    return await drive(sc, db, obs, schema, fake, running, target, opts.client)
    raise AssertionError("unreachable")  # pragma: no cover - the block returns


async def drive(
    sc: Scenario,
    db: BenchDatabase,
    obs: Observer,
    schema: str,
    fake: FakeProcess,
    running: Any,
    target: Any,
    client: str,
) -> ClusterFigures:
    sessions = thin_clients if client == "thin" else clients
    async with sessions(running) as one_each:
        await start_runs(one_each, [f"{WARM}{n}" for n in range(sc.servers)])
    if not await wait_ended(obs, schema, sc.servers, within=60):
        raise SystemExit("the warm-up runs did not end within 60 s")
    await anyio.sleep(1)
    idle = {s.pid: rss_kib(s.pid) for s in running}
    backends = await obs.backend_pids()
    cpu_before, cluster_before = cpu_of(backends), cpu_of(postgres_pids())

    names = [f"r{n}" for n in range(sc.runs)]
    timings: dict[str, tuple[float, float]] = {}
    failures: dict[str, str] = {}
    first_sent = time.time()
    async with sessions([running[n % len(running)] for n in range(sc.clients)]) as via:
        run_ids = await start_runs(via, names, parallel=sc.clients, timings=timings, failures=failures)
    starts_seconds = max((answered for _, answered in timings.values()), default=time.time()) - first_sent
    if failures:
        name, error = next(iter(failures.items()))
        print(f"  {sc.label}: {len(failures):,} starts failed; {name}: {error}", flush=True)
    steady, live, _ = await steady_state(sc, fake, obs, schema)
    rss = sum(rss_kib(s.pid) - idle[s.pid] for s in running) / live if live else None

    waves = math.ceil(sc.runs / sc.capacity)
    await wait_ended(obs, schema, sc.runs + sc.servers, within=2 * waves * sc.duration_target + 120)
    backends |= await obs.backend_pids()
    cpu = cpu_spent(cpu_before, cpu_of(backends))
    cluster_cpu = cpu_spent(cluster_before, cpu_of(postgres_pids()))
    ended_at = time.time()

    stats = await fake.stats()
    calls = {k: n for k, n in (await fake.calls()).items() if not k.startswith(WARM)}
    runs = await records(target, run_ids)
    done = [r for r in runs if r.head.status == RunStatus.COMPLETED]
    problem = None
    try:
        kept = {r.name for r in done}
        check_runs(done, {k: n for k, n in calls.items() if k.split("/", 1)[0] in kept})
    except AssertionError as exc:
        problem = f"records: {str(exc)[:300]}"
    last = max((r.head.updated_at.timestamp() for r in done), default=ended_at)
    boundaries = len(done) * TASKS_PER_RUN
    return ClusterFigures(
        scenario=sc,
        completed=len(done),
        seconds=(last if len(done) == sc.runs else ended_at) - first_sent,
        peak_in_flight=stats.peak_in_flight,
        first_request=[
            stats.first_at[f"{name}/{TASKS[0]}"] - sent
            for name, (sent, _) in timings.items()
            if f"{name}/{TASKS[0]}" in stats.first_at
        ],
        durations=[r.head.updated_at.timestamp() - timings[r.name][1] for r in done],
        starts_seconds=starts_seconds,
        failed_starts=len(failures),
        twice=called_more_than_once(calls),
        record_problem=problem,
        steady=steady,
        rss_per_live_run_kib=rss,
        rss_live_runs=live,
        cpu_ms_per_1000=cpu * 1000 / boundaries * 1000 if boundaries else None,
        cluster_cpu_ms_per_1000=cluster_cpu * 1000 / boundaries * 1000 if boundaries else None,
    )


def print_cluster(figures: list[ClusterFigures]) -> None:
    print()
    print("\n".join(issue_table(figures)))
    print()
    print("\n".join(upkeep_table(figures)))
    print(
        "  (statements/s: transactions of pg_stat_database per second per server, in brackets the "
        "statements seen starting in pg_stat_activity, which --check holds to the target: a backend "
        "reports its counters to pg_stat_database and pg_stat_user_tables up to 10 s late, so those "
        "may count some of the busy start before the window; PG CPU: this database's backends, in "
        "brackets every postgres process of the machine; a boundary is one task's outcome, "
        f"{TASKS_PER_RUN} per run)",
        flush=True,
    )


async def bench(args: argparse.Namespace) -> int:
    opts = Options(args.postgres_dsn, args.store_pool_size, args.log_level, args.client)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"scale bench (issue 24): {os.cpu_count()} cores, load average {load} at the start, "
        f"{args.client} MCP clients",
        flush=True,
    )
    checks: list[Check] = []
    if args.scenario in ("target", "all"):
        target = await run_cluster(TARGET, opts)
        print_cluster([target])
        checks += target_checks(target)
    if args.scenario in ("table", "all"):
        figures = []
        for sc in TABLE:
            figures.append(await run_cluster(sc, opts))
            print(f"  {sc.label}: done", flush=True)
        print_cluster(figures)
        checks += table_checks(figures)
    if args.scenario == "custom":
        custom = Scenario(args.servers, args.concurrency, args.runs, args.delay, args.clients)
        figure = await run_cluster(custom, opts)
        print_cluster([figure])
        checks += table_checks([figure])
    if args.scenario in ("planted", "all"):
        planted: PlantedFigures = await measure_planted(
            args.postgres_dsn, args.planted_rows, live=args.planted_live, repeats=args.planted_repeats
        )
        print()
        print("\n".join(planted_table(planted)), flush=True)
        checks += planted_checks(planted)
    return conclude(checks, check=args.check)


def options() -> argparse.ArgumentParser:
    p = parser(__doc__, check="a scale target is missed")
    p.add_argument("--scenario", choices=["target", "table", "planted", "all", "custom"], default=None)
    p.add_argument("--servers", type=int, default=None)
    p.add_argument("--concurrency", type=int, default=None, help="dispatch concurrency per server")
    p.add_argument("--runs", type=int, default=None)
    p.add_argument("--delay", type=float, default=None, help="seconds per provider request (D)")
    p.add_argument("--clients", type=int, default=None, help="concurrent MCP clients starting runs")
    p.add_argument("--planted-rows", type=int, default=1_000_000)
    p.add_argument("--planted-live", type=int, default=100, help="queued runs beside the planted ones")
    p.add_argument("--planted-repeats", type=int, default=200, help="timed calls of each kind")
    p.add_argument(
        "--store-pool-size",
        type=int,
        default=DEFAULT_POOL_SIZE,
        help="each server's CONSTRUCT_STORE_POOL_SIZE (its connections, the listener aside)",
    )
    add_postgres_dsn(p)
    p.add_argument("--log-level", default="INFO", help="the servers' log level")
    p.add_argument(
        "--client",
        choices=["thin", "sdk"],
        default="thin",
        help="the clients that start runs: thin JSON-RPC POSTs (bench/scale_client.py) or mcp.Client",
    )
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; free ``--servers`` ... ``--clients`` make a custom scenario (the others from
    the table's first point)."""
    p = options()
    args = p.parse_args(argv)
    free = ("servers", "concurrency", "runs", "delay", "clients")
    given = [name for name in free if getattr(args, name) is not None]
    if args.scenario is None:
        args.scenario = "custom" if given else "table"
    elif given and args.scenario != "custom":
        p.error(f"--{given[0]} makes a custom scenario: leave out --scenario {args.scenario}")
    base = TABLE[0]
    for name in free:
        if getattr(args, name) is None:
            setattr(args, name, getattr(base, name))
    if not args.postgres_dsn:
        p.error("PostgreSQL needs --postgres-dsn or CONSTRUCT_TEST_POSTGRES_DSN")
    return args


def main() -> None:
    raise SystemExit(anyio.run(bench, parse()))


if __name__ == "__main__":
    main()

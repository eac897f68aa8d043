"""Scale-out throughput: N ``construct-mcp serve`` processes on one PostgreSQL database (not a test:
run it and read the figures).

It starts one fake provider process (each call answered after ``--delay`` seconds) and ``--servers``
servers (Streamable HTTP, provider backend, ``--concurrency`` runs driven at once per server) on a
fresh schema, starts ``--runs`` runs of three tasks through the servers' ``orchestrate_start`` tool
(round-robin), waits until every run has completed, checks that every task was called exactly once,
and prints the runs per second, how long starting the runs took, and how the tasks were shared.

    python bench/scale_out.py [--runs 200] [--servers 3] [--concurrency 8] [--delay 0.02]
                              [--postgres-dsn postgresql://...] [--store sqlite|filesystem|postgres]

PostgreSQL comes from ``--postgres-dsn`` or ``CONSTRUCT_TEST_POSTGRES_DSN``; the schema is dropped
afterwards. The same scenario runs in ``tests/acceptance/test_scale_out.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import anyio

# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import parser
from tests.acceptance.cluster import (
    TASKS,
    check_runs,
    clients,
    fake_provider_process,
    records,
    server_env,
    servers,
    start_runs,
    wait_for_runs,
)
from tests.acceptance.store_targets import store_target


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="construct-scale-out-") as tmp:
        workdir = Path(tmp)
        async with (
            store_target(args.store, workdir / "store") as target,
            fake_provider_process(
                {"default": [{"text": "done", "delay_seconds": args.delay}]}, workdir / "fake"
            ) as fake,
        ):
            envs = []
            for n in range(args.servers):
                home = workdir / f"s{n}"
                env = server_env(
                    target,
                    home,
                    fake,
                    {"CONSTRUCT_LOG_LEVEL": args.log_level, "CONSTRUCT_POLL_SECONDS": "0.5"},
                    concurrency=args.concurrency,
                )
                envs.append((f"s{n}", env, home))
            async with servers(envs) as running, clients(running) as via:
                started = anyio.current_time()
                run_ids = await start_runs(via, [f"r{n}" for n in range(args.runs)])
                all_started = anyio.current_time() - started
                seconds = await wait_for_runs(target, args.runs, within=600) - started
                shares = [
                    sum(
                        1
                        for line in s.log().splitlines()
                        if "task_completed" in line and "facts_recorded" in line
                    )
                    for s in running
                ]
            check_runs(await records(target, run_ids), await fake.calls())
    print(
        f"{args.store}: {args.runs} runs x {len(TASKS)} tasks, {args.servers} servers x concurrency "
        f"{args.concurrency}, provider delay {args.delay * 1000:.0f} ms per call"
    )
    print(
        f"  {args.runs} orchestrate_start calls took {all_started:.1f} s "
        f"({args.runs / all_started:.0f}/s); all runs completed after {seconds:.1f} s"
    )
    print(f"  {args.runs / seconds:.1f} runs/s ({args.runs * len(TASKS) / seconds:.0f} tasks/s)")
    print(f"  tasks per server: {shares}; every task called exactly once")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--delay", type=float, default=0.02, help="seconds per provider call")
    p.add_argument("--store", choices=["postgres", "sqlite", "filesystem"], default="postgres")
    p.add_argument("--postgres-dsn", default=None)
    # INFO, as a server normally runs: the per-server task counts are read from the logs.
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args()
    if args.postgres_dsn:
        os.environ["CONSTRUCT_TEST_POSTGRES_DSN"] = args.postgres_dsn
    if args.store == "postgres" and not os.environ.get("CONSTRUCT_TEST_POSTGRES_DSN"):
        p.error("PostgreSQL needs --postgres-dsn or CONSTRUCT_TEST_POSTGRES_DSN")
    anyio.run(bench, args)


if __name__ == "__main__":
    main()

"""Server memory per live run: one ``construct-mcp serve`` process (provider backend) with
``--runs`` runs waiting at once on a slow fake provider (not a test: run it and read the figures).

It starts the fake provider (each call answered after ``--delay`` seconds, long enough that every
run is still waiting when measured) and one server with ``dispatch_concurrency`` = ``--runs`` (and
the provider's ``max_concurrency`` as large), reads the server's RSS once it is idle, starts
``--runs`` runs through ``orchestrate_start``, waits until the fake has received a call from each
(every run is then live: claimed, leased, its first task's call in flight), reads the RSS again and
prints the difference per live run. The servers are stopped without waiting for the runs.

    python bench/live_run_memory.py [--runs 500] [--delay 300] [--store sqlite|postgres|filesystem]

PostgreSQL comes from ``--postgres-dsn`` or ``CONSTRUCT_TEST_POSTGRES_DSN``.
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

from tests.acceptance.cluster import (
    FakeProcess,
    clients,
    fake_provider_process,
    server_env,
    servers,
    start_runs,
)
from tests.acceptance.store_targets import store_target


def rss_kib(pid: int) -> int:
    """The resident set of process ``pid``, in KiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def calls_in_flight(fake: FakeProcess, prefix: str = "r") -> int:
    """The runs whose first call reached the fake (their calls are keyed ``rN/task``)."""
    return sum(1 for key in await fake.calls() if key.startswith(prefix) and key.endswith("/architect"))


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="construct-live-memory-") as tmp:
        workdir = Path(tmp)
        scenario = {"default": [{"text": "done", "delay_seconds": args.delay}]}
        async with (
            store_target(args.store, workdir / "store") as target,
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
    per_run = (live - idle) / args.runs
    print(f"{args.store}: {args.runs} live runs (each waiting on a {args.delay:.0f} s provider call)")
    print(f"  all {args.runs} runs had their call in flight {live_after:.1f} s after the first start")
    print(
        f"  server RSS: {idle / 1024:.1f} MiB with one live run, {live / 1024:.1f} MiB with {args.runs + 1}"
    )
    print(f"  {per_run:.0f} KiB per live run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--delay", type=float, default=300.0, help="seconds per provider call")
    parser.add_argument("--store", choices=["postgres", "sqlite", "filesystem"], default="sqlite")
    parser.add_argument("--postgres-dsn", default=None)
    args = parser.parse_args()
    if args.postgres_dsn:
        os.environ["CONSTRUCT_TEST_POSTGRES_DSN"] = args.postgres_dsn
    if args.store == "postgres" and not os.environ.get("CONSTRUCT_TEST_POSTGRES_DSN"):
        parser.error("PostgreSQL needs --postgres-dsn or CONSTRUCT_TEST_POSTGRES_DSN")
    anyio.run(bench, args)


if __name__ == "__main__":
    main()

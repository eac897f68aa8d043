"""A team rolls out a chain change to its parked runs: ``--runs`` (default 1,000) inline runs of
chain ``review`` (architect -> engineer -> reviewer, gated before and after the reviewer) wait for
a person; nine in ten at the gate before the reviewer, one in ten at the gate after it (the
reviewer's work done). The reviewer's persona changes and the rollout moves every run that can
(:func:`orchestration.ops.roll_out`, what ``orchestrate_upgrade`` does per run): the first kind
move (the gate is asked again on the new persona), the second cannot (their reviewer's output was
written on the old persona: ``upgrade_blocked``).

Printed: how long the dry run and the rollout took, runs per second, how many moved and how many
were blocked, and why. ``--check`` holds the rollout to moving every run that can, blocking every
run that cannot, and at least :data:`MIN_RUNS_PER_SECOND` runs per second.

    python bench/rollout.py [--runs 1000] [--store postgres|sqlite|memory] [--check]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Check, add_postgres_dsn, conclude, parser
from bench.store_append import open_memory, open_sqlite, postgres_opener, postgres_reachable
from orchestration.chains import Catalog
from orchestration.core import StartRequest
from orchestration.engine import Runtime, RuntimeSettings
from orchestration.ops import roll_out
from orchestration.store import RunStore

#: the slowest rollout ``--check`` accepts
MIN_RUNS_PER_SECOND = 200.0

NEW_PERSONA = "You review every change against the security checklist first."


def catalog(persona: str | None) -> Catalog:
    chain = {
        "upgrade": "manual",
        "steps": [
            "architect",
            "engineer",
            {"specialist": "reviewer", "approve_before": True, "approve_after": True},
        ],
    }
    specialists = {} if persona is None else {"reviewer": {"description": "Reviews", "persona": persona}}
    return Catalog.builtin().extended(
        {"specialists": specialists, "chains": {"review": chain}}, "bench", Path(".")
    )


async def park(runtime: Runtime, runs: int) -> None:
    """``runs`` runs waiting for a person: one in ten past the reviewer."""
    for i in range(runs):
        head, _ = await runtime.start(StartRequest(f"Build feature {i}", chain="review"))
        await runtime.submit_host_output(head.run_id, "architect", "the design " * 50)
        await runtime.submit_host_output(head.run_id, "engineer", "the code " * 100)
        if i % 10 == 9:
            await runtime.approve(head.run_id, "approve", "before:reviewer")
            await runtime.submit_host_output(head.run_id, "reviewer", "approved")


async def main() -> int:
    p = parser(__doc__, check="the rollout moved a run it could not, or is slower than the target")
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--store", default="postgres", choices=("postgres", "sqlite", "memory"))
    add_postgres_dsn(p)
    args = p.parse_args()
    opener: Callable[[Path], AbstractAsyncContextManager[RunStore]]
    if args.store == "postgres":
        if not args.postgres_dsn or not await postgres_reachable(args.postgres_dsn):
            print("postgres: not reachable; pass --postgres-dsn or --store sqlite")
            return conclude([Check("rollout", None, "no Postgres")], check=args.check)
        opener = postgres_opener(args.postgres_dsn)
    else:
        opener = open_sqlite if args.store == "sqlite" else open_memory
    with tempfile.TemporaryDirectory() as tmp:
        async with opener(Path(tmp)) as store:
            before = Runtime(store, catalog(None), settings=RuntimeSettings(owner="bench"))
            started = time.perf_counter()
            await park(before, args.runs)
            print(f"{args.runs} runs parked on {args.store} in {time.perf_counter() - started:.1f} s")
            after = Runtime(store, catalog(NEW_PERSONA), settings=RuntimeSettings(owner="bench"))
            started = time.perf_counter()
            dry = await roll_out(after, "review", dry_run=True)
            dry_seconds = time.perf_counter() - started
            started = time.perf_counter()
            done = await roll_out(after, "review", dry_run=False, by="bench")
            seconds = time.perf_counter() - started
    reasons = Counter(why.split(" (")[0] for why in done.blocked.values())
    rate = args.runs / seconds
    print(f"dry run: {dry.said()} in {dry_seconds:.2f} s")
    print(f"rollout: {done.said()} in {seconds:.2f} s ({rate:.0f} runs/s)")
    for why, n in reasons.most_common():
        print(f"  blocked, {n} runs: {why} (...)")
    movable = args.runs - args.runs // 10
    checks = [
        Check(
            "every run that can move moved",
            done.counts["moved"] == movable,
            f"{done.counts['moved']} of {movable}",
        ),
        Check(
            "every run that cannot is blocked, and why",
            done.counts["blocked"] == args.runs // 10 and len(done.blocked) == args.runs // 10,
            f"{done.counts['blocked']} of {args.runs // 10}",
        ),
        Check(
            f"at least {MIN_RUNS_PER_SECOND:.0f} runs/s", rate >= MIN_RUNS_PER_SECOND, f"{rate:.0f} runs/s"
        ),
    ]
    return conclude(checks, check=args.check)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

"""``list_runs`` and ``runnable`` with many runs, per store (not a test: run it and read the figures).

It creates ``--runs`` runs (a 3-step chain, a 2 KB request), cancels all but ``--live-percent`` of
them, then times ``list_runs(limit=50)``, ``list_runs`` filtered on ``queued``, and ``runnable``
(which every dispatcher polls). The first call of each store object pays for reading every head
once; the figures are the median of the calls after it.

    python bench/list_runs.py [--runs 5000] [--live-percent 10] [--stores filesystem,sqlite,postgres]
                              [--postgres-dsn postgresql://...]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path

# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import add_postgres_dsn, median, names, parser, repeat
from bench.store_append import open_filesystem, open_sqlite, postgres_opener, postgres_reachable
from orchestration.core import (
    ChainSnapshot,
    ChainStep,
    ExecutionContract,
    RunCancelled,
    RunCreated,
    RunStatus,
    SpecialistSnapshot,
    apply_write,
    head_from_creation,
    text_hash,
)
from orchestration.store import RunStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CHAIN = ChainSnapshot(
    name="build",
    steps=tuple(ChainStep(name=n, specialist=n) for n in ("architect", "engineer", "reviewer")),
    specialists=tuple(
        SpecialistSnapshot(name=n, description=n, persona=f"You are the {n}.")
        for n in ("architect", "engineer", "reviewer")
    ),
)


async def fill(store: RunStore, runs: int, live_percent: float) -> None:
    live_every = max(1, round(100 / live_percent)) if live_percent > 0 else 0
    for i in range(runs):
        at = T0 + timedelta(seconds=i)
        created = RunCreated(
            seq=1,
            at=at,
            run_id=f"run-list-{i:07d}",
            request="x" * 2000,
            chain=CHAIN,
            chain_hash=CHAIN.content_hash(),
            contract=ExecutionContract(worker_backend="provider", provider="p", model="m"),
            request_hash=text_hash("x" * 2000),
        )
        head = head_from_creation(created)
        await store.create(head, [created])
        if live_every and i % live_every == 0:
            continue
        cancelled = RunCancelled(seq=2, at=at + timedelta(milliseconds=1), reason="bench")
        await store.append(head.run_id, head.version, [cancelled], apply_write(head, [cancelled]))


async def median_ms(call: Callable[[], Awaitable[object]]) -> float:
    # The first call of a store object reads every head once: not timed.
    return median(await repeat(call, 7, warmup=1)) * 1000


async def main() -> int:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=5000)
    p.add_argument("--live-percent", type=float, default=10.0)
    p.add_argument("--stores", default="filesystem,sqlite,postgres")
    add_postgres_dsn(p)
    args = p.parse_args()
    openers: dict[str, Callable[[Path], AbstractAsyncContextManager[RunStore]]] = {
        "filesystem": open_filesystem,
        "sqlite": open_sqlite,
    }
    wanted = names(args.stores)
    if "postgres" in wanted:
        if not args.postgres_dsn:
            print("postgres: skipped (no --postgres-dsn and no CONSTRUCT_TEST_POSTGRES_DSN)")
        elif await postgres_reachable(args.postgres_dsn):
            openers["postgres"] = postgres_opener(args.postgres_dsn)
    print(f"{args.runs} runs, {args.live_percent:g} % live; median of 7 calls after the first")
    print(f"{'store':<11}{'list_runs':>12}{'queued only':>13}{'runnable':>12}")
    now = T0 + timedelta(days=365)
    for name in wanted:
        if name not in openers:
            continue
        with tempfile.TemporaryDirectory(prefix="construct-bench-") as tmp:
            async with openers[name](Path(tmp)) as store:
                await fill(store, args.runs, args.live_percent)
                cells = [
                    await median_ms(lambda: store.list_runs(limit=50)),
                    await median_ms(lambda: store.list_runs(frozenset({RunStatus.QUEUED}), limit=50)),
                    await median_ms(lambda: store.runnable(now)),
                ]
        print(f"{name:<11}" + "".join(f"{c:>9.1f} ms" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

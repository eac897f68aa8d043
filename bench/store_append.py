"""Append latency versus history, per store (not a test: run it and read the figures).

For each store and each history length N (5, 50, 500 earlier facts), it builds fresh runs whose logs
hold exactly N facts — ``run_created``, then pairs of ``attempt_started`` + ``task_completed`` with
10 KB outputs, padded with an ``attempt_started`` for the next task — and times one more append: the
``task_completed`` (10 KB output) of that task. Heads are built with
:func:`orchestration.core.fold.apply_write`, as the runtime builds them. Every run uses the same chain
(long enough for 500 facts), so the runs differ only in how much history they have.

It prints the median append latency per N, the ratio median(500) / median(5) (DESIGN §3: the cost of
a write must not grow with history; target <= 1.3), and the size of the head the measured append
writes (in its stored form) at each N: the store rewrites the head at every append, and finished
tasks are settled in it (a few bytes each), so it barely grows. A second table holds the head at its
creation size, which isolates the store's own cost.

    python bench/store_append.py [--samples 15] [--stores memory,filesystem,sqlite,postgres]
                                 [--postgres-dsn postgresql://...]

PostgreSQL is measured when ``--postgres-dsn`` or ``CONSTRUCT_TEST_POSTGRES_DSN`` is set and
answers; it works in a throwaway schema that is dropped afterwards.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import add_postgres_dsn, alternate, median, names, once, parser
from orchestration.core import (
    AttemptStarted,
    ChainSnapshot,
    ChainStep,
    ExecutionContract,
    Fact,
    RunCreated,
    RunHead,
    SpecialistSnapshot,
    TaskCompleted,
    apply_write,
    head_from_creation,
    text_hash,
)
from orchestration.store import RunStore
from stores._common import encode_head

HISTORIES = (5, 50, 500)
OUTPUT = ("0123456789abcdef" * 640)[: 10 * 1024]  # 10 KB
OUTPUT_SHA = text_hash(OUTPUT)
STEPS = max(HISTORIES) // 2 + 2
EXECUTOR = "provider:bench:m"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def chain() -> ChainSnapshot:
    return ChainSnapshot(
        name="bench",
        steps=tuple(ChainStep(name=f"t{i:03d}", specialist="engineer") for i in range(STEPS)),
        specialists=(SpecialistSnapshot(name="engineer", description="engineer", persona="You build."),),
    )


CHAIN = chain()
CHAIN_HASH = CHAIN.content_hash()


class Run:
    """One run's head, advanced write by write."""

    def __init__(self, run_id: str) -> None:
        created = RunCreated(
            seq=1,
            at=T0,
            run_id=run_id,
            request="bench",
            chain=CHAIN,
            chain_hash=CHAIN_HASH,
            contract=ExecutionContract(worker_backend="provider", provider="bench", model="m"),
            request_hash=text_hash("bench"),
        )
        self.created: list[Fact] = [created]
        self.head: RunHead = head_from_creation(created)
        self.task = 0
        self.attempt = 0

    def _at(self) -> datetime:
        return self.head.updated_at + timedelta(milliseconds=1)

    def start(self) -> tuple[int, list[Fact], RunHead]:
        self.attempt += 1
        fact = AttemptStarted(
            seq=self.head.last_seq + 1,
            at=self._at(),
            task_id=f"t{self.task:03d}",
            attempt=self.attempt,
            executor=EXECUTOR,
        )
        return self._write([fact])

    def complete(self, *, with_start: bool) -> tuple[int, list[Fact], RunHead]:
        facts: list[Fact] = []
        at = self._at()
        if with_start:
            self.attempt += 1
            facts.append(
                AttemptStarted(
                    seq=self.head.last_seq + 1,
                    at=at,
                    task_id=f"t{self.task:03d}",
                    attempt=self.attempt,
                    executor=EXECUTOR,
                )
            )
        facts.append(
            TaskCompleted(
                seq=self.head.last_seq + len(facts) + 1,
                at=at,
                task_id=f"t{self.task:03d}",
                attempt=self.attempt,
                executor=EXECUTOR,
                output=OUTPUT,
                output_sha256=OUTPUT_SHA,
            )
        )
        write = self._write(facts)
        self.task += 1
        self.attempt = 0
        return write

    def _write(self, facts: list[Fact]) -> tuple[int, list[Fact], RunHead]:
        expected = self.head.version
        self.head = apply_write(self.head, facts)
        return expected, facts, self.head


Write = tuple[int, list[Fact], RunHead]


def pinned(write: Write, first: RunHead | None) -> Write:
    """``write`` with its head replaced by ``first`` (the run's creation head) carrying only the new
    version and last_seq: the same facts, a head of constant size. Stores never fold, so this
    isolates what the store's own cost does with history."""
    if first is None:
        return write
    expected, facts, head = write
    return expected, facts, first.model_copy(update={"version": head.version, "last_seq": head.last_seq})


async def commit(store: RunStore, write: Write) -> None:
    expected, facts, head = write
    await store.append(head.run_id, expected, facts, head)


async def run_with_history(store: RunStore, history: int, pin_head: bool) -> tuple[Run, RunHead | None]:
    """A stored run with exactly ``history`` facts whose next write completes a running task."""
    run = Run(f"run-bench-{secrets.token_hex(6)}")
    first = run.head if pin_head else None
    await store.create(run.head, run.created)
    pairs = (history - 2) // 2
    for _ in range(pairs):
        await commit(store, pinned(run.complete(with_start=True), first))
    for _ in range(history - 1 - 2 * pairs):
        await commit(store, pinned(run.start(), first))
    assert run.head.last_seq == history, (run.head.last_seq, history)
    return run, first


async def measure(store: RunStore, samples: int, pin_head: bool) -> dict[int, tuple[float, int]]:
    """Per history length: the median seconds of the measured append and the head bytes it writes.

    Every run is built first and the measured appends then go round-robin over the history
    lengths, so that all of them meet the same database (size, cache, WAL) and differ only in
    their run's history."""
    runs: dict[int, list[tuple[Run, RunHead | None]]] = {n: [] for n in HISTORIES}
    for _ in range(samples):
        for history in HISTORIES:
            runs[history].append(await run_with_history(store, history, pin_head))
    head_bytes: dict[int, int] = {}

    def append_after(history: int) -> Callable[[], Awaitable[float]]:
        built = iter(runs[history])

        async def append() -> float:
            run, first = next(built)
            write = pinned(run.complete(with_start=False), first)
            head_bytes[history] = len(encode_head(write[2]).encode())
            # The heap holds every run built above: a collection inside the timed call would time
            # the bench's own objects.
            return await once(lambda: commit(store, write), quiet_gc=True)

        return append

    times = await alternate({str(n): append_after(n) for n in HISTORIES}, samples)
    return {n: (median(times[str(n)]), head_bytes[n]) for n in HISTORIES}


# ------------------------------------------------------------------------------------------ stores


@asynccontextmanager
async def open_memory(_: Path) -> AsyncIterator[RunStore]:
    from stores.memory import MemoryStore

    store = MemoryStore()
    yield store
    await store.close()


@asynccontextmanager
async def open_filesystem(tmp: Path) -> AsyncIterator[RunStore]:
    from stores.filesystem import FilesystemStore

    store = FilesystemStore(tmp / "fs")
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def open_sqlite(tmp: Path) -> AsyncIterator[RunStore]:
    from stores.sqlite import SqliteStore

    store = await SqliteStore.open(tmp / "construct.db")
    try:
        yield store
    finally:
        await store.close()


def postgres_opener(dsn: str) -> Callable[[Path], AbstractAsyncContextManager[RunStore]]:
    @asynccontextmanager
    async def open_postgres(tmp: Path) -> AsyncIterator[RunStore]:
        import asyncpg  # type: ignore[import-untyped]

        from stores import migrate, parse_store_spec
        from stores.postgres import PostgresStore

        schema = f"construct_bench_{secrets.token_hex(4)}"
        url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
        await migrate(url, home=tmp)
        spec = parse_store_spec(url, home=tmp)
        assert spec.dsn is not None
        store = await PostgresStore.open(spec.dsn, schema=schema)
        try:
            yield store
        finally:
            await store.close()
            conn = await asyncpg.connect(spec.dsn)
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            await conn.close()

    return open_postgres


async def postgres_reachable(dsn: str) -> bool:
    try:
        import asyncpg

        conn = await asyncpg.connect(dsn, timeout=3)
    except Exception as exc:  # any failure means "skip postgres", and says why
        print(f"postgres: skipped ({type(exc).__name__}: {exc})")
        return False
    await conn.close()
    return True


async def main() -> int:
    p = parser(__doc__)
    p.add_argument("--samples", type=int, default=15, help="runs measured per history length")
    p.add_argument("--stores", default="memory,filesystem,sqlite,postgres")
    add_postgres_dsn(p)
    args = p.parse_args()

    openers: dict[str, Callable[[Path], AbstractAsyncContextManager[RunStore]]] = {
        "memory": open_memory,
        "filesystem": open_filesystem,
        "sqlite": open_sqlite,
    }
    wanted = names(args.stores)
    if "postgres" in wanted:
        if not args.postgres_dsn:
            print("postgres: skipped (no --postgres-dsn and no CONSTRUCT_TEST_POSTGRES_DSN)")
        elif await postgres_reachable(args.postgres_dsn):
            openers["postgres"] = postgres_opener(args.postgres_dsn)

    for pin_head in (False, True):
        if pin_head:
            print()
            print(
                "the same histories with the head held at its creation size (isolates the store's own cost)"
            )
        else:
            print(f"median latency of one append (task_completed, 10 KB output), {args.samples} runs per N")
        print(f"{'store':<11}" + "".join(f"{f'after {n}':>13}" for n in HISTORIES) + f"{'500/5':>9}")
        sizes: dict[int, int] = {}
        for name in wanted:
            if name not in openers:
                continue
            with tempfile.TemporaryDirectory(prefix="construct-bench-") as tmp:
                async with openers[name](Path(tmp)) as store:
                    measured = await measure(store, args.samples, pin_head)
            medians = {n: measured[n][0] for n in HISTORIES}
            sizes = {n: measured[n][1] for n in HISTORIES}
            ratio = medians[HISTORIES[-1]] / medians[HISTORIES[0]]
            cells = "".join(f"{medians[n] * 1000:>10.3f} ms" for n in HISTORIES)
            print(f"{name:<11}{cells}{ratio:>9.2f}", flush=True)
        print(
            "head bytes written by the measured append: "
            + ", ".join(f"after {n}: {sizes[n]}" for n in HISTORIES)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

"""Task boundaries per store, side by side with LangGraph and DBOS (issue 11; not a test: run it and
read the figures, or run it with ``--check`` as a guard before merging a change to the drive loop or
a store).

The shape: a 50-step chain (the longest allowed), 1 KB output per step, an instant in-process
worker (provider time excluded). A **boundary** on the provider path is the time between two
consecutive worker calls: a task's outcome recorded, the next task decided, its prompt read and
its ``attempt_started`` recorded. On the inline path it is a host's output recorded
(``submit_host_output``) plus the drive that prepares the next host task. Each figure is the median
of ``--runs`` runs (each run's figure is the median of its 49 boundaries).

It prints, in one run:

* ms per boundary on every store (memory, filesystem, sqlite, postgres), provider and inline path;
* on postgres, the boundary at step 5 and at step 50 (reading what a prompt needs must not cost a
  query per earlier output);
* boundaries/s for 20 runs driven at once on sqlite and postgres;
* the floors, measured in the same run: on the same Postgres a compare-and-swap of a small head
  plus a 1 KB fact insert committed as one statement (and a bare round trip, and 20 clients at
  once), and an append + fsync of 1 KB in the store's directory;
* with the ``bench`` extra (``pip install -e '.[bench]'``): LangGraph (``durability="sync"``, its
  memory, sqlite and postgres savers) and DBOS (postgres) with the same shape on the same
  databases, and each ratio; without it, what was skipped;
* the MCP round trip: ``run_status`` on a completed 3-task run with 1 KB outputs against a bare
  ``bench_echo`` tool returning 1 KB on the same server (bench/_echo_server.py), over stdio and
  Streamable HTTP, and the cold start to an initialized session;
* the host's path over stdio (issue 23, :mod:`bench.host_path`), per persistent store:
  ``orchestrate_resume`` that hands in an output and receives the next task, and
  ``orchestrate_start`` of an inline chain (answered with its first host task), median and p90 of
  ``--host-samples`` calls (at least 100), each against ``bench_echo`` in the same session.

``--check`` then exits 1 when a target of issue 11 or issue 23 is missed (a target whose figures
were not measured, e.g. without the extra or without Postgres, is reported as not checked).
Issue 23's: the in-process inline boundary at most 1.5 x the provider boundary on every store;
over stdio, a resume at most 2 x ``bench_echo`` on sqlite and postgres and 3 x on the filesystem
store, a start of an inline chain at most 3 x on every store. ``--issue 23`` (or ``11``) makes
``--check`` count only that issue's targets; every target is printed either way.

    python bench/boundaries.py [--runs 5] [--check [--issue 23]] [--postgres-dsn postgresql://...]
                               [--skip anchors,mcp,concurrent,host] [--host-samples 100]

PostgreSQL comes from ``--postgres-dsn`` or ``CONSTRUCT_TEST_POSTGRES_DSN``; everything works in
throwaway schemas (DBOS in a throwaway database) dropped afterwards.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import secrets
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import echo_client
from bench.anchors import AnchorFigures, measure_dbos, measure_langgraph
from bench.harness import Check, add_postgres_dsn, alternate, conclude, median, ms, names, p90, parser, repeat
from bench.host_path import HostPathFigures, measure_host_path
from bench.shape import CHAIN, CONCURRENT, OUTPUT, STEPS
from bench.store_append import open_filesystem, open_memory, open_sqlite, postgres_opener, postgres_reachable
from orchestration.chains import Catalog, TaskPrompt
from orchestration.core import (
    AttemptOutcome,
    AttemptSucceeded,
    ChainSnapshot,
    ChainStep,
    ExecutionContract,
    PromptRead,
    RunStatus,
    StartRequest,
    Telemetry,
    TypedError,
)
from orchestration.engine import RunSnapshot, Runtime, RuntimeSettings, Written
from orchestration.store import RunStore
from orchestration.workers.port import DeltaSink

Opener = Callable[[Path], Any]


# ----------------------------------------------------------------------------------- construct-mcp


@dataclass
class InstantWorker:
    """A provider worker that answers at once with 1 KB, noting when each call came."""

    calls: dict[str, list[float]] = field(default_factory=dict)

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        self.calls.setdefault(CURRENT_RUN.get(), []).append(time.perf_counter())
        return AttemptSucceeded(OUTPUT, Telemetry())


#: the run a drive is driving (set by :func:`drive`), for the worker's notes
CURRENT_RUN: contextvars.ContextVar[str] = contextvars.ContextVar("run", default="")


async def drive(runtime: Runtime, run_id: str) -> None:
    CURRENT_RUN.set(run_id)
    await runtime.drive(run_id)


def contract_for(request: StartRequest, _: ChainSnapshot) -> ExecutionContract:
    if request.worker_backend == "provider":
        return ExecutionContract(worker_backend="provider", provider="bench", model="m")
    return ExecutionContract(worker_backend="inline")


class LastWrites:
    """A run memory that keeps each run's last write and builds nothing while it flushes (a
    server also builds its answer's view then, which the stdio rows include)."""

    builds = False

    def __init__(self) -> None:
        self.written: dict[str, Written] = {}

    def last(self, run_id: str) -> Written | RunSnapshot | None:
        return self.written.get(run_id)

    def build(self, written: Written) -> object:
        return None

    def keep(self, written: Written, built: object) -> None:
        self.written[written.head.run_id] = written

    def prompt_read(self, run_id: str, task_id: str) -> PromptRead | None:
        return None


def new_runtime(store: RunStore, worker: InstantWorker) -> Runtime:
    return Runtime(
        store,
        Catalog.builtin(),
        resolve_contract=contract_for,
        worker=worker,
        settings=RuntimeSettings(owner=f"bench-{secrets.token_hex(3)}"),
        memory=LastWrites(),
    )


async def provider_run(runtime: Runtime, worker: InstantWorker) -> list[float]:
    """One 50-step provider run driven to its end; its 49 boundaries (seconds)."""
    head, _ = await runtime.start(StartRequest(request="bench", chain=CHAIN, worker_backend="provider"))
    await drive(runtime, head.run_id)
    done = await runtime.status(head.run_id)
    assert done.status == RunStatus.COMPLETED, done.status
    calls = worker.calls.pop(head.run_id)
    assert len(calls) == STEPS, len(calls)
    return [b - a for a, b in itertools.pairwise(calls)]


async def inline_run(runtime: Runtime) -> list[float]:
    """One 50-step inline run played like a host; its boundaries, seconds: a host's output recorded
    with the next host task prepared (one write, issue 23) and its prompt in hand, as
    ``orchestrate_resume`` does it (:meth:`Runtime.submit_host_output`, the runtime's memory
    holding the previous write; the server's answer also builds the view's snapshot from it,
    which the stdio rows include)."""
    memory = runtime.memory
    assert isinstance(memory, LastWrites)
    head, _ = await runtime.start(StartRequest(request="bench", chain=CHAIN, worker_backend="inline"))
    run_id = head.run_id
    times: list[float] = []
    for _ in range(STEPS):
        # The prompt is in hand: rendered once, by the call that prepared the task.
        [task_id] = memory.written[run_id].prompts
        started = time.perf_counter()
        head = await runtime.submit_host_output(run_id, task_id, OUTPUT)
        times.append(time.perf_counter() - started)
    assert head.status == RunStatus.COMPLETED, head.status
    return times[:-1]  # the last one finishes the run: no next task


async def concurrent_runs(runtime: Runtime, worker: InstantWorker) -> float:
    """20 provider runs driven at once; boundaries per second."""
    ids = []
    for _ in range(CONCURRENT):
        head, _ = await runtime.start(StartRequest(request="bench", chain=CHAIN, worker_backend="provider"))
        ids.append(head.run_id)
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for run_id in ids:
            tg.start_soon(drive, runtime, run_id)
    elapsed = time.perf_counter() - started
    for run_id in ids:
        assert len(worker.calls.pop(run_id)) == STEPS
    return CONCURRENT * STEPS / elapsed


@dataclass
class StoreFigures:
    provider: float = float("nan")
    inline: float = float("nan")
    step5: float = float("nan")
    step50: float = float("nan")
    concurrent: float = float("nan")


async def measure_construct(name: str, opener: Opener, runs: int, concurrent: bool) -> StoreFigures:
    figures = StoreFigures()
    with tempfile.TemporaryDirectory(prefix="construct-bench-") as tmp:
        async with opener(Path(tmp)) as store:
            worker = InstantWorker()
            runtime = new_runtime(store, worker)
            await provider_run(runtime, worker)  # warm-up
            # The two paths interleaved: a machine's load (fsync above all) weighs on both alike, so
            # that their ratio (a target) is one of the same moment.
            paths = await alternate(
                {"provider": lambda: provider_run(runtime, worker), "inline": lambda: inline_run(runtime)},
                runs,
            )
            provider = paths["provider"]
            figures.provider = median([median(b) for b in provider])
            figures.step5 = median([median(b[2:5]) for b in provider])  # the boundaries after steps 3-5
            figures.step50 = median([median(b[-3:]) for b in provider])  # the boundaries after steps 47-49
            figures.inline = median([median(b) for b in paths["inline"]])
            if concurrent and name in ("sqlite", "postgres"):
                figures.concurrent = median([await concurrent_runs(runtime, worker) for _ in range(3)])
    return figures


# ------------------------------------------------------------------------------------------ floors


async def postgres_floor(dsn: str, samples: int = 300) -> tuple[float, float, float]:
    """(one CAS + 1 KB insert as one statement, one round trip, commits/s with 20 clients)."""
    import asyncpg  # type: ignore[import-untyped]

    schema = f"construct_floor_{secrets.token_hex(4)}"
    conn = await asyncpg.connect(dsn)
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        await conn.execute(
            f'CREATE TABLE "{schema}".heads (run_id text PRIMARY KEY, version int NOT NULL, head jsonb)'
        )
        await conn.execute(
            f'CREATE TABLE "{schema}".facts (run_id text, seq int, body jsonb, PRIMARY KEY (run_id, seq))'
        )
        write = (
            f'WITH u AS (UPDATE "{schema}".heads SET version = version + 1, head = $3::jsonb '
            "WHERE run_id = $1 AND version = $2 RETURNING run_id, version) "
            f'INSERT INTO "{schema}".facts SELECT run_id, version, $4::jsonb FROM u'
        )
        head = '{"status": "running", "version": 1, "tasks": []}'
        fact = f'{{"type": "task_completed", "output": "{OUTPUT}"}}'

        async def one_client(run_id: str, count: int | None, until: float | None) -> tuple[list[float], int]:
            c = await asyncpg.connect(dsn)
            try:
                await c.execute(f'INSERT INTO "{schema}".heads VALUES ($1, 0, $2::jsonb)', run_id, head)
                stmt = await c.prepare(write)
                version, times = 0, []
                while (count is not None and version < count) or (
                    until is not None and time.perf_counter() < until
                ):
                    started = time.perf_counter()
                    await stmt.fetch(run_id, version, head, fact)
                    times.append(time.perf_counter() - started)
                    version += 1
                return times, version
            finally:
                await c.close()

        times, _ = await one_client("single", samples, None)
        rt = await repeat(lambda: conn.fetchval("SELECT 1"), samples)
        until = time.perf_counter() + 3.0
        results = await asyncio.gather(*(one_client(f"c{i}", None, until) for i in range(CONCURRENT)))
        commits = sum(n for _, n in results) / 3.0
        return median(times), median(rt), commits
    finally:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()


def fsync_floor(directory: Path, samples: int = 300) -> float:
    """Append + fsync of 1 KB to a file in ``directory``."""
    data = OUTPUT.encode()
    path = directory / "floor.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            os.write(fd, data)
            os.fsync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return median(times)


@dataclass
class McpFigures:
    status: float
    echo: float
    cold_start: float


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _mcp_session(client: Any, samples: int) -> tuple[float, float]:
    from mcp.types import TextContent

    view = (
        await client.call_tool("orchestrate_start", {"request": "bench", "chain": ["engineer"] * 3})
    ).structured_content
    while view["next_action"]["kind"] == "run_host_task":
        view = (
            await client.call_tool(
                "orchestrate_resume",
                {"run_id": view["run_id"], "task_id": view["next_action"]["task_id"], "output": OUTPUT},
            )
        ).structured_content
    assert view["status"] == "completed", view["status"]
    run_id = view["run_id"]
    status: list[float] = []
    echo: list[float] = []
    for _ in range(samples):
        started = time.perf_counter()
        result = await client.call_tool("run_status", {"run_id": run_id})
        status.append(time.perf_counter() - started)
        assert not result.is_error
        started = time.perf_counter()
        result = await client.call_tool("bench_echo", {"run_id": run_id})
        echo.append(time.perf_counter() - started)
        assert isinstance(result.content[0], TextContent) and len(result.content[0].text) == 1024
    return median(status), median(echo)


async def measure_mcp(transport: str, samples: int) -> McpFigures:
    from mcp import Client

    with tempfile.TemporaryDirectory(prefix="construct-bench-mcp-") as tmp:
        env = echo_client.server_env(Path(tmp))
        async with AsyncExitStack() as stack:
            started = time.perf_counter()
            if transport == "stdio":
                client = await echo_client.stdio_client(stack, Path(tmp), env)
            else:
                port = _free_port()
                errlog = stack.enter_context((Path(tmp) / "server.log").open("w"))
                process = await anyio.open_process(
                    [*echo_client.COMMAND, "--transport", "streamable-http", "--port", str(port)],
                    env=env,
                    stdout=errlog,
                    stderr=errlog,
                )

                async def stop() -> None:
                    process.terminate()
                    await process.wait()

                stack.push_async_callback(stop)
                while True:
                    try:
                        stream = await anyio.connect_tcp("127.0.0.1", port)
                        await stream.aclose()
                        break
                    except OSError:
                        await anyio.sleep(0.02)
                client = await stack.enter_async_context(Client(f"http://127.0.0.1:{port}/mcp"))
            cold = time.perf_counter() - started
            status, echo = await _mcp_session(client, samples)
    return McpFigures(status, echo, cold)


# ------------------------------------------------------------------------------------------- main


async def main() -> int:
    p = parser(__doc__, check="a target is missed")
    p.add_argument("--runs", type=int, default=5, help="runs per figure (the median is printed)")
    p.add_argument(
        "--issue",
        type=int,
        choices=(11, 23),
        default=None,
        help="with --check: count only the targets of this issue (all are printed)",
    )
    add_postgres_dsn(p)
    p.add_argument("--stores", default="memory,filesystem,sqlite,postgres")
    p.add_argument("--skip", default="", help="comma-separated: anchors, mcp, concurrent, host")
    p.add_argument(
        "--host-samples", type=int, default=100, help="inline runs per store for the stdio host-path rows"
    )
    args = p.parse_args()
    skip = set(names(args.skip))
    concurrent = "concurrent" not in skip

    wanted = set(names(args.stores))
    openers: dict[str, Opener] = {"memory": open_memory, "filesystem": open_filesystem, "sqlite": open_sqlite}
    openers = {name: opener for name, opener in openers.items() if name in wanted}
    dsn = args.postgres_dsn if "postgres" in wanted else ""
    if not dsn:
        print("postgres: skipped (no --postgres-dsn and no CONSTRUCT_TEST_POSTGRES_DSN)")
    elif await postgres_reachable(dsn):
        openers["postgres"] = postgres_opener(dsn)
    else:
        dsn = ""

    print(
        f"shape: a {STEPS}-step chain, 1 KB output per step, an instant in-process worker; "
        f"median of {args.runs} runs; {CONCURRENT} runs at once for the concurrent figures"
    )
    ours: dict[str, StoreFigures] = {}
    for name, opener in openers.items():
        ours[name] = await measure_construct(name, opener, args.runs, concurrent)
        f = ours[name]
        extra = (
            f", {f.concurrent:.0f} boundaries/s with {CONCURRENT} runs"
            if f.concurrent == f.concurrent
            else ""
        )
        print(
            f"  construct-mcp {name:<10} provider {ms(f.provider)}, inline {ms(f.inline)}{extra}", flush=True
        )

    with tempfile.TemporaryDirectory(prefix="construct-floor-") as tmp:
        fsync = fsync_floor(Path(tmp))
    pg_floor = pg_rt = pg_commits = float("nan")
    if dsn:
        pg_floor, pg_rt, pg_commits = await postgres_floor(dsn)
    print(
        f"  floors: append+fsync of 1 KB {ms(fsync)}; postgres CAS + 1 KB insert as one statement "
        f"{ms(pg_floor)}, one round trip {ms(pg_rt)}, {pg_commits:.0f} commits/s with {CONCURRENT} clients",
        flush=True,
    )

    anchors = AnchorFigures()
    dbos = AnchorFigures()
    if "anchors" in skip:
        anchors.skipped.append("LangGraph and DBOS (--skip anchors)")
    else:
        await measure_langgraph(anchors, dsn, args.runs, concurrent)
        await measure_dbos(dbos, dsn, args.runs, concurrent)
        anchors.skipped += dbos.skipped

    mcp: dict[str, McpFigures] = {}
    if "mcp" in skip:
        print("  mcp: skipped (--skip mcp)")
    else:
        for transport in ("stdio", "streamable-http"):
            mcp[transport] = await measure_mcp(transport, 200)

    host: dict[str, HostPathFigures] = {}
    if "host" in skip or "mcp" in skip:
        print("  host path over stdio: skipped (--skip)")
    else:
        for store in ("filesystem", "sqlite", "postgres"):
            if store in wanted and (store != "postgres" or dsn):
                host[store] = await measure_host_path(store, dsn, max(100, args.host_samples))

    # ---- the table
    stores = ("memory", "filesystem", "sqlite", "postgres")
    print()
    print(f"{'per boundary':<34}" + "".join(f"{s:>12}" for s in stores) + f"{'pg, 20 runs':>16}")

    def row(label: str, values: dict[str, float], rate: float | None) -> None:
        cells = "".join(f"{values[s] * 1000:>9.2f} ms" if s in values else f"{'—':>12}" for s in stores)
        tail = f"{rate:>11.0f} /s" if rate is not None and rate == rate else f"{'—':>16}"
        print(f"{label:<34}{cells}{tail}")

    pg = ours.get("postgres", StoreFigures())
    row("construct-mcp (provider path)", {s: f.provider for s, f in ours.items()}, pg.concurrent)
    row("construct-mcp (inline path)", {s: f.inline for s, f in ours.items()}, None)
    row("LangGraph (superstep, sync)", anchors.per_step, anchors.concurrent.get("postgres"))
    row("DBOS (step)", dbos.per_step, dbos.concurrent.get("postgres"))
    floors = {"filesystem": fsync}
    if dsn:
        floors["postgres"] = pg_floor
    row("floor (fsync 1 KB / one write)", floors, pg_commits if dsn else None)
    sq = ours.get("sqlite")
    if sq is not None and sq.concurrent == sq.concurrent:
        lg = anchors.concurrent.get("sqlite")
        print(
            f"sqlite, {CONCURRENT} runs at once: construct-mcp {sq.concurrent:.0f} boundaries/s"
            + (f", LangGraph {lg:.0f} supersteps/s" if lg else "")
        )
    if dsn:
        print(
            f"postgres, boundary at step 5 {ms(pg.step5)}, at step 50 {ms(pg.step50)} "
            f"(ratio {pg.step50 / pg.step5:.2f})"
        )
    for transport, m in mcp.items():
        print(
            f"mcp {transport}: run_status {ms(m.status)}, bench_echo {ms(m.echo)} "
            f"(ratio {m.status / m.echo:.2f}); cold start to an initialized session {m.cold_start:.2f} s"
        )
    if host:
        print("mcp stdio, the host's path (median / p90; bench_echo in the same session):")
    for store, h in host.items():
        echo = median(h.echo)
        print(
            f"  {store:<10} orchestrate_resume {ms(median(h.resume))} / {ms(p90(h.resume))} "
            f"({median(h.resume) / echo:.2f} x echo, {len(h.resume)} calls); "
            f"orchestrate_start (inline) {ms(median(h.start))} / {ms(p90(h.start))} "
            f"({median(h.start) / echo:.2f} x echo, {len(h.start)} calls); "
            f"bench_echo {ms(echo)} / {ms(p90(h.echo))}"
        )
    for skipped in anchors.skipped:
        print(f"skipped: {skipped}")

    # ---- ratios and targets
    checks: list[Check] = []

    def ratio_check(what: str, ours_value: float, theirs: float | None, factor: float) -> None:
        if theirs is None or ours_value != ours_value or theirs != theirs:
            checks.append(Check(what, None, "not measured"))
        else:
            checks.append(
                Check(what, theirs / ours_value >= factor, f"{theirs / ours_value:.2f} x (need {factor:g} x)")
            )

    for store in stores:
        if store in ours and store in anchors.per_step:
            times = anchors.per_step[store] / ours[store].provider
            print(f"LangGraph / construct-mcp, {store}: {times:.2f} x")
    ratio_check("postgres: 5 x faster than LangGraph", pg.provider, anchors.per_step.get("postgres"), 5)
    ratio_check("postgres: 5 x faster than DBOS", pg.provider, dbos.per_step.get("postgres"), 5)
    if dsn:
        checks.append(
            Check(
                "postgres: at most 2 x the floor of one durable write",
                pg.provider <= 2 * pg_floor,
                f"{pg.provider / pg_floor:.2f} x the floor",
            )
        )
        checks.append(
            Check(
                "postgres: step 50 at most 1.3 x step 5",
                pg.step50 <= 1.3 * pg.step5,
                f"{pg.step50 / pg.step5:.2f} x",
            )
        )
    else:
        checks.append(Check("postgres targets", None, "no Postgres"))
    if pg.concurrent == pg.concurrent:
        checks.append(
            Check(
                f"postgres, {CONCURRENT} runs: at least 1,000 boundaries/s",
                pg.concurrent >= 1000,
                f"{pg.concurrent:.0f} /s",
            )
        )
        # ratio_check compares "theirs / ours" for times; for rates it is ours / theirs.
        theirs = dbos.concurrent.get("postgres")
        if theirs is None:
            checks.append(Check(f"postgres, {CONCURRENT} runs: 5 x DBOS", None, "not measured"))
        else:
            checks.append(
                Check(
                    f"postgres, {CONCURRENT} runs: 5 x DBOS",
                    pg.concurrent >= 5 * theirs,
                    f"{pg.concurrent / theirs:.2f} x",
                )
            )
    for store, limit in (("sqlite", 1.5e-3), ("filesystem", 2e-3), ("memory", 0.3e-3)):
        if store in ours:
            checks.append(
                Check(
                    f"{store}: at most {limit * 1000:g} ms",
                    ours[store].provider <= limit,
                    ms(ours[store].provider),
                )
            )
    for transport, m in mcp.items():
        checks.append(
            Check(
                f"mcp {transport}: run_status at most 1.5 x bench_echo",
                m.status <= 1.5 * m.echo,
                f"{m.status / m.echo:.2f} x",
            )
        )
    issue23 = host_path_checks(ours, host)
    counted = {None: [*checks, *issue23], 11: checks, 23: issue23}[args.issue]
    scope = "" if args.issue is None else f"of issue {args.issue}"
    return conclude(
        [*checks, *issue23],
        check=args.check,
        counted=counted,
        scope=scope,
        title="targets",
    )


#: issue 23: a stdio resume at most this many times bench_echo, per store
RESUME_TARGETS = {"filesystem": 3.0, "sqlite": 2.0, "postgres": 2.0}
#: issue 23: a stdio start of an inline chain at most this many times bench_echo, every store
START_TARGET = 3.0
#: issue 23: the in-process inline boundary at most this many times the provider boundary
INLINE_TARGET = 1.5


def host_path_checks(ours: dict[str, StoreFigures], host: dict[str, HostPathFigures]) -> list[Check]:
    """Issue 23's targets (see the module docstring)."""
    checks: list[Check] = []
    for store, f in ours.items():
        ratio = f.inline / f.provider
        checks.append(
            Check(
                f"{store}: inline boundary at most {INLINE_TARGET:g} x the provider boundary",
                ratio <= INLINE_TARGET,
                f"{ratio:.2f} x ({ms(f.inline)} / {ms(f.provider)})",
            )
        )
    for store, limit in RESUME_TARGETS.items():
        h = host.get(store)
        resume_what = f"mcp stdio, {store}: resume at most {limit:g} x bench_echo"
        start_what = f"mcp stdio, {store}: inline start at most {START_TARGET:g} x bench_echo"
        if h is None:
            checks += [Check(resume_what, None, "not measured"), Check(start_what, None, "not measured")]
            continue
        echo = median(h.echo)
        resume, start = median(h.resume) / echo, median(h.start) / echo
        checks.append(Check(resume_what, resume <= limit, f"{resume:.2f} x"))
        checks.append(Check(start_what, start <= START_TARGET, f"{start:.2f} x"))
    return checks


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

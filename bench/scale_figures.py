"""The pure part of ``bench/scale.py``: the scenarios of issue 24, the figures one scenario yields,
their statistics, the targets ``--check`` holds them to and the tables they print as. Nothing here
starts a process or opens a connection (``tests/unit/bench/test_scale_figures.py`` tests it)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench.harness import Check

#: tasks per run: the three-task chain (architect, engineer, reviewer)
TASKS_PER_RUN = 3
#: issue 24's targets
TARGET_STARTS_PER_SECOND = 200.0
TARGET_FIRST_REQUEST_P99 = 1.0
TARGET_STATEMENTS_PER_SERVER = 5.0
TARGET_PLANTED_MS = 50.0
PLANTED_ROWS = 1_000_000


@dataclass(frozen=True)
class Scenario:
    """One point: ``servers`` servers driving ``concurrency`` runs each, ``runs`` runs of the
    three-task chain started by ``clients`` concurrent MCP clients, every provider call answered
    after ``delay`` seconds."""

    servers: int
    concurrency: int
    runs: int
    delay: float
    clients: int = 16

    @property
    def label(self) -> str:
        return f"{self.servers} x {self.concurrency}, {self.runs:,}, {self.delay:g} s"

    @property
    def capacity(self) -> int:
        """Runs driven at once across the servers."""
        return self.servers * self.concurrency

    @property
    def ideal_in_flight(self) -> int:
        return min(self.runs, self.capacity)

    @property
    def ideal_runs_per_second(self) -> float:
        """Every slot busy from the first start on: the runs go through in waves of ``capacity``,
        each wave taking its three calls' delays (the issue's "ideal" column)."""
        waves = math.ceil(self.runs / self.capacity)
        return self.runs / (waves * TASKS_PER_RUN * self.delay)

    @property
    def duration_target(self) -> float:
        """p99 run duration (start answer → completed) at most 3·D + 3 s."""
        return TASKS_PER_RUN * self.delay + 3.0


TARGET = Scenario(servers=4, concurrency=1000, runs=4000, delay=30.0, clients=16)
TABLE = (
    Scenario(servers=2, concurrency=64, runs=200, delay=2.0),
    Scenario(servers=4, concurrency=128, runs=1000, delay=5.0),
    Scenario(servers=4, concurrency=256, runs=2000, delay=10.0),
)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (``q`` in (0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def steady_window_end(now: float, first_at: Sequence[float], delay: float, margin: float = 0.5) -> float:
    """When the calls in flight at ``now`` start to be answered (less ``margin``): the earliest
    first call still waiting (called within the last ``delay`` seconds), plus ``delay``. Every
    run driven is waiting on its provider until then; ``now`` when no call is waiting."""
    waiting = [at for at in first_at if at > now - delay]
    return min(waiting) + delay - margin if waiting else now


def called_more_than_once(calls: Mapping[str, int]) -> list[str]:
    """The task keys the fake provider was called for more than once."""
    return sorted(key for key, n in calls.items() if n > 1)


@dataclass(frozen=True)
class Steady:
    """Upkeep while every run driven waits on its provider (a window with no boundary in it)."""

    seconds: float
    live_runs: int
    #: transactions per second per server (``pg_stat_database``: every statement of the store is
    #: its own transaction), and the statements seen starting by sampling ``pg_stat_activity``
    statements_per_server: float
    sampled_statements_per_server: float
    #: rows inserted, updated or deleted per second per server (``pg_stat_user_tables``)
    row_writes_per_server: float
    #: provider calls that started inside the window (0: no boundary was written in it)
    calls_started: int


@dataclass
class ClusterFigures:
    scenario: Scenario
    completed: int
    seconds: float  # first start sent → last run completed (or given up)
    peak_in_flight: int
    first_request: list[float]  # per run: start sent → its first provider request
    durations: list[float]  # per completed run: start answer → completed
    starts_seconds: float  # first start sent → last start answered
    failed_starts: int = 0  # orchestrate_start calls that failed (their runs count as not completed)
    twice: list[str] = field(default_factory=list)  # task keys called more than once
    #: why the records of the completed runs fail ``check_runs`` (None: they pass)
    record_problem: str | None = None
    steady: Steady | None = None
    #: server RSS growth per live run (KiB), and how many runs were live when it was read
    rss_per_live_run_kib: float | None = None
    rss_live_runs: int = 0
    #: Postgres CPU (ms) per 1,000 boundaries: this database's backends, and every postgres process
    cpu_ms_per_1000: float | None = None
    cluster_cpu_ms_per_1000: float | None = None

    @property
    def runs_per_second(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0

    @property
    def starts_per_second(self) -> float:
        """Starts answered per second (a failed one is not a start)."""
        started = self.scenario.runs - self.failed_starts
        return started / self.starts_seconds if self.starts_seconds > 0 else 0.0

    @property
    def boundaries(self) -> int:
        """Tasks completed: a boundary is one task's outcome recorded and the next one begun."""
        return self.completed * TASKS_PER_RUN

    @property
    def all_completed(self) -> bool:
        return self.completed == self.scenario.runs

    @property
    def each_task_once(self) -> bool:
        return not self.twice and self.record_problem is None


@dataclass(frozen=True)
class Timings:
    """Milliseconds per call of one operation, repeated."""

    name: str
    ms: tuple[float, ...]
    #: held to the planted target (else printed beside the ones that are)
    targeted: bool = True

    @property
    def p50(self) -> float:
        return percentile(self.ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.ms, 99)


@dataclass(frozen=True)
class PlantedFigures:
    rows: int
    live_runs: int
    held_runs: int
    plant_seconds: float
    timings: tuple[Timings, ...]


# ------------------------------------------------------------------------------------------ checks


def _ran(fig: ClusterFigures, what: str) -> list[Check]:
    sc = fig.scenario
    return [
        Check(
            f"{what}: all runs completed",
            fig.all_completed,
            f"{fig.completed:,}/{sc.runs:,}"
            + (f" ({fig.failed_starts:,} starts failed)" if fig.failed_starts else ""),
        ),
        Check(
            f"{what}: each task called once",
            fig.each_task_once,
            "yes"
            if fig.each_task_once
            else (f"called more than once: {', '.join(fig.twice[:5])}" if fig.twice else "")
            + (f" {fig.record_problem}" if fig.record_problem else ""),
        ),
        Check(
            f"{what}: p99 run duration ≤ 3·D + 3 s",
            bool(fig.durations) and percentile(fig.durations, 99) <= sc.duration_target,
            f"{percentile(fig.durations, 99):.1f} s (target {sc.duration_target:g} s)",
        ),
    ]


def target_checks(fig: ClusterFigures) -> list[Check]:
    what = f"target {fig.scenario.label}"
    steady = fig.steady
    return [
        *_ran(fig, what),
        Check(
            f"{what}: ≥ {TARGET_STARTS_PER_SECOND:g} starts/s",
            fig.starts_per_second >= TARGET_STARTS_PER_SECOND,
            f"{fig.starts_per_second:.0f}/s",
        ),
        Check(
            f"{what}: p99 start → first provider request ≤ {TARGET_FIRST_REQUEST_P99:g} s",
            bool(fig.first_request) and percentile(fig.first_request, 99) <= TARGET_FIRST_REQUEST_P99,
            f"{percentile(fig.first_request, 99):.2f} s",
        ),
        Check(
            f"{what}: steady state ≤ {TARGET_STATEMENTS_PER_SERVER:g} statements/s per server",
            None
            if steady is None
            # Held to the statements sampled in pg_stat_activity: the transactions of
            # pg_stat_database may count some of the busy start just before the window (a backend
            # reports its counts up to 10 s late: bench/scale_postgres.py); both are printed.
            else steady.sampled_statements_per_server <= TARGET_STATEMENTS_PER_SERVER,
            "no steady-state window was measured"
            if steady is None
            else f"{steady.sampled_statements_per_server:.1f}/s sampled "
            f"({steady.statements_per_server:.1f}/s of pg_stat_database transactions)",
        ),
    ]


def table_checks(figures: Sequence[ClusterFigures]) -> list[Check]:
    return [check for fig in figures for check in _ran(fig, fig.scenario.label)]


def planted_checks(fig: PlantedFigures) -> list[Check]:
    checks = []
    for t in (t for t in fig.timings if t.targeted):
        checks.append(
            Check(
                f"planted {fig.rows:,}: {t.name} p99 ≤ {TARGET_PLANTED_MS:g} ms",
                None if fig.rows < PLANTED_ROWS else t.p99 <= TARGET_PLANTED_MS,
                f"{t.p99:.1f} ms"
                + ("" if fig.rows >= PLANTED_ROWS else f" (the target is for {PLANTED_ROWS:,} rows)"),
            )
        )
    return checks


# ------------------------------------------------------------------------------------------ tables


def _s(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _or_na(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def issue_table(figures: Sequence[ClusterFigures]) -> list[str]:
    """The issue's table, one row per scenario."""
    lines = [
        "| servers x dispatch concurrency, runs, D | completed | runs/s (ideal) "
        "| calls in flight, max (ideal) | start → first provider request p50 / p99 |",
        "|---|---|---|---|---|",
    ]
    for f in figures:
        sc = f.scenario
        lines.append(
            f"| {sc.label} | {f.completed:,}/{sc.runs:,} | {f.runs_per_second:.1f} "
            f"({sc.ideal_runs_per_second:.1f}) | {f.peak_in_flight:,} ({sc.ideal_in_flight:,}) "
            f"| {_s(percentile(f.first_request, 50))} / {_s(percentile(f.first_request, 99))} s |"
        )
    return lines


def upkeep_table(figures: Sequence[ClusterFigures]) -> list[str]:
    """What the issue asks beside its table, one row per scenario."""
    lines = [
        "| scenario | p99 run duration (target) | starts/s | each task once "
        "| steady state: window, live runs | statements/s per server: pg_stat_database (sampled) "
        "| row writes/s per server | PG CPU per 1,000 boundaries (all postgres) | RSS per live run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        sc, st = f.scenario, f.steady
        steady = (
            "no window (calls end before every run waits)"
            if st is None
            else f"{st.seconds:.1f} s, {st.live_runs:,}"
            + ("" if st.calls_started == 0 else f" ({st.calls_started} calls started in it)")
        )
        statements = (
            "n/a"
            if st is None
            else f"{st.statements_per_server:.1f} ({st.sampled_statements_per_server:.1f})"
        )
        writes = "n/a" if st is None else f"{st.row_writes_per_server:.1f}"
        cpu = (
            f"{_or_na(f.cpu_ms_per_1000, '.0f')} ms ({_or_na(f.cluster_cpu_ms_per_1000, '.0f')} ms)"
            if f.cpu_ms_per_1000 is not None
            else "n/a"
        )
        rss = (
            "n/a"
            if f.rss_per_live_run_kib is None
            else f"{f.rss_per_live_run_kib:.0f} KiB ({f.rss_live_runs:,} live)"
        )
        lines.append(
            f"| {sc.label} | {_s(percentile(f.durations, 99))} s ({sc.duration_target:g} s) "
            f"| {f.starts_per_second:.0f} | {'yes' if f.each_task_once else 'NO'} | {steady} "
            f"| {statements} | {writes} | {cpu} | {rss} |"
        )
    return lines


def planted_table(fig: PlantedFigures) -> list[str]:
    lines = [
        f"planted {fig.rows:,} ended runs in {fig.plant_seconds:.0f} s; {fig.live_runs} runs queued, "
        f"{fig.held_runs} of them leased by another owner",
        "| call | p50 | p99 | calls |",
        "|---|---|---|---|",
    ]
    lines += [f"| {t.name} | {t.p50:.1f} ms | {t.p99:.1f} ms | {len(t.ms)} |" for t in fig.timings]
    return lines

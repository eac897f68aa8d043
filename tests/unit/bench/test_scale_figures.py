"""The pure part of the scale bench (``bench/scale_figures.py``): its statistics, the window it
calls a steady state, the targets ``--check`` holds the figures to, and the tables they print as."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from bench.harness import missed
from bench.scale import parse
from bench.scale_figures import (
    TABLE,
    TARGET,
    ClusterFigures,
    PlantedFigures,
    Scenario,
    Steady,
    Timings,
    called_more_than_once,
    issue_table,
    percentile,
    planted_checks,
    planted_table,
    steady_window_end,
    table_checks,
    target_checks,
    upkeep_table,
)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(n) for n in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert percentile([7.0], 50) == 7.0
    assert math.isnan(percentile([], 99))


def test_the_ideal_columns_are_the_issues() -> None:
    # The issue's table: 16.7, 33.3, 33.3 runs/s; 128, 512, 1,024 calls in flight.
    assert [round(sc.ideal_runs_per_second, 1) for sc in TABLE] == [16.7, 33.3, 33.3]
    assert [sc.ideal_in_flight for sc in TABLE] == [128, 512, 1024]
    assert TARGET.ideal_in_flight == 4000
    assert TARGET.duration_target == 93.0
    assert TABLE[0].label == "2 x 64, 200, 2 s"


def test_a_steady_window_ends_when_the_oldest_waiting_call_is_answered() -> None:
    # Calls first made at 100, 103 and 104 with D = 10: the one of 100 ends at 110.
    assert steady_window_end(105.0, [100.0, 103.0, 104.0], 10.0, margin=0.5) == 109.5
    # A call made more than D ago has been answered: it no longer bounds the window.
    assert steady_window_end(111.0, [100.0, 103.0, 104.0], 10.0, margin=0.5) == 112.5
    assert steady_window_end(200.0, [100.0], 10.0) == 200.0


def test_keys_called_more_than_once() -> None:
    assert called_more_than_once({"r1/architect": 1, "r2/engineer": 2, "r0/reviewer": 3}) == [
        "r0/reviewer",
        "r2/engineer",
    ]


def figures(sc: Scenario = TARGET, **changes: object) -> ClusterFigures:
    """A target run that meets every target; ``changes`` spoil one."""
    good = ClusterFigures(
        scenario=sc,
        completed=sc.runs,
        seconds=100.0,
        peak_in_flight=sc.ideal_in_flight,
        first_request=[0.2] * 99 + [0.9],
        durations=[sc.duration_target - 2] * 100,
        starts_seconds=sc.runs / 250,
        steady=Steady(
            seconds=8.0,
            live_runs=sc.runs,
            statements_per_server=3.0,
            sampled_statements_per_server=2.5,
            row_writes_per_server=100.0,
            calls_started=0,
        ),
        rss_per_live_run_kib=80.0,
        rss_live_runs=sc.runs,
        cpu_ms_per_1000=120.0,
        cluster_cpu_ms_per_1000=150.0,
    )
    return replace(good, **changes)  # type: ignore[arg-type]


def test_a_run_within_every_target_passes_the_check() -> None:
    checks = target_checks(figures())
    assert len(checks) == 6
    assert missed(checks) == [], checks


@pytest.mark.parametrize(
    ("changes", "what"),
    [
        ({"completed": 3999}, "all runs completed"),
        ({"completed": 3990, "failed_starts": 10}, "all runs completed"),
        ({"twice": ["r7/engineer"]}, "each task called once"),
        ({"record_problem": "records: ('r7', ...)"}, "each task called once"),
        ({"durations": [91.0] * 98 + [94.0, 94.0]}, "p99 run duration"),
        ({"durations": []}, "p99 run duration"),
        ({"starts_seconds": 4000 / 199}, "starts/s"),
        ({"first_request": [0.2] * 98 + [1.1, 1.2]}, "first provider request"),
    ],
)
def test_each_missed_target_fails_the_check(changes: dict[str, Any], what: str) -> None:
    failed = missed(target_checks(figures(**changes)))
    assert [c.what for c in failed] == [c.what for c in target_checks(figures()) if what in c.what]


def test_the_steady_state_target_holds_the_sampled_statements_and_is_not_checked_without_a_window() -> None:
    steady = figures().steady
    assert steady is not None
    failed = missed(target_checks(figures(steady=replace(steady, sampled_statements_per_server=5.1))))
    assert [c.what for c in failed] == [
        "target 4 x 1000, 4,000, 30 s: steady state ≤ 5 statements/s per server"
    ]
    # pg_stat_database's transactions are printed beside it (they may count the start before it).
    late = target_checks(figures(steady=replace(steady, statements_per_server=40.0)))
    assert missed(late) == []
    assert "2.5/s sampled (40.0/s of pg_stat_database transactions)" in [c.detail for c in late]
    unmeasured = target_checks(figures(steady=None))
    assert missed(unmeasured) == []
    assert [c.ok for c in unmeasured if "steady" in c.what] == [None]


def test_the_table_points_are_held_to_completion_and_run_duration() -> None:
    good = [figures(sc) for sc in TABLE]
    assert missed(table_checks(good)) == []
    late = [*good[:2], figures(TABLE[2], completed=1279, durations=[30.0] * 1279)]
    assert [c.what for c in missed(table_checks(late))] == ["4 x 256, 2,000, 10 s: all runs completed"]


def planted(rows: int, claim_ms: float) -> PlantedFigures:
    return PlantedFigures(
        rows=rows,
        live_runs=100,
        held_runs=50,
        plant_seconds=60.0,
        timings=(
            Timings("claim", (5.0,) * 98 + (claim_ms,) * 2),
            Timings("runs_list", (9.0,) * 100),
            Timings("runs_list, one status", (99.0,) * 100, targeted=False),
        ),
    )


def test_the_planted_targets_are_checked_at_a_million_rows_only() -> None:
    assert missed(planted_checks(planted(1_000_000, 49.0))) == []
    assert [c.what for c in missed(planted_checks(planted(1_000_000, 51.0)))] == [
        "planted 1,000,000: claim p99 ≤ 50 ms"
    ]
    small = planted_checks(planted(100_000, 51.0))
    assert [c.ok for c in small] == [None, None]


def test_the_tables_render_one_row_per_scenario() -> None:
    lines = issue_table(
        [figures(TABLE[0], completed=200, seconds=20.0, first_request=[1.25] * 98 + [12.1] * 2)]
    )
    assert lines[0].startswith("| servers x dispatch concurrency, runs, D | completed | runs/s (ideal) |")
    assert lines[2] == "| 2 x 64, 200, 2 s | 200/200 | 10.0 (16.7) | 128 (128) | 1.25 / 12.1 s |"
    upkeep = upkeep_table([figures(), figures(steady=None, rss_per_live_run_kib=None, cpu_ms_per_1000=None)])
    assert len(upkeep) == 4
    assert "| 8.0 s, 4,000 | 3.0 (2.5) | 100.0 | 120 ms (150 ms) | 80 KiB (4,000 live) |" in upkeep[2]
    assert "no window" in upkeep[3] and upkeep[3].endswith("| n/a | n/a | n/a | n/a |")
    rows = planted_table(planted(1_000_000, 40.0))
    assert rows[3] == "| claim | 5.0 ms | 40.0 ms | 100 |"


def test_free_options_make_a_custom_scenario() -> None:
    dsn = ["--postgres-dsn", "postgresql://x@h/db"]
    args = parse(["--servers", "3", "--delay", "0.5", *dsn])
    assert (args.scenario, args.servers, args.concurrency, args.runs, args.delay, args.clients) == (
        "custom",
        3,
        64,
        200,
        0.5,
        16,
    )
    assert parse(dsn).scenario == "table"
    assert parse(["--scenario", "planted", *dsn]).scenario == "planted"
    with pytest.raises(SystemExit):
        parse(["--scenario", "target", "--runs", "5", *dsn])


def test_failed_starts_are_not_starts() -> None:
    fig = figures(starts_seconds=10.0, failed_starts=2000, completed=2000)
    assert fig.starts_per_second == 200.0
    detail = next(c.detail for c in target_checks(fig) if "all runs completed" in c.what)
    assert detail == "2,000/4,000 (2,000 starts failed)"

"""The harness every bench shares (``bench/harness.py``): what it times, the order it alternates
variants in, and how ``--check`` decides and prints."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import pytest

from bench.harness import Check, alternate, check_line, conclude, median, missed, ms, p90, parser, repeat


def test_figures_of_nothing_are_not_a_number() -> None:
    assert math.isnan(median([])) and math.isnan(p90([1.0]))
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert ms(0.00123) == "1.23 ms"


async def test_alternation_interleaves_the_variants_round_by_round() -> None:
    order: list[str] = []

    def variant(name: str) -> Callable[[], Awaitable[str]]:
        async def run() -> str:
            order.append(name)
            return f"{name}{len(order)}"

        return run

    results = await alternate({"a": variant("a"), "b": variant("b")}, 3)
    assert order == ["a", "b", "a", "b", "a", "b"]
    assert results == {"a": ["a1", "a3", "a5"], "b": ["b2", "b4", "b6"]}


async def test_repeat_leaves_the_warm_up_untimed_and_hands_each_result_on() -> None:
    calls: list[int] = []
    after: list[int] = []

    async def call() -> int:
        calls.append(len(calls))
        return len(calls)

    async def then(result: int) -> None:
        after.append(result)

    seconds = await repeat(call, 4, warmup=2, after=then)
    assert len(seconds) == 4 and all(s >= 0 for s in seconds)
    assert len(calls) == 6 and after == [1, 2, 3, 4, 5, 6]


def test_a_target_prints_as_its_verdict_what_it_holds_and_its_figure() -> None:
    assert check_line(Check("sqlite: at most 1.5 ms", True, "0.66 ms")) == (
        "  [        met] sqlite: at most 1.5 ms: 0.66 ms"
    )
    assert check_line(Check("x", False, "y")) == "  [     MISSED] x: y"
    assert check_line(Check("x", None, "no Postgres")) == "  [not checked] x: no Postgres"


CHECKS = [Check("met", True, "1"), Check("missed", False, "2"), Check("unmeasured", None, "3")]


def test_a_target_not_measured_is_not_a_miss() -> None:
    assert [c.what for c in missed(CHECKS)] == ["missed"]


@pytest.mark.parametrize(
    ("check", "counted", "status", "last"),
    [
        (False, None, 0, "  [not checked] unmeasured: 3"),
        (True, None, 1, "--check: 1 target(s) missed"),
        (True, CHECKS[:1], 0, "--check: every target of the scope met"),
        (True, CHECKS[::2], 0, "--check: no target of the scope missed (1 not checked)"),
    ],
)
def test_conclude_prints_every_target_and_with_check_decides(
    capsys: pytest.CaptureFixture[str], check: bool, counted: list[Check] | None, status: int, last: str
) -> None:
    scope = "of the scope" if counted else ""
    assert conclude(CHECKS, check=check, counted=counted, scope=scope) == status
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["", "targets:", "  [        met] met: 1"]
    assert lines[-1] == last


def test_the_check_flag_is_the_same_on_every_bench() -> None:
    p = parser("doc", check="a target is missed")
    assert p.parse_args(["--check"]).check is True
    assert "--check" not in parser("doc").format_help()

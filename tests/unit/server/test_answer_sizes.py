"""Answers a host model can afford: the scenarios of ``bench/answer_sizes.py`` against their targets.
Sizes are deterministic, so they are asserted here; the bench prints them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.answer_sizes import (
    EMPTY_ANSWER_CHARS,
    MAX_RATIO,
    MAX_TOOLS_LIST_BYTES,
    TASK_ANSWER_OVERHEAD,
    measure,
    measure_compact,
)


async def test_the_answer_carrying_the_reviewers_prompt_carries_the_outputs_once(tmp_path: Path) -> None:
    figures = await measure(tmp_path, output_chars=100_000)
    # The prompt carries both outputs (so it is over 200k characters); the answer carries the prompt.
    assert figures.prompt_chars > 200_000
    assert figures.text_ratio <= MAX_RATIO, figures
    assert figures.structured_ratio <= MAX_RATIO, figures


async def test_tools_list_fits_a_small_budget(tmp_path: Path) -> None:
    figures = await measure(tmp_path, output_chars=10)
    assert figures.tools_list_bytes <= MAX_TOOLS_LIST_BYTES, figures


@pytest.mark.parametrize("approve_before", [(), ("engineer",)])
async def test_every_compact_answer_is_within_its_target(
    tmp_path: Path, approve_before: tuple[str, ...]
) -> None:
    answers = await measure_compact(tmp_path, approve_before)
    # The scenario went through every kind of answer: host tasks, the gate (if any), the end.
    assert [a.call.split()[0] for a in answers][-2:] == ["orchestrate_resume", "run_status"]
    assert sum(1 for a in answers if a.prompt_chars) == 3
    assert sum(1 for a in answers if a.call.startswith("orchestrate_approve")) == len(approve_before)
    for a in answers:
        limit = a.prompt_chars + TASK_ANSWER_OVERHEAD if a.prompt_chars else EMPTY_ANSWER_CHARS
        assert a.chars <= limit, a

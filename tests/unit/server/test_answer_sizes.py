"""Answers a host model can afford: the scenario of ``bench/answer_sizes.py`` (the default chain,
inline, two 100k-character outputs) against its targets. Sizes are deterministic, so they are
asserted here; the bench prints them."""

from __future__ import annotations

from pathlib import Path

from bench.answer_sizes import MAX_RATIO, MAX_TOOLS_LIST_BYTES, measure


async def test_the_answer_carrying_the_reviewers_prompt_carries_the_outputs_once(tmp_path: Path) -> None:
    figures = await measure(tmp_path, output_chars=100_000)
    # The prompt carries both outputs (so it is over 200k characters); the answer carries the prompt.
    assert figures.prompt_chars > 200_000
    assert figures.text_ratio <= MAX_RATIO, figures
    assert figures.structured_ratio <= MAX_RATIO, figures


async def test_tools_list_fits_a_small_budget(tmp_path: Path) -> None:
    figures = await measure(tmp_path, output_chars=10)
    assert figures.tools_list_bytes <= MAX_TOOLS_LIST_BYTES, figures

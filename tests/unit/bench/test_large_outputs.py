"""bench/large_outputs.py runs as its page says, and what it checks besides time holds: no answer
over the bound, the parts join into the recorded prompts (one run, filesystem store; its timed
target is the benchmark's, not the test's)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_one_run_with_60000_character_outputs_stays_under_the_bound() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "large_outputs.py"), "--runs", "1", "--stores", "filesystem"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    largest = re.search(r"largest answer +([\d,]+) chars with max_answer_chars 10,000; ([\d,]+)", done.stdout)
    assert largest is not None, done.stdout
    bounded, whole = (int(g.replace(",", "")) for g in largest.groups())
    assert bounded <= 10_000 < 120_000 < whole  # the reviewer's prompt whole is 124 KB and more
    # Its targets besides time: met (the timed one is the benchmark's to hold).
    assert "[        met] filesystem: every answer at most 10,000 chars" in done.stdout, done.stdout
    assert "[        met] filesystem: the parts join into the recorded prompts" in done.stdout, done.stdout
    assert re.search(r"parts per long prompt: \[\d+, \d+\]", done.stdout), done.stdout

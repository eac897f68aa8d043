"""The documentation's worked examples, run the way a person follows them: each page's
``<!-- session -->`` blocks in order, in a fresh home: a ``toml`` block becomes its
``construct.toml`` (the reader edits the file), a ``console`` block's ``$`` commands run with the real
``construct-mcp``, and the lines the page shows under each command must be printed, in that order
(a ``...`` line stands for lines left out). What differs between two runs of the example is
compared as its kind: run ids (the page's run id in a command is the run the example started),
content hashes, minutes and seconds."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from docs.fenced_blocks import Block, all_blocks
from tests.acceptance.test_cli import cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = re.compile(r"run-[0-9a-f]{12}-[0-9a-f]{16}")
_VARYING = (
    (RUN_ID, "RUN"),
    (re.compile(r"\b[0-9a-f]{12}\b"), "HASH"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\dZ"), "TIME"),
    (re.compile(r"\d+\.\d+ s\b"), "S s"),
)


def sessions() -> dict[str, list[Block]]:
    """Each page's session blocks, in order."""
    found: dict[str, list[Block]] = {}
    for block in all_blocks(ROOT):
        if block.marker == "session":
            found.setdefault(block.path, []).append(block)
    return found


SESSIONS = sessions()


def normal(line: str) -> str:
    for pattern, kind in _VARYING:
        line = pattern.sub(kind, line)
    return line.rstrip()


def steps(block: Block) -> list[tuple[str, list[str]]]:
    """A console block's commands, each with the lines shown under it."""
    found: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            found.append((line[2:], []))
        elif found:
            found[-1][1].append(line)
    return found


def assert_shown(where: str, command: str, shown: list[str], printed: str) -> None:
    """Every line ``shown`` (but ``...``) is among ``printed``'s lines, in order."""
    lines = [normal(line) for line in printed.splitlines()]
    at = 0
    for expected in (normal(line) for line in shown if line.strip() != "..."):
        try:
            at = lines.index(expected, at) + 1
        except ValueError:
            pytest.fail(f"{where}: `{command}` did not print {expected!r}; it printed:\n{printed}")


def test_the_pages_have_worked_examples() -> None:
    assert "docs/chains.md" in SESSIONS


@pytest.mark.parametrize("page", sorted(SESSIONS))
def test_a_worked_example_runs_as_the_page_shows(page: str, tmp_path: Path) -> None:
    run_ids: dict[str, str] = {}  # the page's run id -> the one this run of the example made
    for block in SESSIONS[page]:
        if block.lang == "toml":
            (tmp_path / "construct.toml").write_text(block.text)
            continue
        assert block.lang == "console", f"{block.where}: a session block is toml or console"
        for command, shown in steps(block):
            words = shlex.split(RUN_ID.sub(lambda m: run_ids.get(m.group(0), m.group(0)), command))
            assert words[0] == "construct-mcp", f"{block.where}: {command}"
            done = cli(tmp_path, *words[1:])
            assert done.returncode == 0, f"{block.where}: `{command}` failed:\n{done.stderr}"
            for page_id, printed_id in zip(
                RUN_ID.findall(" ".join(shown)), RUN_ID.findall(done.stdout), strict=False
            ):
                run_ids.setdefault(page_id, printed_id)
            assert_shown(block.where, command, shown, done.stdout)

"""The four host applications (Claude Code, Codex CLI, Gemini CLI, opencode), each run headless
against the scripted model (:mod:`tests.hosts.scripted_model`) and configured with the block
docs/hosts.md shows for it (:mod:`tests.hosts.launch`).

For each host: the default chain with short outputs, the default chain and the review-loop with
60,000-character outputs. Each run must end ``completed`` (``construct-mcp runs list --json`` on its
home) and the prompts the model received must be those the run recorded: the SHA-256 of system, NUL,
user of each task equals its ``host_task_prepared.prompt_sha256`` (``runs export``). The size of
every tool result the model saw is printed (``-s`` shows it) and none is longer than the server's
``max_answer_chars`` (its default, 10,000): a longer prompt comes in parts (``task_prompt``).

The host CLIs are npm packages pinned in ``tests/hosts/package.json`` (``npm ci`` there; ``.ci/run``
does it). Without them the tests skip locally and fail with ``CI=true``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.launch import HOSTS, missing, run_host, server_exe
from tests.hosts.scripted_model import LONG_OUTPUT_CHARS, SHORT_OUTPUT_CHARS, ScriptedModel, prompt_sha256

pytestmark = pytest.mark.slow

#: One host run's bound (the slowest, opencode, took 5.6 s with short outputs).
RUN_TIMEOUT = 120.0

#: The server's default ``max_answer_chars``: no answer the model sees is longer.
ANSWER_BOUND = 10_000

CASES = [
    pytest.param("default", SHORT_OUTPUT_CHARS, id="default-short"),
    pytest.param("default", LONG_OUTPUT_CHARS, id="default-60k"),
    pytest.param("review-loop", LONG_OUTPUT_CHARS, id="review-loop-60k"),
]


def _available(host: str) -> None:
    reason = missing(host)
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but the {host} host test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def _cli(*args: str) -> str:
    done = subprocess.run([str(server_exe()), *args], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def _facts(value: Any) -> Iterator[dict[str, Any]]:
    """Every object with a ``type`` in an export line, wherever it is nested."""
    if isinstance(value, dict):
        if isinstance(value.get("type"), str):
            yield value
        for item in value.values():
            yield from _facts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _facts(item)


@pytest.mark.parametrize(("chain", "output_chars"), CASES)
@pytest.mark.parametrize("host", HOSTS)
def test_host_runs_chain(host: str, chain: str, output_chars: int, tmp_path: Path) -> None:
    _available(host)
    home = tmp_path / "construct"
    home.mkdir()
    with ScriptedModel(output_chars) as model:
        outcome = run_host(host, model.base_url, chain, tmp_path, home, RUN_TIMEOUT)
    seen = model.seen
    report = (
        f"{host} {chain} ({output_chars} chars): exit {outcome.returncode} in {outcome.seconds:.1f} s\n"
        + "".join(f"  request {r.method} {r.path} {r.chars} chars: {r.turn}\n" for r in model.requests)
        + "".join(
            f"  seen {s.tool}: {s.shown_chars} chars shown, answer {s.answer_chars} chars, {s.kind}"
            + (f" {s.head!r}" if s.answer_chars is None else "")
            + "\n"
            for s in seen
        )
    )
    print(report)
    assert outcome.returncode == 0, f"{report}\nstderr: {outcome.stderr[-3000:]}"
    sizes = [s.answer_chars for s in seen]
    assert sizes and all(n is not None and n <= ANSWER_BOUND for n in sizes), report
    runs = json.loads(_cli("runs", "list", "--home", str(home), "--json"))["runs"]
    assert len(runs) == 1, report
    run_id = runs[0]["run_id"]
    assert runs[0]["status"] == "completed", report
    export = _cli("runs", "export", run_id, "--home", str(home))
    recorded = {
        fact["task_id"]: fact["prompt_sha256"]
        for line in export.splitlines()
        if line.strip()
        for fact in _facts(json.loads(line))
        if fact["type"] == "host_task_prepared"
    }
    received = {task: prompt_sha256(system, user) for task, (system, user) in model.prompts.items()}
    assert recorded, export[:2000]
    assert received == recorded, (
        f"{report}\nprompts received: {sorted(received)}, recorded: {sorted(recorded)}"
    )
    if chain == "review-loop":
        assert {"reviewer", "reviewer~2", "engineer~2"} <= set(recorded), sorted(recorded)
    # The run records that the host read every part of each prompt handed out in parts.
    reads = {
        fact["task_id"]: fact.get("prompt_read")
        for line in export.splitlines()
        if line.strip()
        for fact in _facts(json.loads(line))
        if fact["type"] == "host_output_submitted"
    }
    assert set(reads) == set(recorded), sorted(reads)
    parted = {task: read for task, read in reads.items() if read is not None}
    assert all(read["read"] == read["chars"] for read in parted.values()), parted
    assert bool(parted) == (output_chars == LONG_OUTPUT_CHARS), parted

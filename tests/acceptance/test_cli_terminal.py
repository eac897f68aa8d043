"""The command line where a person uses it: ``construct-mcp`` in a pseudo-terminal
(:mod:`tests.acceptance.terminal`), a provider backend served by the fake provider.

* A long ``runs start`` shows its run id first, then each task as it starts and ends and the text
  the provider streams, the run at the end (``--quiet``: the run only).
* Ctrl-C mid-run says the run, what was recorded and the command that continues it (exit 130);
  afterwards ``runs status``, ``runs list`` and ``runs tail`` say nobody drives the run, and
  ``runs resume`` continues it to the end.
* A host task's step prints its prompt's path, not the prompt, and ends with the ``next:`` command.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.harness import REPO, SERVER_COMMAND
from tests.acceptance.terminal import Terminal
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

WRITER = "".join(f"line {i} of the poem\n" for i in range(40))
SLOW = {"text": WRITER, "chunk_chars": 10, "chunk_delay_seconds": 0.1}


def provider_env(home: Path, fake: FakeProvider) -> dict[str, str]:
    return {
        "PYTHONPATH": str(REPO),
        "CONSTRUCT_HOME": str(home),
        "CONSTRUCT_WORKER_BACKEND": "provider",
        "CONSTRUCT_MODEL": "claude-test-1",
        "CONSTRUCT_ANTHROPIC_BASE_URL": fake.base_url,
        "ANTHROPIC_API_KEY": "sk-ant-test-terminal",
        "CONSTRUCT_LEASE_TTL_SECONDS": "2",
    }


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVER_COMMAND, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_long_start_shows_its_run_id_first_then_each_task_and_the_streamed_text(tmp_path: Path) -> None:
    with FakeProvider({"writer": [SLOW, {"text": "Short."}], "reviewer": [{"text": "Reads well."}]}) as fake:
        env = provider_env(tmp_path, fake)
        with Terminal(["runs", "start", "Write a poem.", "--chain", "writer,reviewer"], env) as term:
            first = term.expect(r"run (run-\S+) started: writer -> reviewer", timeout=20)
            run_id = first.group(1)
            # While the writer's call is still streaming, its text is on the screen already.
            term.expect(r"writer> line 0 of the poem")
            assert "writer: done" not in term.screen
            assert term.wait() == 0
        screen = term.screen
        order = [
            f"run {run_id} started",
            "writer: started (attempt 1",
            "writer> line 0 of the poem",
            "line 39 of the poem",
            "writer: done in ",
            "reviewer: started",
            "reviewer: done in ",
            f"run {run_id}: completed",
        ]
        at = [screen.find(part) for part in order]
        assert all(i >= 0 for i in at) and at == sorted(at), screen
        assert re.search(r"writer: done in \d+\.\ds \(\d+ chars\)", screen), screen
        assert screen.rstrip().splitlines()[-1].startswith("the run is completed"), screen

        # --quiet: the run at the end only.
        with Terminal(["runs", "start", "Again.", "--specialists", "writer", "--quiet"], env) as term:
            assert term.wait() == 0
        assert term.screen.startswith("run run-") and ": completed (terminal)" in term.screen.splitlines()[0]
        assert "started" not in term.screen and "writer>" not in term.screen


def test_ctrl_c_mid_run_says_how_to_continue_and_nobody_is_said_to_work_on_the_run(tmp_path: Path) -> None:
    with FakeProvider({"writer": [{**SLOW, "chunk_delay_seconds": 0.5}, {"text": "A short poem."}]}) as fake:
        env = provider_env(tmp_path, fake)
        with Terminal(["runs", "start", "Write a poem.", "--chain", "writer,reviewer"], env) as term:
            run_id = term.expect(r"run (run-\S+) started")[1]
            term.expect(r"writer> line 0")  # mid-call
            term.interrupt()
            assert term.wait() == 130
        screen = term.screen
        assert f"interrupted: run {run_id} is left running; nobody drives it now." in screen, screen
        assert "recorded: writer's call was cut off" in screen
        resume = f"construct-mcp runs resume {run_id} --home {tmp_path}"
        assert screen.rstrip().endswith(f"continue it: {resume}"), screen

        status = cli(env, "runs", "status", run_id)
        assert status.returncode == 0
        assert "nobody is driving this run" in status.stdout and resume in status.stdout, status.stdout
        assert "working on it" not in status.stdout
        listing = cli(env, "runs", "list")
        assert "nobody drives it (last write " in listing.stdout and resume in listing.stdout, listing.stdout

        # tail does not wait for events that will not come.
        with Terminal(["runs", "tail", run_id], env) as term:
            assert term.wait(timeout=30) == 1
        assert "nobody is driving this run" in term.screen and resume in term.screen, term.screen

        # The command it said continues the run to its end.
        with Terminal(["runs", "resume", run_id, "--home", str(tmp_path)], env) as term:
            assert term.wait() == 0
        assert f"run {run_id} resumed" in term.screen
        assert "writer: started (attempt 2" in term.screen
        assert f"run {run_id}: completed" in term.screen, term.screen


def test_a_host_step_prints_where_its_prompt_is_and_ends_with_the_next_command(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(REPO), "CONSTRUCT_HOME": str(tmp_path)}
    with Terminal(["runs", "start", "Build a tiny todo app"], env) as term:
        assert term.wait() == 0
    lines = term.screen.rstrip().splitlines()
    run_id = re.search(r"^run (run-\S+): awaiting_host", term.screen, re.M)[1]  # type: ignore[index]
    assert "--- system prompt ---" not in term.screen
    assert len(lines) <= 15, term.screen
    assert lines[-1].strip() == (
        f"construct-mcp runs resume {run_id} --task-id architect --output-file ANSWER.md"
    ), term.screen
    where = re.search(r"its prompt \((\d+) lines\): (\S+)", term.screen)
    assert where is not None, term.screen
    prompt = Path(where[2]).read_text()
    assert prompt.startswith("--- system prompt ---\n# Role: Architect") and "Build a tiny todo app" in prompt

    with Terminal(["runs", "status", run_id, "--show-prompt"], env) as term:
        assert term.wait() == 0
    assert "--- system prompt ---" in term.screen and "# Role: Architect" in term.screen
    assert term.screen.rstrip().splitlines()[-1].strip().endswith("--output-file ANSWER.md")

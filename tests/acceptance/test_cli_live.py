"""``runs tail`` and ``runs watch`` as a user runs them: real processes on a temp home."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from tests.acceptance.store_targets import BACKENDS, store_target
from tests.acceptance.test_cli import cli, ok_json

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", BACKENDS)
async def test_tail_prints_a_finished_runs_events_and_exits_0(tmp_path: Path, backend: str) -> None:
    async with store_target(backend, tmp_path / "target") as target:
        await anyio.to_thread.run_sync(lambda: tail_a_finished_run(tmp_path, "--store", target.url))


def tail_a_finished_run(tmp_path: Path, *store: str) -> None:
    run_id = ok_json(tmp_path, "runs", "start", "Tail me", "--specialists", "writer", *store)["run_id"]
    done = ok_json(
        tmp_path, "runs", "resume", run_id, "--task-id", "writer", "--output", "The draft.", *store
    )
    assert done["status"] == "completed"

    proc = cli(tmp_path, "runs", "tail", run_id, "--from-start", *store)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"run {run_id} (custom): completed"
    assert lines[1].startswith("#1 ") and "run_created" in lines[1]
    completed = next(line for line in lines if "task_completed" in line)
    assert "(10 chars: run://" in completed and "/tasks/writer/output)" in completed
    assert "run_finished" in lines[-2]
    assert lines[-1] == f"run {run_id} ended: completed"

    # --json: one event per line, the run_events shape.
    proc = cli(tmp_path, "runs", "tail", run_id, "--from-start", "--json", *store)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "run_finished"

    proc = cli(tmp_path, "runs", "tail", "run-nope", *store)
    assert proc.returncode == 1 and proc.stderr.startswith("run_not_found: ")


def test_watch_once_lists_the_live_runs(tmp_path: Path) -> None:
    waiting = ok_json(tmp_path, "runs", "start", "Still going", "--chain", "architect,engineer")["run_id"]
    gated = ok_json(
        tmp_path, "runs", "start", "Gated", "--specialists", "writer", "--approve-before", "writer"
    )
    ended = ok_json(tmp_path, "runs", "start", "Ended", "--specialists", "writer")["run_id"]
    assert ok_json(tmp_path, "runs", "cancel", ended)["status"] == "cancelled"

    proc = cli(tmp_path, "runs", "watch", "--once")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("2 live runs at ")
    by_run = {line.split()[0]: line for line in lines[1:]}
    assert set(by_run) == {waiting, gated["run_id"]}
    assert "awaiting_host" in by_run[waiting] and "tasks 0/2" in by_run[waiting]
    assert "waits for host output for task architect" in by_run[waiting]
    assert "waits for approval of gate before:writer" in by_run[gated["run_id"]]
    assert ended not in proc.stdout

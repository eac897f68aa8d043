"""``runs export`` / ``runs import --move`` / ``runs prune`` as a user runs them: real processes,
with a server on the filesystem store holding the run while it moves to SQLite or PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from tests.acceptance.harness import call, call_error, server_env, stdio_client_for
from tests.acceptance.store_targets import store_target
from tests.acceptance.test_cli import cli, ok_json

pytestmark = pytest.mark.slow


def error(stderr: str) -> str:
    """The error line of a failed command (the lines before it are the store's logs)."""
    return stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_live_run_moves_out_of_a_servers_filesystem_store(tmp_path: Path, backend: str) -> None:
    view = ok_json(tmp_path, "runs", "start", "move me", "--chain", "writer,reviewer")
    run_id = view["run_id"]
    assert view["status"] == "awaiting_host"
    async with store_target(backend, tmp_path / "target") as target:
        async with stdio_client_for(server_env(tmp_path), tmp_path / "server.log") as client:
            assert (await call(client, "run_status", run_id=run_id))["status"] == "awaiting_host"
            file = tmp_path / "run.jsonl"
            exported = await anyio.to_thread.run_sync(
                lambda: cli(tmp_path, "runs", "export", run_id, "--out", str(file))
            )
            assert exported.returncode == 0, exported.stderr
            refused = await anyio.to_thread.run_sync(
                lambda: cli(tmp_path, "runs", "import", str(file), "--store", target.url)
            )
            assert refused.returncode == 1 and error(refused.stderr).startswith("invalid_state:")
            moved = await anyio.to_thread.run_sync(
                lambda: cli(
                    tmp_path,
                    "runs",
                    "import",
                    str(file),
                    "--store",
                    target.url,
                    "--move",
                    "--from",
                    "filesystem",
                )
            )
            assert moved.returncode == 0, moved.stderr
            # The server that had the run no longer has it: every call says where it went.
            text = await call_error(client, "orchestrate_resume", run_id=run_id, task_id="writer", output="x")
            assert text.startswith("run_moved: "), text
            assert (await call_error(client, "run_status", run_id=run_id)).startswith("run_moved: ")
        # The run goes on in its new store.
        on_target = ("--store", target.url)
        ok_json(tmp_path, "runs", "resume", run_id, "--task-id", "writer", "--output", "draft", *on_target)
        done = ok_json(
            tmp_path, "runs", "resume", run_id, "--task-id", "reviewer", "--output", "ok", *on_target
        )
        assert done["status"] == "completed"
        # Ended there, it can be pruned there, archived first; the archive brings it back.
        archive = tmp_path / "archive"
        pruned = ok_json(
            tmp_path, "runs", "prune", "--older-than", "0s", "--export-dir", str(archive), *on_target
        )
        assert pruned["pruned"] == [run_id] and pruned["archives"][run_id].endswith(f"{run_id}.jsonl")
        gone = cli(tmp_path, "runs", "status", run_id, *on_target)
        assert gone.returncode == 1 and error(gone.stderr).startswith("run_pruned: ")
        restored = ok_json(tmp_path, "runs", "import", pruned["archives"][run_id], *on_target)
        assert restored["status"] == "completed"
        assert (
            json.loads(cli(tmp_path, "runs", "status", run_id, "--json", *on_target).stdout)["status"]
            == "completed"
        )

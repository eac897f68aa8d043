"""Deadlines with real processes: a deadline that passes while no server is running still fails
the task (and the run) with deadline_exceeded as soon as a server is up again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.acceptance.harness import call, call_error, server_env, stdio_client_for

pytestmark = pytest.mark.slow


async def until_ended(client: Client, run_id: str) -> dict[str, Any]:
    """run_status until the run is terminal (a paused run counts as settled for wait_seconds)."""
    with anyio.fail_after(15):
        while True:
            view = await call(client, "run_status", run_id=run_id)
            if view["status_kind"] == "terminal":
                return view
            await anyio.sleep(0.1)


async def test_a_host_task_deadline_that_passes_while_the_server_is_down(tmp_path: Path) -> None:
    env = server_env(tmp_path)
    log = tmp_path / "server.log"
    async with stdio_client_for(env, log) as client:
        view = await call(
            client,
            "orchestrate_start",
            request="Write the release notes",
            chain=["writer"],
            task_timeout_seconds=2,
        )
        assert view["next_action"]["kind"] == "run_host_task"
        run_id = view["run_id"]
    # No server runs while the deadline passes.
    await anyio.sleep(2.5)
    async with stdio_client_for(env, log) as client:
        error = await call_error(client, "orchestrate_resume", run_id=run_id, task_id="writer", output="late")
        assert error.startswith("invalid_state:") and "ran out of time" in error
        view = await until_ended(client, run_id)
    assert view["status"] == "failed", view
    writer = view["tasks"][0]
    assert writer["status"] == "failed"
    assert writer["error"]["code"] == "deadline_exceeded"


async def test_a_run_deadline_at_an_approval_gate(tmp_path: Path) -> None:
    env = server_env(tmp_path)
    async with stdio_client_for(env, tmp_path / "server.log") as client:
        view = await call(
            client,
            "orchestrate_start",
            request="x",
            chain=["writer"],
            approve_before=["writer"],
            timeout_seconds=1.5,
        )
        assert view["next_action"]["kind"] == "approve"
        view = await call(client, "run_status", run_id=view["run_id"], wait_seconds=0)
        view = await until_ended(client, view["run_id"])
    assert view["status"] == "failed"
    assert view["next_action"]["kind"] == "none"
    assert any("deadline_exceeded" in str(v) for v in view.values())

"""The server in process (``Client(server)``, no subprocess): the lifespan opens the store itself,
runs the dispatcher, and closes both when the client goes away."""

from __future__ import annotations

from pathlib import Path

from mcp import Client

from server.app import ConstructApp
from server.config import load_settings


async def test_the_lifespan_runs_a_chain_on_its_own_store(tmp_path: Path) -> None:
    pid_file = tmp_path / "server.pid"
    settings = load_settings(
        env={
            "CONSTRUCT_HOME": str(tmp_path),
            "CONSTRUCT_POLL_SECONDS": "0.1",
            "CONSTRUCT_PID_FILE": str(pid_file),
        }
    )
    app = ConstructApp(settings)
    async with Client(app.build_server()) as client:
        assert pid_file.exists()
        result = await client.call_tool("orchestrate_start", {"request": "in process", "chain": ["writer"]})
        view = result.structured_content
        assert view is not None and view["next_action"]["kind"] == "run_host_task"
        result = await client.call_tool(
            "orchestrate_resume", {"run_id": view["run_id"], "task_id": "writer", "output": "done"}
        )
        assert result.structured_content is not None
        assert result.structured_content["status"] == "completed"
    # Shut down: the pid file is gone and the run is on disk for the next process.
    assert not pid_file.exists()
    assert (tmp_path / "runs" / view["run_id"] / "head.json").exists()

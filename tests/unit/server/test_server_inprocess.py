"""The server in process (``Client(server)``, no subprocess): the lifespan opens the store itself,
runs the dispatcher, and closes both when the client goes away."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from mcp import Client, MCPError
from mcp.types import CallToolResult, TextContent, TextResourceContents

from server.app import ConstructApp
from server.settings.config import load_settings


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


async def test_a_first_start_in_a_new_home_writes_its_pid_file(tmp_path: Path) -> None:
    """The pid file's directory need not exist yet (a home the store has not made, or a database
    store's home that nothing else creates): the start makes it instead of failing."""
    home = tmp_path / "new" / "home"
    pid_file = home / "state" / "server.pid"
    settings = load_settings(
        env={
            "CONSTRUCT_HOME": str(home),
            "CONSTRUCT_ORCHESTRATION_STORE": "memory",
            "CONSTRUCT_PID_FILE": str(pid_file),
        }
    )
    async with Client(ConstructApp(settings).build_server()):
        assert pid_file.read_text().strip().isdigit()
    assert not pid_file.exists()


def _app(tmp_path: Path) -> ConstructApp:
    return ConstructApp(load_settings(env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_POLL_SECONDS": "0.1"}))


def _text(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


async def test_answers_are_compact_and_whole_outputs_are_one_call_away(tmp_path: Path) -> None:
    design = "line one of the design\n" + "x" * 2000
    async with Client(_app(tmp_path).build_server()) as client:
        started = await client.call_tool(
            "orchestrate_start", {"request": "compact", "chain": ["architect", "writer"]}
        )
        run_id = (started.structured_content or {})["run_id"]
        result = await client.call_tool(
            "orchestrate_resume", {"run_id": run_id, "task_id": "architect", "output": design}
        )
        view = result.structured_content
        assert view is not None and view["next_action"]["task_id"] == "writer"
        # The text is the JSON of the same compact view, without indentation.
        assert _text(result) == json.dumps(view, separators=(",", ":"), ensure_ascii=False)
        # The design travels once: in the writer's prompt; the task shows its length and URI.
        assert _text(result).count("x" * 2000) == 1
        architect = view["tasks"][0]
        assert architect == {
            "task_id": "architect",
            "status": "done",
            "output_chars": len(design),
            "output_uri": f"run://{run_id}/tasks/architect/output",
        }

        full = (await client.call_tool("run_status", {"run_id": run_id, "detail": "full"})).structured_content
        assert full is not None and full["tasks"][0]["output"] == design
        assert full["tasks"][0]["output_sha256"] == hashlib.sha256(design.encode()).hexdigest()
        one = (
            await client.call_tool("run_status", {"run_id": run_id, "task_id": "architect"})
        ).structured_content
        assert one is not None and one["tasks"][0]["output"] == design

        unknown = await client.call_tool("run_status", {"run_id": run_id, "task_id": "coder"})
        assert unknown.is_error
        assert _text(unknown).startswith("invalid_argument: run ") and "has no task 'coder'" in _text(unknown)


async def test_a_task_output_is_a_text_resource(tmp_path: Path) -> None:
    design = "the design, verbatim \u00e9\n  with its indentation\n"
    async with Client(_app(tmp_path).build_server()) as client:
        templates = await client.list_resource_templates()
        by_uri = {t.uri_template: t for t in templates.resource_templates}
        assert by_uri["run://{run_id}/tasks/{task_id}/output"].mime_type == "text/plain"

        started = await client.call_tool(
            "orchestrate_start", {"request": "r", "chain": ["architect", "writer"]}
        )
        run_id = (started.structured_content or {})["run_id"]
        await client.call_tool(
            "orchestrate_resume", {"run_id": run_id, "task_id": "architect", "output": design}
        )

        read = await client.read_resource(f"run://{run_id}/tasks/architect/output")
        [contents] = read.contents
        assert isinstance(contents, TextResourceContents)
        assert contents.text == design and contents.mime_type == "text/plain"
        # The run resource is the compact answer.
        [run] = (await client.read_resource(f"run://{run_id}")).contents
        assert isinstance(run, TextResourceContents)
        assert json.loads(run.text)["tasks"][0]["output_uri"] == f"run://{run_id}/tasks/architect/output"

        for uri, code in [
            (f"run://{run_id}/tasks/writer/output", "invalid_state"),  # not done yet
            (f"run://{run_id}/tasks/coder/output", "invalid_argument"),  # no such task
            ("run://run-nope-0000/tasks/writer/output", "run_not_found"),
            ("run://BAD..ID/tasks/writer/output", "invalid_argument"),
        ]:
            with pytest.raises(MCPError) as refused:
                await client.read_resource(uri)
            assert code in str(refused.value), (uri, refused.value)

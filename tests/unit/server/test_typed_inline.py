"""Typed output on the inline backend, through the MCP tools (``Client(server)`` in process): the
host is handed the schema, an answer that does not match is refused with ``invalid_output`` and
nothing is recorded, and a matching answer is recorded with its value and shown in the run view."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.types import CallToolResult, TextContent

from orchestration.chains.schemas import BUILTIN_SCHEMAS
from orchestration.core.facts import TaskCompleted
from server.app import ConstructApp
from server.settings.config import load_settings
from stores.filesystem import FilesystemStore

CHAINS = """
[chains.rev]
steps = ["engineer", { specialist = "reviewer", output_schema = "verdict" }]
"""


def _app(tmp_path: Path) -> ConstructApp:
    config = tmp_path / "construct.toml"
    config.write_text(CHAINS)
    settings = load_settings(
        env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_POLL_SECONDS": "0.1"}, config_file=config
    )
    return ConstructApp(settings)


def _text(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


async def _resume(client: Client, run_id: str, task_id: str, output: str) -> CallToolResult:
    return await client.call_tool(
        "orchestrate_resume", {"run_id": run_id, "task_id": task_id, "output": output}
    )


async def test_an_invalid_answer_is_refused_and_a_valid_one_is_recorded_with_its_value(
    tmp_path: Path,
) -> None:
    async with Client(_app(tmp_path).build_server()) as client:
        started = await client.call_tool("orchestrate_start", {"request": "Build a parser", "chain": "rev"})
        view: dict[str, Any] = started.structured_content or {}
        run_id = view["run_id"]
        assert view["next_action"]["task_id"] == "engineer"
        assert "output_schema" not in view["next_action"]  # an untyped step's: left out
        view = (await _resume(client, run_id, "engineer", "the parser")).structured_content or {}

        action = view["next_action"]
        assert action["kind"] == "run_host_task" and action["task_id"] == "reviewer"
        assert action["output_schema"] == BUILTIN_SCHEMAS["verdict"]
        assert action["add"] == {"output": "one JSON object matching output_schema"}
        assert "invalid_output" in action["instruction"]
        assert "## Answer format" in action["user_prompt"]
        full = {"run_id": run_id, "detail": "full"}
        version = ((await client.call_tool("run_status", full)).structured_content or {})["version"]

        for bad, says in [
            ("Looks good to me, approve.", "the answer is not JSON"),
            ('{"verdict": "ship it", "notes": "fine"}', "at /verdict: 'ship it' is not one of"),
            ('{"verdict": "approve"}', "at (root): 'notes' is a required property"),
        ]:
            refused = await _resume(client, run_id, "reviewer", bad)
            assert refused.is_error
            assert _text(refused).startswith("invalid_output: "), _text(refused)
            assert says in _text(refused)
            # Nothing was recorded: the run still waits for the reviewer, at the same version.
            status = (await client.call_tool("run_status", full)).structured_content or {}
            assert status["version"] == version
            assert status["next_action"]["task_id"] == "reviewer"

        answer = '```json\n{"verdict": "revise", "notes": "add tests for empty input"}\n```'
        done = (await _resume(client, run_id, "reviewer", answer)).structured_content or {}
        assert done["status"] == "completed"
        reviewer = done["tasks"][1]
        assert reviewer["value"] == {"verdict": "revise", "notes": "add tests for empty input"}
        assert reviewer["output_preview"] == answer  # the text is recorded verbatim
        assert "value" not in done["tasks"][0]
        # Repeating the same answer is idempotent, as for untyped tasks.
        again = await _resume(client, run_id, "reviewer", answer)
        assert not again.is_error

    store = FilesystemStore(tmp_path)
    head = await store.load(run_id)
    fact = await store.read_fact(run_id, head.task("reviewer").output_seq or 0)
    assert isinstance(fact, TaskCompleted)
    assert fact.value == {"verdict": "revise", "notes": "add tests for empty input"}
    assert fact.output == answer


async def test_a_compact_view_leaves_out_a_large_value(tmp_path: Path) -> None:
    config = tmp_path / "construct.toml"
    config.write_text(
        '[chains.big]\nsteps = [{ specialist = "writer", output_schema = '
        '{ type = "object", properties = { text = { type = "string" } }, required = ["text"] } }]\n'
    )
    settings = load_settings(env={"CONSTRUCT_HOME": str(tmp_path)}, config_file=config)
    async with Client(ConstructApp(settings).build_server()) as client:
        started = await client.call_tool("orchestrate_start", {"request": "write", "chain": "big"})
        run_id = (started.structured_content or {})["run_id"]
        value = {"text": "w" * 3000}
        done = (await _resume(client, run_id, "writer", json.dumps(value))).structured_content or {}
        assert "value" not in done["tasks"][0]  # compact: too large to repeat
        full = (await client.call_tool("run_status", {"run_id": run_id, "detail": "full"})).structured_content
        assert full is not None and full["tasks"][0]["value"] == value


async def test_text_that_looks_like_json_reaches_the_server_verbatim(tmp_path: Path) -> None:
    """The SDK pre-parses JSON-looking strings for arguments not annotated exactly ``str``; free
    text (an untyped task's answer, a request) must stay the text the host sent."""
    async with Client(_app(tmp_path).build_server()) as client:
        request = '{"goal": "a parser"}'
        started = await client.call_tool("orchestrate_start", {"request": request, "chain": '["writer"]'})
        assert not started.is_error, started.content
        run_id = (started.structured_content or {})["run_id"]
        view = (await client.call_tool("run_status", {"run_id": run_id, "detail": "full"})).structured_content
        assert view is not None and view["request"] == request
        assert [s["name"] for s in view["chain"]["steps"]] == ["writer"]  # a list in a string still works
        answer = '[ "one",  "two" ]'
        done = (await _resume(client, view["run_id"], "writer", answer)).structured_content or {}
        assert done["status"] == "completed" and done["tasks"][0]["output_preview"] == answer

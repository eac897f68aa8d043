"""``run://{run_id}/export``: the whole run as ``runs export`` writes it, through the MCP surface in
process, which ``runs import`` restores in another store."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client, MCPError
from mcp.types import TextResourceContents

from orchestration.core.clock import ManualClock
from orchestration.ops.export import read_export
from orchestration.ops.retention import import_export
from server.app import ConstructApp
from server.settings.config import load_settings
from stores.memory import MemoryStore
from tests.acceptance.harness import call, play_host


async def test_the_export_resource_is_the_whole_run_and_imports_elsewhere(tmp_path: Path) -> None:
    env = {"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_ORCHESTRATION_STORE": "memory"}
    server = ConstructApp(load_settings(env=env)).build_server()
    async with Client(server) as client:
        view = await call(client, "orchestrate_start", request="Export me.", chain=["architect", "writer"])
        view = await play_host(client, view)
        run_id = view["run_id"]
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert "run://{run_id}/export" in templates
        contents = (await client.read_resource(f"run://{run_id}/export")).contents[0]
        assert isinstance(contents, TextResourceContents) and contents.mime_type == "application/jsonl"
        run = read_export(contents.text.splitlines())
        assert run.run_id == run_id and run.head.status.value == "completed"
        assert run.facts[-1].type == "run_finished" and len(run.facts) == run.head.last_seq
        with pytest.raises(MCPError, match="run_not_found"):
            await client.read_resource("run://run-nope/export")
    other = MemoryStore()
    await import_export(other, run, now=ManualClock().now())
    assert await other.load(run_id) == run.head

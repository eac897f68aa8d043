"""Starting and finding runs where the user is: each chain is an MCP prompt, and the recent runs
are listed as resources (in process, through the official client)."""

from __future__ import annotations

from pathlib import Path

from mcp import Client
from mcp.types import TextContent

from orchestration.chains.catalog import Catalog
from server.app import ConstructApp
from server.mcp.resources import RECENT_RUNS
from server.settings.config import load_settings


def _app(tmp_path: Path, toml: str | None = None) -> ConstructApp:
    if toml is not None:
        (tmp_path / "construct.toml").write_text(toml)
    return ConstructApp(load_settings(env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_POLL_SECONDS": "0.1"}))


CHAINS = """
[chains.docs]
description = "research a topic, then write it up"
steps = [
  { name = "researcher", specialist = "researcher" },
  { name = "writer", specialist = "writer", approve_before = true },
]
"""


async def test_each_chain_is_a_prompt_that_starts_and_drives_it(tmp_path: Path) -> None:
    async with Client(_app(tmp_path, CHAINS).build_server()) as client:
        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
        assert set(prompts) == {*Catalog.builtin().chains, "docs"}  # the built-ins and the configured one
        docs = prompts["docs"]
        assert docs.description is not None and "research a topic, then write it up" in docs.description
        assert [(a.name, a.required) for a in docs.arguments or []] == [("request", True)]

        rendered = await client.get_prompt("docs", {"request": "Explain durable execution."})
        assert len(rendered.messages) == 1 and rendered.messages[0].role == "user"
        content = rendered.messages[0].content
        assert isinstance(content, TextContent)
        text = content.text
        assert 'orchestrate_start with chain="docs"' in text
        assert "orchestrate_resume" in text and "task_id" in text
        assert "orchestrate_approve" in text and "gate_id" in text and "Never decide for them" in text
        assert "before writer" in text, "the prompt says where the chain waits for the user"
        assert text.endswith("Request:\nExplain durable execution.")

        # What the prompt tells the model to do works: the chain it names starts on the request.
        result = await client.call_tool(
            "orchestrate_start", {"chain": "docs", "request": "Explain durable execution."}
        )
        assert result.structured_content is not None
        full = await client.call_tool(
            "run_status", {"run_id": result.structured_content["run_id"], "detail": "full"}
        )
        assert full.structured_content is not None and full.structured_content["chain"]["name"] == "docs"


async def test_recent_runs_are_listed_as_resources_newest_first(tmp_path: Path) -> None:
    async with Client(_app(tmp_path).build_server()) as client:
        # Only the run panel (MCP Apps, see server.web.panel) is listed before any run exists.
        assert [str(r.uri) for r in (await client.list_resources()).resources] == ["ui://construct/run"]
        run_ids = []
        for n in range(RECENT_RUNS + 2):
            result = await client.call_tool(
                "orchestrate_start",
                {
                    "request": f"Request number {n}\n  with   spaces " + "x" * 200,
                    "chain": ["writer"],
                    "wait_seconds": 0,
                },
            )
            assert result.structured_content is not None
            run_ids.append(result.structured_content["run_id"])
        listed = [r for r in (await client.list_resources()).resources if str(r.uri).startswith("run://")]
        assert len(listed) == RECENT_RUNS
        assert [str(r.uri) for r in listed] == [f"run://{i}" for i in reversed(run_ids[-RECENT_RUNS:])]
        newest = listed[0]
        assert newest.mime_type == "application/json"
        assert newest.name.startswith(
            f"custom · queued · Request number {RECENT_RUNS + 1} with spaces x"
        ) or (
            newest.name.startswith(f"custom · awaiting_host · Request number {RECENT_RUNS + 1} with spaces x")
        ), newest.name
        assert len(newest.name) < 120 and newest.name.endswith("…")
        # A listed run can be attached: reading its URI gives the run view.
        contents = (await client.read_resource(newest.uri)).contents
        assert run_ids[-1] in contents[0].text  # type: ignore[union-attr]
        # The templates are still listed on their own.
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert "run://{run_id}" in templates

"""A run's event feed (issue 14, live events): the ``run_events`` tool and the
``run://{run_id}/events`` resource, through the MCP surface in process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError
from mcp.server import MCPServer
from mcp.types import TextResourceContents

from orchestration.engine.runtime import Runtime
from server.app import ConstructApp
from server.identity import Caller
from server.mcp import answering, resources
from server.mcp.services import Services
from server.settings.config import load_settings
from server.views.events import EVENT_PREVIEW_CHARS, RESOURCE_EVENTS
from tests.acceptance.harness import call, call_error, play_host


@pytest.fixture
def server(tmp_path: Path) -> MCPServer[Services]:
    env = {"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_ORCHESTRATION_STORE": "memory"}
    return ConstructApp(load_settings(env=env)).build_server()


@asynccontextmanager
async def connected(server: MCPServer[Services]) -> AsyncIterator[Client]:
    async with Client(server) as client:
        yield client


async def events(client: Client, run_id: str, **arguments: Any) -> dict[str, Any]:
    return await call(client, "run_events", run_id=run_id, **arguments)


async def test_pages_through_a_runs_events_from_an_offset(server: MCPServer[Services]) -> None:
    async with connected(server) as client:
        view = await call(client, "orchestrate_start", request="Feed me.", chain=["architect", "engineer"])
        view = await play_host(client, view)
        assert view["status"] == "completed"
        run_id = view["run_id"]

        everything = await events(client, run_id, limit=500)
        seqs = [e["seq"] for e in everything["events"]]
        assert seqs == list(range(1, len(seqs) + 1))
        assert everything["terminal"] and not everything["more"]
        assert everything["next_after_seq"] == seqs[-1]
        kinds = [e["type"] for e in everything["events"]]
        assert kinds[0] == "run_created" and kinds[-1] == "run_finished"
        assert kinds.count("task_completed") == 2
        prepared = next(e for e in everything["events"] if e["type"] == "host_task_prepared")
        assert prepared["task_id"] == "architect" and "prompts handed to the host" in prepared["summary"]
        assert "gate_id" not in prepared  # left out, not null

        # Three at a time, each page from where the last one ended, gives the same events.
        paged: list[dict[str, Any]] = []
        after = 0
        while True:
            page = await events(client, run_id, after_seq=after, limit=3)
            assert len(page["events"]) <= 3
            paged += page["events"]
            after = page["next_after_seq"]
            if not page["more"]:
                break
            assert page["events"], "more with an empty page would never end"
        assert paged == everything["events"]
        # Past the end: nothing, and the feed says it is done.
        last = await events(client, run_id, after_seq=after)
        assert (last["events"], last["more"], last["terminal"], last["next_after_seq"]) == (
            [],
            False,
            True,
            after,
        )


async def test_outputs_are_previews_with_their_uri_never_whole(server: MCPServer[Services]) -> None:
    big = "".join(f"line {i}: some output text\n" for i in range(5000))[:100_000]
    assert len(big) == 100_000
    async with connected(server) as client:
        view = await call(client, "orchestrate_start", request="Write a lot.", chain=["writer"])
        view = await play_host(client, view, output_for=lambda _task: big)
        run_id = view["run_id"]
        result = await client.call_tool("run_events", {"run_id": run_id})
        page = result.structured_content
        assert page is not None
        done = next(e for e in page["events"] if e["type"] == "task_completed")
        output = done["output"]
        assert output["preview"] == big[:EVENT_PREVIEW_CHARS]
        assert output["chars"] == 100_000
        assert len(output["sha256"]) == 64
        assert output["uri"] == f"run://{run_id}/tasks/writer/output"
        # Nothing of the output beyond its preview, in the text or the structured content.
        beyond = big[EVENT_PREVIEW_CHARS : EVENT_PREVIEW_CHARS + 200]
        assert beyond not in json.dumps(page)
        text = result.content[0].text  # type: ignore[union-attr]
        assert beyond not in text and len(text) < 5_000
        # The URI gives the whole output.
        whole = (await client.read_resource(output["uri"])).contents[0]
        assert isinstance(whole, TextResourceContents) and whole.text == big


async def test_a_long_poll_returns_when_a_new_fact_lands(
    server: MCPServer[Services], monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting = anyio.Event()
    wait_for_facts = Runtime.wait_for_facts

    async def signalled(self: Runtime, run_id: str, after_seq: int, timeout_seconds: float) -> Any:
        if timeout_seconds > 0:
            waiting.set()
        return await wait_for_facts(self, run_id, after_seq, timeout_seconds)

    monkeypatch.setattr(Runtime, "wait_for_facts", signalled)
    async with connected(server) as client:
        view = await call(client, "orchestrate_start", request="Wait for me.", chain=["writer"])
        run_id = view["run_id"]
        assert view["next_action"]["kind"] == "run_host_task"
        now = await events(client, run_id, limit=500)
        assert not now["terminal"] and not now["more"]
        after = now["next_after_seq"]
        # Nothing new yet: wait_seconds=0 answers at once, empty.
        assert (await events(client, run_id, after_seq=after))["events"] == []

        answered: dict[str, Any] = {}

        async def follow() -> None:
            answered.update(await events(client, run_id, after_seq=after, wait_seconds=120))

        with anyio.fail_after(60):  # generous: the answer comes when the host's output lands
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                await waiting.wait()
                await call(client, "orchestrate_resume", run_id=run_id, task_id="writer", output="Done.")
        new = answered["events"]
        assert new and new[0]["seq"] == after + 1
        assert {"host_output_submitted", "task_completed"} <= {e["type"] for e in new}
        assert answered["next_after_seq"] == new[-1]["seq"]


async def test_the_events_resource_shows_the_newest_page(server: MCPServer[Services]) -> None:
    async with connected(server) as client:
        view = await call(client, "orchestrate_start", request="A resource.", chain=["writer"])
        view = await play_host(client, view)
        run_id = view["run_id"]
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert "run://{run_id}/events" in templates
        contents = (await client.read_resource(f"run://{run_id}/events")).contents[0]
        assert isinstance(contents, TextResourceContents) and contents.mime_type == "application/json"
        page = json.loads(contents.text)
        assert page == await events(client, run_id, limit=RESOURCE_EVENTS)  # a short run: all of it
        assert page["terminal"] and page["events"][-1]["type"] == "run_finished"
        with pytest.raises(MCPError, match="run_not_found"):
            await client.read_resource("run://run-nope/events")


async def test_reading_events_needs_the_read_role(
    server: MCPServer[Services], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with connected(server) as client:
        run_id = (await call(client, "orchestrate_start", request="Roles.", chain=["writer"]))["run_id"]
        dave = Caller("dave", frozenset({"approve"}), False, "http", True)
        carol = Caller("carol", frozenset({"read", "operate"}), True, "http", True)
        for who in (dave, carol):
            monkeypatch.setattr(answering, "caller_of", lambda _request, who=who: who)
            monkeypatch.setattr(resources, "caller_of", lambda _request, who=who: who)
            text = await call_error(client, "run_events", run_id=run_id)
            assert text.startswith("forbidden: "), text
            with pytest.raises(MCPError, match="forbidden"):
                await client.read_resource(f"run://{run_id}/events")
        monkeypatch.setattr(answering, "caller_of", lambda _request: dave)
        text = await call_error(client, "run_events", run_id=run_id)
        assert "run_events needs the role 'read'" in text
        bob = Caller("bob", frozenset({"read"}), False, "http", True)
        monkeypatch.setattr(answering, "caller_of", lambda _request: bob)
        assert (await events(client, run_id))["events"]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"after_seq": -1}, "invalid_argument: after_seq: "),
        ({"limit": 0}, "invalid_argument: limit: "),
        ({"limit": 501}, "invalid_argument: limit: "),
        ({"wait_seconds": 1000}, "invalid_argument: wait_seconds: "),
        ({"after_seq": "soon"}, "invalid_argument: after_seq: "),
        ({"from_seq": 3}, "invalid_argument: unknown argument 'from_seq'"),
        ({"after_seq": 999}, "invalid_argument: after_seq 999 is past the last event of run "),
        # At once, not after the wait: no event will ever have that seq.
        ({"after_seq": 99, "wait_seconds": 300}, "invalid_argument: after_seq 99 is past the last event "),
    ],
)
async def test_bad_arguments_are_refused_with_a_code(
    server: MCPServer[Services], arguments: dict[str, Any], expected: str
) -> None:
    async with connected(server) as client:
        run_id = (await call(client, "orchestrate_start", request="Args.", chain=["writer"]))["run_id"]
        with anyio.fail_after(60):
            text = await call_error(client, "run_events", run_id=run_id, **arguments)
        assert text.startswith(expected), text
        assert (await call_error(client, "run_events", run_id="run-nope")).startswith("run_not_found: ")


async def test_the_tool_is_read_only_and_its_schemas_are_lean(server: MCPServer[Services]) -> None:
    async with connected(server) as client:
        tool = next(t for t in (await client.list_tools()).tools if t.name == "run_events")
        assert tool.annotations is not None and tool.annotations.read_only_hint is True
        assert tool.input_schema["additionalProperties"] is False
        assert tool.output_schema is not None
        assert len(json.dumps(tool.input_schema)) + len(json.dumps(tool.output_schema)) < 1_600

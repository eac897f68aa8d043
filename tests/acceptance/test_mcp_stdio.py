"""The MCP surface over stdio: the official ``mcp.Client`` against ``python -m server serve`` running as
a real subprocess, on every persistent store (filesystem, sqlite, postgres).

Most tests share one server process (module scope); tests that need their own process (a legacy
client, raw stdout inspection, a restart) start one.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.subscriptions import ResourceUpdated
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.types import ServerNotification, TextResourceContents

from tests.acceptance.harness import (
    SERVER_COMMAND,
    SharedClient,
    call,
    call_error,
    full_view,
    play_host,
    read_log,
    server_env,
    stdio_client_for,
)
from tests.acceptance.store_targets import BACKENDS, store_target

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

MAX_CHARS = 4000
CONFIG = """
[chains.quick]
description = "research, then write"
steps = ["researcher", "writer"]
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("construct-home")
    (path / "construct.toml").write_text(CONFIG)
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def client(home: Path, request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    """One shared server per store backend: the whole shared-client suite runs on every store."""
    async with store_target(request.param, home / request.param) as target:
        env = target.env(
            home, CONSTRUCT_MAX_REQUEST_CHARS=str(MAX_CHARS), CONSTRUCT_MAX_OUTPUT_CHARS=str(MAX_CHARS)
        )
        shared = SharedClient(env, home / f"server-{request.param}.log")
        try:
            yield await shared.start()
        finally:
            await shared.stop()


async def start(client: Client, **arguments: Any) -> dict[str, Any]:
    arguments.setdefault("request", "Write a haiku about durable execution.")
    # Each test wants a run of its own, on one server: without new_run, the same start within the
    # retry window would be the run an earlier test made.
    arguments.setdefault("new_run", True)
    return await call(client, "orchestrate_start", **arguments)


# ------------------------------------------------------------------------------------------------
# Discovery


async def test_tools_list_shows_input_and_output_schemas_and_annotations(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {
        "orchestrate_start",
        "orchestrate_fork",
        "orchestrate_resume",
        "orchestrate_approve",
        "run_status",
        "orchestrate_cancel",
        "runs_list",
        "run_events",
        "task_prompt",
        "orchestrate_upgrade",
    }
    # The reading tools publish an output schema (an outline); the tools that act answer with the
    # same compact run view, described once, in run_status's (issue 21 §3: tools/list bytes).
    with_schema = {"run_status", "runs_list", "run_events"}
    for name, tool in tools.items():
        # one or two sentences each (issue 21 §3): what the tool does and what its answer says
        assert tool.description and len(tool.description) > 60, name
        assert "\n    " not in tool.description, f"{name}: description keeps its source indentation"
        assert (tool.output_schema is not None) == (name in with_schema), name
        props = tool.input_schema["properties"]
        assert "ctx" not in props, name
        for param, schema in props.items():
            if param in {"run_id", "limit"}:
                continue  # named for what they are: no words spent on them (issue 21 §3)
            # a nullable argument's description is in its branch that is not null (issue 21 §2:
            # Gemini's conversion keeps it only there)
            said = [schema, *[b for b in schema.get("anyOf", []) if b != {"type": "null"}][:1]]
            assert any(s.get("description") for s in said), f"{name}.{param} has no description"
    view_props = tools["run_status"].output_schema["properties"]  # type: ignore[index]
    assert set(view_props) == {"run_id", "status", "status_kind", "next_action", "tasks"}
    # The answer's other fields (gates, warnings, costs, ...; semantics, totals, ... with
    # detail='full') are allowed, not named in the schema.
    assert tools["run_status"].output_schema.get("additionalProperties", True) is True  # type: ignore[union-attr]
    assert "next_cursor" in tools["runs_list"].output_schema["properties"]  # type: ignore[index]
    assert tools["orchestrate_start"].input_schema["required"] == ["request"]
    assert tools["orchestrate_approve"].input_schema["properties"]["decision"]["enum"] == [
        "approve",
        "reject",
        "revise",
    ]

    def hints(name: str) -> Any:
        annotations = tools[name].annotations
        assert annotations is not None
        return annotations

    assert hints("run_status").read_only_hint is True
    assert hints("runs_list").read_only_hint is True
    assert hints("run_events").read_only_hint is True
    assert hints("orchestrate_approve").idempotent_hint is True
    assert hints("orchestrate_cancel").destructive_hint is True
    # a hint at its default (readOnlyHint: false) is left out (issue 21 §3)
    assert hints("orchestrate_start").read_only_hint in (None, False)


async def test_run_resource_templates_are_listed(client: Client) -> None:
    templates = (await client.list_resource_templates()).resource_templates
    assert [(t.uri_template, t.mime_type) for t in templates] == [
        ("run://{run_id}", "application/json"),
        ("run://{run_id}/tasks/{task_id}/output", "text/plain"),
        ("run://{run_id}/events", "application/json"),
        ("run://{run_id}/export", "application/jsonl"),
    ]


# ------------------------------------------------------------------------------------------------
# The happy path


async def test_start_answers_with_the_first_host_task(client: Client) -> None:
    view = await start(client, request="Design a URL shortener.")
    assert view["status"] == "awaiting_host"
    assert view["status_kind"] == "paused"
    action = view["next_action"]
    assert action["kind"] == "run_host_task"
    assert action["task_id"] == "architect"
    assert action["specialist"] == "architect"
    assert "architect" in action["system_prompt"].lower()
    assert "Design a URL shortener." in action["user_prompt"]
    assert action["tool"] == "orchestrate_resume"
    assert action["arguments"] == {"run_id": view["run_id"], "task_id": "architect"}
    assert view["tasks"][0]["status"] == "awaiting_host"
    assert "warnings" not in view
    record = await full_view(client, view["run_id"])
    assert [s["name"] for s in record["chain"]["steps"]] == ["architect", "engineer", "reviewer"]
    assert record["tasks"][0]["executor"] == "inline:host"
    assert "inline:host" in record["semantics"] and "called no model" in record["semantics"]
    assert record["warnings"] == []


async def test_a_gated_chain_runs_to_completion(client: Client) -> None:
    view = await start(client, approve_before=["engineer"])
    run_id = view["run_id"]
    view = await play_host(client, view)
    assert view["status"] == "awaiting_approval"
    action = view["next_action"]
    assert action["kind"] == "approve"
    assert action["gate_id"] == "before:engineer"
    assert "engineer" in action["guards"]
    assert action["tool"] == "orchestrate_approve"
    assert action["arguments"] == {"run_id": run_id, "gate_id": "before:engineer", "decision": "approve"}

    view = await call(
        client,
        "orchestrate_approve",
        run_id=run_id,
        decision="approve",
        gate_id="before:engineer",
        comment="keep it small",
        approver="alice",
    )
    assert view["next_action"]["kind"] == "run_host_task"
    assert view["next_action"]["task_id"] == "engineer"
    # The approver's note and the architect's recorded output reach the engineer's prompt.
    assert "keep it small" in view["next_action"]["user_prompt"]
    assert "[test host output] architect" in view["next_action"]["user_prompt"]

    view = await play_host(client, view)
    assert view["status"] == "completed"
    assert view["status_kind"] == "terminal"
    assert view["next_action"]["kind"] == "none"
    for task in view["tasks"]:
        assert task["status"] == "done"
        assert task["output_preview"] == f"[test host output] {task['task_id']}"
        assert "output" not in task  # compact: asked for with detail='full', task_id or the URI
    gate = view["gates"][0]
    assert (gate["status"], gate.get("approver"), gate["comment"]) == ("approved", "alice", "keep it small")
    record = await full_view(client, run_id)
    assert record["finished_at"] is not None
    for task in record["tasks"]:
        assert task["executor"] == "inline:host"
        assert [a["outcome"] for a in task["attempts"]] == ["succeeded"]
    assert record["totals"]["attempts"] == 3

    # run_status shows the same record; the resource too.
    assert (await call(client, "run_status", run_id=run_id)) == view
    resource = await client.read_resource(f"run://{run_id}")
    content = resource.contents[0]
    assert isinstance(content, TextResourceContents)
    assert content.mime_type == "application/json"
    assert json.loads(content.text) == view

    # Whole outputs: one tool call away, and resources.
    full = await call(client, "run_status", run_id=run_id, detail="full")
    assert [t["output"] for t in full["tasks"]] == [
        f"[test host output] {t['task_id']}" for t in view["tasks"]
    ]
    output = (await client.read_resource(view["tasks"][1]["output_uri"])).contents[0]
    assert isinstance(output, TextResourceContents)
    assert (output.mime_type, output.text) == ("text/plain", "[test host output] engineer")


async def test_a_chain_given_as_specialists_and_a_configured_chain(client: Client) -> None:
    view = await start(client, chain=["researcher", "writer", "researcher"])
    chain = (await full_view(client, view["run_id"]))["chain"]
    assert chain["name"] == "custom"
    assert [s["name"] for s in chain["steps"]] == ["researcher", "writer", "researcher-2"]
    assert [t["task_id"] for t in view["tasks"]] == ["researcher", "writer", "researcher-2"]
    assert view["next_action"]["specialist"] == "researcher"
    view = await start(client, chain="quick")
    assert (await full_view(client, view["run_id"]))["chain"]["name"] == "quick"
    assert (await play_host(client, view))["status"] == "completed"


async def test_reject_ends_the_run(client: Client) -> None:
    view = await start(client, chain=["architect", "engineer"], approve_before=["engineer"])
    view = await play_host(client, view)
    view = await call(
        client,
        "orchestrate_approve",
        run_id=view["run_id"],
        decision="reject",
        gate_id="before:engineer",
        comment="not now",
    )
    assert view["status"] == "rejected"
    assert view["next_action"]["kind"] == "none"
    assert [t["status"] for t in view["tasks"]] == ["done", "skipped"]
    assert view["gates"][0]["status"] == "rejected"


async def test_cancel_is_final_and_repeatable(client: Client) -> None:
    view = await start(client)
    run_id = view["run_id"]
    view = await call(client, "orchestrate_cancel", run_id=run_id, reason="changed my mind")
    assert view["status"] == "cancelled"
    assert {t["status"] for t in view["tasks"]} == {"cancelled"}
    version = (await full_view(client, run_id))["version"]
    again = await call(client, "orchestrate_cancel", run_id=run_id)
    assert again == view
    assert (await full_view(client, run_id))["version"] == version
    text = await call_error(
        client, "orchestrate_resume", run_id=run_id, task_id="architect", output="too late"
    )
    assert text.startswith("invalid_state: ")


async def test_runs_list_filters_and_pages(client: Client) -> None:
    first = await start(client, request="list me 1")
    second = await start(client, request="list me 2")
    page = await call(client, "runs_list", status=["awaiting_host"], limit=500)
    ids = [r["run_id"] for r in page["runs"]]
    assert first["run_id"] in ids and second["run_id"] in ids
    assert all(r["status"] == "awaiting_host" for r in page["runs"])
    summary = next(r for r in page["runs"] if r["run_id"] == second["run_id"])
    assert summary["waiting_for"] == "host output for task architect"
    assert summary["request_preview"] == "list me 2"

    one = await call(client, "runs_list", limit=1)
    assert len(one["runs"]) == 1 and one["next_cursor"]
    two = await call(client, "runs_list", limit=1, cursor=one["next_cursor"])
    assert two["runs"][0]["run_id"] != one["runs"][0]["run_id"]
    assert two["runs"][0]["created_at"] <= one["runs"][0]["created_at"]

    completed = await call(client, "runs_list", status=["completed"], limit=500)
    assert all(r["status"] == "completed" for r in completed["runs"])


# ------------------------------------------------------------------------------------------------
# Repeats are answered with the current state


async def test_the_same_host_output_twice_records_it_once(client: Client) -> None:
    view = await start(client, chain=["architect", "engineer"])
    run_id = view["run_id"]
    first = await call(client, "orchestrate_resume", run_id=run_id, task_id="architect", output="the design")
    recorded = await full_view(client, run_id)
    again = await call(client, "orchestrate_resume", run_id=run_id, task_id="architect", output="the design")
    assert again == first
    record = await full_view(client, run_id)
    assert record["version"] == recorded["version"]
    assert record["tasks"][0]["attempts"] == recorded["tasks"][0]["attempts"]
    text = await call_error(client, "orchestrate_resume", run_id=run_id, task_id="architect", output="other")
    assert text.startswith("conflict: ") and "already done" in text


async def test_the_same_approval_twice_records_it_once(client: Client) -> None:
    view = await start(client, chain=["architect", "engineer"], approve_before=["engineer"])
    view = await play_host(client, view)
    run_id = view["run_id"]
    first = await call(
        client, "orchestrate_approve", run_id=run_id, decision="approve", gate_id="before:engineer"
    )
    version = (await full_view(client, run_id))["version"]
    again = await call(
        client, "orchestrate_approve", run_id=run_id, decision="approve", gate_id="before:engineer"
    )
    assert (await full_view(client, run_id))["version"] == version
    assert again["gates"] == first["gates"]
    text = await call_error(
        client, "orchestrate_approve", run_id=run_id, decision="reject", gate_id="before:engineer"
    )
    assert text.startswith("conflict: ") and "already approved" in text


async def test_the_same_idempotency_key_returns_the_same_run(client: Client) -> None:
    first = await start(client, request="only once", idempotency_key="key-123")
    version = (await full_view(client, first["run_id"]))["version"]
    again = await start(client, request="only once", idempotency_key="key-123")
    assert again["run_id"] == first["run_id"]
    # The same answer, marked as the run found, and saying so in words.
    [said] = again.pop("warnings")
    assert said.startswith("existing_run: nothing new was started") and "idempotency_key" in said
    assert again == first | {"existing_run": True}
    assert (await full_view(client, first["run_id"]))["version"] == version
    text = await call_error(client, "orchestrate_start", request="something else", idempotency_key="key-123")
    assert text.startswith("conflict: ") and "key-123" in text


# ------------------------------------------------------------------------------------------------
# Errors the caller can fix: a stable code first, then what to do


async def test_unknown_and_malformed_run_ids(client: Client) -> None:
    text = await call_error(client, "run_status", run_id="run-0000000000aa-0000000000000000")
    assert text.startswith("run_not_found: ") and "runs_list" in text
    for tool, extra in (
        ("run_status", {}),
        ("orchestrate_cancel", {}),
        ("orchestrate_approve", {"decision": "approve"}),
        ("orchestrate_resume", {"output": "x"}),
    ):
        text = await call_error(client, tool, run_id="../../etc", **extra)
        assert text.startswith("invalid_argument: "), (tool, text)
    with pytest.raises(MCPError, match="run_not_found"):
        await client.read_resource("run://run-0000000000aa-0000000000000000")


async def test_invalid_state(client: Client) -> None:
    view = await start(client, approve_before=["engineer"])
    run_id = view["run_id"]
    text = await call_error(
        client, "orchestrate_approve", run_id=run_id, decision="approve", gate_id="before:engineer"
    )
    assert text.startswith("invalid_state: ") and "not awaiting approval" in text
    done = await play_host(client, await start(client, chain=["writer"]))
    assert done["status"] == "completed"
    text = await call_error(client, "orchestrate_resume", run_id=done["run_id"])
    assert text.startswith("invalid_state: ") and "completed" in text
    text = await call_error(client, "orchestrate_cancel", run_id=done["run_id"])
    assert text.startswith("invalid_state: ")


async def test_conflict_output_for_a_task_that_is_not_awaiting(client: Client) -> None:
    view = await start(client)
    text = await call_error(
        client, "orchestrate_resume", run_id=view["run_id"], task_id="reviewer", output="x"
    )
    assert text.startswith("conflict: ") and "'architect'" in text
    text = await call_error(client, "orchestrate_resume", run_id=view["run_id"], task_id="nope", output="x")
    assert text.startswith("invalid_argument: ") and "architect, engineer, reviewer" in text


async def test_unknown_chain_and_specialist_list_the_known_ones(client: Client) -> None:
    text = await call_error(client, "orchestrate_start", request="x", chain="nope")
    assert text.startswith("unknown_chain: ") and "default" in text and "quick" in text
    text = await call_error(client, "orchestrate_start", request="x", chain=["architect", "wizard"])
    assert text.startswith("unknown_specialist: ")
    for name in ("architect", "engineer", "reviewer", "researcher", "tester", "writer"):
        assert name in text
    text = await call_error(client, "orchestrate_start", request="x", approve_before=["wizard"])
    assert text.startswith("invalid_argument: ") and "architect" in text


async def test_too_large_request_and_output(client: Client) -> None:
    text = await call_error(client, "orchestrate_start", request="x" * (MAX_CHARS + 1))
    assert text.startswith("too_large: ") and "CONSTRUCT_MAX_REQUEST_CHARS" in text
    view = await start(client)
    version = (await full_view(client, view["run_id"]))["version"]
    text = await call_error(
        client, "orchestrate_resume", run_id=view["run_id"], task_id="architect", output="y" * (MAX_CHARS + 1)
    )
    assert text.startswith("too_large: ") and "CONSTRUCT_MAX_OUTPUT_CHARS" in text
    # Nothing was recorded: the task still awaits its output.
    assert (await full_view(client, view["run_id"]))["version"] == version
    assert (await call(client, "run_status", run_id=view["run_id"])) == view


async def test_other_invalid_arguments(client: Client) -> None:
    text = await call_error(client, "orchestrate_start", request="   ")
    assert text.startswith("invalid_argument: ")
    text = await call_error(client, "runs_list", cursor="not-a-cursor")
    assert text.startswith("invalid_argument: ")
    text = await call_error(client, "runs_list", limit=0)
    assert text.startswith("invalid_argument: ")
    text = await call_error(client, "orchestrate_start", request="x", worker_backend="provider")
    assert text.startswith("invalid_argument: ")
    view = await start(client)
    text = await call_error(client, "orchestrate_resume", run_id=view["run_id"])
    resume = json.dumps({"run_id": view["run_id"], "task_id": "architect"})
    assert text.startswith("invalid_argument: ")
    assert f"call orchestrate_resume with {resume} plus output" in text
    # A schema violation is refused before the tool runs, with the code first.
    text = await call_error(
        client, "orchestrate_approve", run_id=view["run_id"], decision="maybe", gate_id="before:engineer"
    )
    assert text == "invalid_argument: decision: input should be 'approve', 'reject' or 'revise'"


# ------------------------------------------------------------------------------------------------
# Waiting, progress, subscriptions


async def test_wait_seconds_sends_progress_notifications(client: Client) -> None:
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    result = await client.call_tool(
        "orchestrate_start", {"request": "progress please", "wait_seconds": 5}, progress_callback=on_progress
    )
    assert not result.is_error
    assert seen, "no progress notification arrived"
    assert seen[0][0] == 1 and "is" in (seen[0][1] or "")
    assert [p for p, _ in seen] == sorted(p for p, _ in seen)

    # wait_seconds=0 answers at once (the run may still be queued).
    view = await call(client, "orchestrate_start", request="no wait", wait_seconds=0)
    assert view["status"] in ("queued", "awaiting_host")
    view = await call(client, "run_status", run_id=view["run_id"], wait_seconds=10)
    assert view["status"] == "awaiting_host"


async def test_resource_updates_reach_a_listening_client(client: Client) -> None:
    view = await start(client, chain=["writer", "reviewer"])
    uri = f"run://{view['run_id']}"
    async with client.listen(resource_subscriptions=[uri]) as subscription:
        await call(client, "orchestrate_resume", run_id=view["run_id"], task_id="writer", output="draft")
        with anyio.fail_after(10):
            async for event in subscription:
                assert event == ResourceUpdated(uri=uri)
                break


async def test_resource_updates_reach_a_legacy_subscriber(tmp_path: Path) -> None:
    received: list[str] = []
    got = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, ServerNotification) and message.method == "notifications/resources/updated":
            received.append(str(message.params.uri))
            got.set()

    env = server_env(tmp_path)
    async with stdio_client_for(
        env, tmp_path / "server.log", mode="legacy", message_handler=on_message
    ) as legacy:
        assert legacy.server_capabilities.resources is not None
        assert legacy.server_capabilities.resources.subscribe is True
        view = await call(legacy, "orchestrate_start", request="legacy", chain=["writer"])
        uri = f"run://{view['run_id']}"
        # Handshake-era hosts still use resources/subscribe; the SDK flags it as deprecated.
        with pytest.warns(MCPDeprecationWarning):
            await legacy.subscribe_resource(uri)
        await call(legacy, "orchestrate_resume", run_id=view["run_id"], task_id="writer", output="done")
        with anyio.fail_after(10):
            await got.wait()
        assert uri in received


# ------------------------------------------------------------------------------------------------
# The process


async def test_stdout_carries_only_json_rpc(tmp_path: Path) -> None:
    """A stdio server writes nothing but JSON-RPC messages on stdout, logs go to stderr, and it
    exits cleanly (status 0) when its stdin closes."""
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {
                "name": "orchestrate_start",
                "arguments": {"request": "stdout check", "wait_seconds": 5},
            },
        },
        {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "tools/call",
            "params": {"name": "run_status", "arguments": {"run_id": "../../etc"}},
        },
    ]
    env = server_env(tmp_path)
    stderr_path = tmp_path / "stderr.log"
    lines: list[str] = []
    with anyio.fail_after(60), stderr_path.open("wb") as errlog:
        async with await anyio.open_process(
            [*SERVER_COMMAND, "serve"], env={**env, "PATH": os.environ.get("PATH", "")}, stderr=errlog
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            await proc.stdin.send("".join(json.dumps(m) + "\n" for m in messages).encode())
            buffer = b""
            # Read until every request is answered, then close stdin: the MCP way to stop a server.
            while sum('"id"' in line for line in lines) < 4:
                buffer += await proc.stdout.receive()
                *complete, buffer = buffer.split(b"\n")
                lines += [line.decode() for line in complete]
            await proc.stdin.aclose()
            lines += [
                line.decode() for line in (buffer + b"".join([c async for c in proc.stdout])).splitlines()
            ]
            returncode = await proc.wait()
    stderr = stderr_path.read_text()
    assert returncode == 0, stderr
    assert lines, stderr
    for line in lines:
        message = json.loads(line)
        assert message["jsonrpc"] == "2.0", line
    by_id = {m["id"]: m for m in map(json.loads, lines) if "id" in m}
    assert set(by_id) == {1, 2, 3, 4}
    assert by_id[3]["result"]["structuredContent"]["next_action"]["kind"] == "run_host_task"
    assert by_id[4]["result"]["isError"] is True
    assert "action=server_started" in stderr
    assert "action=run_created" in stderr
    # No prompt text in the logs: only ids and sizes.
    assert "You are step 1 of 3" not in stderr


async def test_a_run_survives_a_restart(tmp_path: Path) -> None:
    """Stop a server after the first task, start another one on the same home: the run goes on."""
    env = server_env(tmp_path)
    async with stdio_client_for(env, tmp_path / "one.log") as one:
        view = await call(one, "orchestrate_start", request="restart me", chain=["architect", "engineer"])
        view = await call(one, "orchestrate_resume", run_id=view["run_id"], task_id="architect", output="A")
    assert view["next_action"]["task_id"] == "engineer"
    async with stdio_client_for(env, tmp_path / "two.log") as two:
        again = await call(two, "run_status", run_id=view["run_id"])
        assert again["next_action"] == view["next_action"]
        done = await play_host(two, again)
    assert done["status"] == "completed"
    assert [t["output_preview"] for t in done["tasks"]] == ["A", "[test host output] engineer"]
    assert "action=server_stopping" in read_log(tmp_path / "one.log")


async def test_a_provider_server_without_a_key_says_so_when_a_host_connects(tmp_path: Path) -> None:
    """Issue 26: the host learns it from the instructions, the operator from the log's first
    lines, before any run is refused; the first line names the store and that it was
    created just now."""
    env = server_env(tmp_path / "home", CONSTRUCT_WORKER_BACKEND="provider")
    async with stdio_client_for(env, tmp_path / "server.log") as client:
        assert client.instructions is not None
        assert "Warning: the worker backend is provider and no API key is set" in client.instructions
        # Not in every run view: an inline run would carry it for nothing.
        view = await call(client, "orchestrate_start", request="hello", worker_backend="inline")
        assert "warnings" not in view
    log = read_log(tmp_path / "server.log")
    assert "action=startup_warning" in log and "no API key is set" in log
    home = tmp_path / "home"
    assert f"store=filesystem (file://{home}, from default, created just now)" in log


async def test_a_store_fallback_is_shown_in_every_run_view(tmp_path: Path) -> None:
    unreachable = "postgresql://nobody:hunter2@127.0.0.1:1/construct"
    env = server_env(tmp_path, CONSTRUCT_ORCHESTRATION_STORE=unreachable)
    async with stdio_client_for(env, tmp_path / "server.log") as fallback:
        view = await call(fallback, "orchestrate_start", request="where am I stored?")
        assert len(view["warnings"]) == 1
        warning = view["warnings"][0]
        assert "could not be opened" in warning and "filesystem" in warning
        assert "hunter2" not in warning
        assert (await call(fallback, "run_status", run_id=view["run_id"]))["warnings"] == view["warnings"]
    log = read_log(tmp_path / "server.log")
    assert "action=startup_warning" in log and "hunter2" not in log
    assert (tmp_path / "runs" / view["run_id"]).is_dir()

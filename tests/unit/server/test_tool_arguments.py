"""Strict inputs and typed errors (issue 9, section 3), through the MCP surface in process.

Every tool's input schema refuses unknown properties and bounds every string; every refusal starts
with its stable code and names the argument in plain words; no error echoes more than about 100
characters of an input.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp.types import CallToolResult, TextContent

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.engine.runtime import Runtime
from orchestration.errors import InvalidArgument, TooLarge
from server.app import ConstructApp
from server.mcp.arguments import HOST_ADDED_ARGUMENTS
from server.mcp.publishing import build_tools
from server.mcp.services import Services
from server.settings.config import load_settings
from stores._common import decode_cursor
from stores.memory import MemoryStore
from tests.acceptance.harness import call, call_error

CODE = re.compile(r"^[a-z_]+: ")
NULL = {"type": "null"}


@pytest.fixture
def server(tmp_path: Path) -> MCPServer[Services]:
    env = {"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_ORCHESTRATION_STORE": "memory"}
    return ConstructApp(load_settings(env=env)).build_server()


@asynccontextmanager
async def connected(server: MCPServer[Services]) -> AsyncIterator[Client]:
    # Not a fixture: the client's cancel scopes must be entered and left in the test's own task.
    async with Client(server) as client:
        yield client


def strings(schema: dict[str, Any], defs: dict[str, Any], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every string-typed subschema of a property (union branches and list items included)."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    if schema.get("type") == "string":
        yield where, schema
    for branch in schema.get("anyOf", []):
        yield from strings(branch, defs, where)
    if "items" in schema:
        yield from strings(schema["items"], defs, f"{where}[]")


async def test_every_input_schema_is_closed_and_bounds_every_string(server: MCPServer[Services]) -> None:
    async with connected(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert len(tools) >= 6
        for name, tool in tools.items():
            schema = tool.input_schema
            assert schema["additionalProperties"] is False, name
            for prop, sub in schema["properties"].items():
                for where, string in strings(sub, schema.get("$defs", {}), prop):
                    assert "maxLength" in string or "enum" in string, (name, where)
        # an optional argument also takes null (as a strict model sends it): its bounds are in the
        # branch that is not null
        (limit,) = [b for b in tools["runs_list"].input_schema["properties"]["limit"]["anyOf"] if b != NULL]
        assert (limit["minimum"], limit["maximum"]) == (1, 500)
        assert "gate_id" in tools["orchestrate_approve"].input_schema["required"]
        # task_id with output: the tool checks it (tests/acceptance/test_retried_calls.py), since
        # dependentRequired is a keyword function-calling dialects refuse (issue 21 §2)
        assert "dependentRequired" not in tools["orchestrate_resume"].input_schema


async def test_an_unknown_argument_is_refused_with_the_closest_name(server: MCPServer[Services]) -> None:
    async with connected(server) as client:
        text = await call_error(client, "orchestrate_start", request="x", approve_befor=["engineer"])
        assert text == "invalid_argument: unknown argument 'approve_befor' (did you mean 'approve_before'?)"
        text = await call_error(client, "run_status", run_id="run-abc", zz="1")
        assert text.startswith(
            "invalid_argument: unknown argument 'zz'; run_status takes: run_id, wait_seconds"
        )
        # Nothing was started.
        assert (await call(client, "runs_list"))["runs"] == []


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("orchestrate_start", {}, "invalid_argument: request is required"),
        ("orchestrate_start", {"request": 7}, "invalid_argument: request: input should be a valid string"),
        ("orchestrate_start", {"request": "x", "chain": 5}, "invalid_argument: chain: input should be"),
        ("orchestrate_start", {"request": "x", "chain": ""}, "invalid_argument: chain: "),
        ("orchestrate_start", {"request": "x", "chain": []}, "invalid_argument: chain: "),
        (
            "orchestrate_start",
            {"request": "x", "worker_backend": "gpu"},
            "invalid_argument: worker_backend: ",
        ),
        ("orchestrate_start", {"request": "x", "timeout_seconds": -1}, "invalid_argument: timeout_seconds: "),
        (
            "orchestrate_approve",
            {"run_id": "run-abc", "decision": "maybe", "gate_id": "g"},
            "invalid_argument: ",
        ),
        ("run_status", {"run_id": "run-abc", "wait_seconds": 1000}, "invalid_argument: wait_seconds: "),
        ("run_status", {"run_id": "run-abc", "wait_seconds": "soon"}, "invalid_argument: wait_seconds: "),
        ("runs_list", {"limit": 0}, "invalid_argument: limit: input should be greater than or equal to 1"),
        ("runs_list", {"limit": 501}, "invalid_argument: limit: "),
        ("runs_list", {"status": ["done"]}, "invalid_argument: status[0]: input should be 'queued'"),
        ("orchestrate_start", {"request": "x", "approver": "me"}, "invalid_argument: unknown argument"),
        (
            "orchestrate_approve",
            {"run_id": "run-abc", "decision": "approve", "gate_id": "g", "approver": "a" * 201},
            "too_large: approver is over 200 characters",
        ),
        (
            "orchestrate_start",
            {"request": "x", "approve_before": ["s"] * 51},
            "too_large: approve_before has more than 50 items",
        ),
        ("runs_list", {"cursor": "c" * 401}, "invalid_argument: cursor 'ccc"),
    ],
)
async def test_schema_violations_start_with_their_code(
    server: MCPServer[Services], tool: str, arguments: dict[str, Any], expected: str
) -> None:
    async with connected(server) as client:
        text = await call_error(client, tool, **arguments)
        assert text.startswith(expected), text
        assert "pydantic" not in text and "http" not in text and "Error executing tool" not in text, text


async def test_a_non_finite_number_is_invalid_argument(server: MCPServer[Services]) -> None:
    # The official client sends NaN as null; a raw JSON-RPC peer can send NaN itself.
    for value in (float("nan"), float("inf")):
        result = await server.call_tool("run_status", {"run_id": "run-abc", "wait_seconds": value})
        assert isinstance(result, CallToolResult) and result.is_error
        block = result.content[0]
        assert isinstance(block, TextContent)
        assert block.text == "invalid_argument: wait_seconds: input should be a finite number"


async def test_errors_never_echo_more_than_about_100_characters_of_an_input(
    server: MCPServer[Services],
) -> None:
    async with connected(server) as client:
        long_name = "q" * 100  # within the bound: refused by the catalog, which quotes it cut
        for arguments in (
            {"chain": "z" * 5000},
            {"chain": long_name + "x"},
            {"chain": [long_name]},
            {"approve_before": [long_name]},
            {"idempotency_key": "k" * 5000},
        ):
            text = await call_error(client, "orchestrate_start", request="x", **arguments)
            assert CODE.match(text), text
            assert not re.search(r"([a-z])\1{100}", text), text
        view = await call(
            client, "orchestrate_start", request="x", approve_before=["engineer"], wait_seconds=0
        )
        for arguments in ({"gate_id": "g" * 99}, {"gate_id": "g" * 5000}):
            text = await call_error(
                client, "orchestrate_approve", run_id=view["run_id"], decision="approve", **arguments
            )
            assert CODE.match(text) and not re.search(r"g{101}", text), text
        text = await call_error(client, "runs_list", cursor="w" * 390)
        assert text.startswith("invalid_argument: cursor ") and not re.search(r"w{101}", text), text


async def test_an_empty_chain_name_is_not_the_default_chain(server: MCPServer[Services]) -> None:
    async with connected(server) as client:
        text = await call_error(client, "orchestrate_start", request="x", chain="")
        assert text.startswith("invalid_argument: chain"), text
        assert (await call(client, "runs_list"))["runs"] == []


async def test_the_runtime_refuses_an_empty_chain_name_and_long_names_too() -> None:
    runtime = Runtime(MemoryStore(), Catalog.builtin())
    for chain in ("", "  "):
        with pytest.raises(InvalidArgument, match="chain is empty"):
            await runtime.start(StartRequest("x", chain=chain))
    with pytest.raises(TooLarge, match="model"):
        await runtime.start(StartRequest("x", model="m" * 101))
    with pytest.raises(TooLarge, match="approve_before has 51 items"):
        await runtime.start(StartRequest("x", approve_before=("engineer",) * 51))
    head, _ = await runtime.start(StartRequest("x", approve_before=("architect",)))
    await runtime.drive(head.run_id)
    with pytest.raises(TooLarge, match="approver"):
        await runtime.approve(head.run_id, "approve", "before:architect", approver="a" * 201)
    with pytest.raises(TooLarge, match="gate_id"):
        await runtime.approve(head.run_id, "approve", "g" * 101)


def _cursor(payload: str) -> str:
    return base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        _cursor("[" * 100_000 + "]" * 100_000),  # nested past the JSON parser's recursion limit
        _cursor("[" * 100 + "]" * 100),
        _cursor(json.dumps({"a": 1, "b": 2})),  # two keys would unpack as two strings
        _cursor(json.dumps(["2026-01-01", "run-abc", "extra"])),
        _cursor(json.dumps([1, 2])),
        "%%%",
        "x" * 5000,
    ],
)
def test_a_forged_cursor_is_always_invalid_argument(cursor: str) -> None:
    with pytest.raises(InvalidArgument, match="not a cursor this server gave out") as caught:
        decode_cursor(cursor)
    assert len(str(caught.value)) < 200


async def test_a_forged_cursor_through_the_tool(server: MCPServer[Services]) -> None:
    async with connected(server) as client:
        for cursor in (_cursor("[" * 200 + "]" * 200), _cursor(json.dumps({"a": 1, "b": 2}))):
            text = await call_error(client, "runs_list", cursor=cursor)
            assert text.startswith("invalid_argument: cursor "), text


async def test_a_repeated_approval_with_another_comment_is_a_conflict(server: MCPServer[Services]) -> None:
    async with connected(server) as client:
        view = await call(client, "orchestrate_start", request="x", approve_before=["architect"])
        gate: dict[str, Any] = {
            "run_id": view["run_id"],
            "decision": "approve",
            "gate_id": "before:architect",
        }
        await call(client, "orchestrate_approve", comment="go", approver="ann", wait_seconds=0, **gate)
        first = await call(client, "run_status", run_id=view["run_id"], detail="full")
        await call(client, "orchestrate_approve", comment="go", approver="ann", wait_seconds=0, **gate)
        again = await call(client, "run_status", run_id=view["run_id"], detail="full")
        assert again["version"] == first["version"]
        for other in (
            {"comment": "stop", "approver": "ann"},
            {"comment": "go"},
            {"comment": "go", "approver": "bo"},
        ):
            text = await call_error(client, "orchestrate_approve", wait_seconds=0, **gate, **other)
            assert text.startswith("conflict: gate before:architect"), text
        gates = (await call(client, "run_status", run_id=view["run_id"]))["gates"]
        assert (gates[0]["comment"], gates[0]["approver"]) == ("go", "ann")


async def test_an_unknown_tool_is_refused_with_the_closest_name(server: MCPServer[Services]) -> None:
    async with connected(server) as client:
        text = await call_error(client, "run_stauts", run_id="run-abc")
        assert text == "invalid_argument: unknown tool 'run_stauts' (did you mean 'run_status'?)"
        text = await call_error(client, "z" * 5000)
        assert text.startswith("invalid_argument: unknown tool 'zzz") and "orchestrate_start" in text
        assert not re.search(r"z{101}", text), text


async def test_a_calls_arguments_are_validated_once_and_answers_keep_their_schema(
    server: MCPServer[Services], monkeypatch: pytest.MonkeyPatch
) -> None:
    """StrictTool's check validates the arguments; the SDK's run reuses that (one validation per
    call), and a later call with other arguments is validated afresh, never given the last one's.
    The SDK no longer re-validates answers against the output model: the published output schema
    is unchanged, and the client (which validates structuredContent against it) accepts them."""
    from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata

    validated: list[dict[str, Any]] = []
    original = FuncMetadata.pre_parse_json  # the first step of every validation of the arguments

    def counting(self: FuncMetadata, arguments: dict[str, Any]) -> dict[str, Any]:
        validated.append(arguments)
        return original(self, arguments)

    monkeypatch.setattr(FuncMetadata, "pre_parse_json", counting)
    async with connected(server) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert listed["run_status"].output_schema is not None
        first = await call(client, "orchestrate_start", request="one", chain=["engineer"])
        second = await call(client, "orchestrate_start", request="two", chain=["engineer"])
        validated.clear()
        one = await call(client, "run_status", run_id=first["run_id"])
        two = await call(client, "run_status", run_id=second["run_id"], detail="full")
    assert [a["run_id"] for a in validated] == [first["run_id"], second["run_id"]]
    assert one["run_id"] == first["run_id"] and one.get("request") is None
    assert two["run_id"] == second["run_id"] and two["request"] == "two"


async def _a_call_for_every_tool(client: Client) -> dict[str, dict[str, Any]]:
    """Arguments with which each published tool succeeds, on runs made for it: one awaiting the
    host, one at a gate, one to cancel."""
    host = await call(client, "orchestrate_start", request="notes", chain=["writer"], wait_seconds=0)
    gated = await call(
        client, "orchestrate_start", request="gated", chain=["writer"], approve_before=["writer"]
    )
    doomed = await call(client, "orchestrate_start", request="doomed", chain=["writer"], new_run=True)
    return {
        "orchestrate_start": {"request": "another", "chain": ["writer"], "wait_seconds": 0},
        "orchestrate_fork": {"run_id": host["run_id"], "from_task": "writer", "wait_seconds": 0},
        "orchestrate_resume": {"run_id": host["run_id"], "task_id": "writer", "output": "the notes"},
        "orchestrate_approve": {"run_id": gated["run_id"], "gate_id": "before:writer", "decision": "approve"},
        "run_status": {"run_id": host["run_id"]},
        "task_prompt": {"run_id": host["run_id"], "task_id": "writer"},
        "orchestrate_upgrade": {"run_id": host["run_id"]},
        "orchestrate_cancel": {"run_id": doomed["run_id"], "reason": "not needed"},
        "runs_list": {},
        "run_events": {"run_id": host["run_id"]},
    }


def _misspelt(name: str) -> str:
    """``name`` with its last letter dropped: close enough that the refusal suggests ``name``."""
    return name[:-1]


#: every tool the server publishes
PUBLISHED = [tool.name for tool in build_tools()]


async def test_every_published_tool_has_a_call_here(server: MCPServer[Services]) -> None:
    """The parametrized tests below cover every tool the server publishes."""
    async with connected(server) as client:
        assert sorted(await _a_call_for_every_tool(client)) == sorted(PUBLISHED)
        assert sorted(t.name for t in (await client.list_tools()).tools) == sorted(PUBLISHED)


@pytest.mark.parametrize("tool", PUBLISHED)
async def test_arguments_hosts_add_to_every_tool_are_accepted_and_ignored(
    server: MCPServer[Services], tool: str
) -> None:
    """Gemini CLI adds ``wait_for_previous`` to every tool and sends it: the call answers as without
    it (the tool never sees it, no run records it); the published schema stays closed without it."""
    assert "wait_for_previous" in HOST_ADDED_ARGUMENTS
    async with connected(server) as client:
        schema = {t.name: t for t in (await client.list_tools()).tools}[tool].input_schema
        assert schema["additionalProperties"] is False
        assert not HOST_ADDED_ARGUMENTS & set(schema["properties"])
        arguments = (await _a_call_for_every_tool(client))[tool]
        for value in (True, False):
            answer = await call(client, tool, **arguments, wait_for_previous=value)
            assert "wait_for_previous" not in json.dumps(answer)
            if tool == "orchestrate_resume":
                break  # the second hand-in would be refused as another output for a done task
        runs = (await call(client, "runs_list"))["runs"]
        for run in runs:
            full = await call(client, "run_status", run_id=run["run_id"], detail="full")
            events = await call(client, "run_events", run_id=run["run_id"], limit=500)
            assert "wait_for_previous" not in json.dumps(full) + json.dumps(events)


@pytest.mark.parametrize("tool", PUBLISHED)
async def test_an_unknown_argument_of_ours_is_still_refused_on_every_tool(
    server: MCPServer[Services], tool: str
) -> None:
    async with connected(server) as client:
        arguments = (await _a_call_for_every_tool(client))[tool]
        schema = {t.name: t for t in (await client.list_tools()).tools}[tool].input_schema
        name = max(schema["properties"], key=len)  # a long name: its misspelling is unambiguous
        wrong = _misspelt(name)
        text = await call_error(client, tool, **arguments, **{wrong: 1}, wait_for_previous=True)
        assert text == f"invalid_argument: unknown argument '{wrong}' (did you mean '{name}'?)"
        text = await call_error(client, "orchestrate_start", request="x", approve_befor=["writer"])
        assert text == "invalid_argument: unknown argument 'approve_befor' (did you mean 'approve_before'?)"

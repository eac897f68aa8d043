"""Strict argument types (issue 22, finding 11): every typed argument of every tool, nested fields
and list items included, refuses a value of another JSON type with ``invalid_argument`` naming it:
no string to number, boolean to number or string to boolean coercion. The arguments are walked from
the input schemas the tools publish (made from their models), so an argument added later is walked
too. An integral number (``20.0``) stays an integer: Gemini sends integers so."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp.types import CallToolResult, TextContent

from server.app import ConstructApp
from server.mcp.publishing import build_tools
from server.mcp.services import Services
from server.settings.config import load_settings
from tests.acceptance.harness import call, call_error

#: values of each JSON type; the strings look like numbers and booleans on purpose
SAMPLES: dict[str, list[Any]] = {
    "string": ["1", "true", "yes", "20"],
    "integer": [1, 0],
    "number": [1.5],
    "boolean": [True, False],
    "array": [[]],
    "object": [{}],
}


def json_types(schema: dict[str, Any]) -> set[str]:
    """The JSON types a (portable: no ``$ref``) schema takes, null left out."""
    types = {schema["type"]} if isinstance(schema.get("type"), str) else set()
    for branch in schema.get("anyOf", []):
        types |= json_types(branch)
    return types - {"null"}


def takes(types: set[str], value: Any) -> bool:
    if isinstance(value, bool):
        return "boolean" in types
    if isinstance(value, int):
        return bool(types & {"integer", "number"})
    if isinstance(value, float):
        return "number" in types
    kinds: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return kinds[type(value)] in types


Path = tuple[str | int, ...]


def fields(schema: dict[str, Any], path: Path) -> Iterator[tuple[Path, set[str]]]:
    """Every typed position under ``schema`` (the path to it, its JSON types): an object's
    properties, a list's first item, each union branch's."""
    for branch in (schema, *schema.get("anyOf", [])):
        for name, sub in branch.get("properties", {}).items():
            yield (*path, name), json_types(sub)
            yield from fields(sub, (*path, name))
        if isinstance(branch.get("items"), dict):
            yield (*path, 0), json_types(branch["items"])
            yield from fields(branch["items"], (*path, 0))


def placed(schema: dict[str, Any], path: Path, value: Any) -> Any:
    """``value`` at ``path`` in the objects and lists leading to it, each object with a right
    value for each of its required fields (so that only ``value`` is wrong)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    (branch,) = [b for b in (schema, *schema.get("anyOf", [])) if b.get("type") in ("object", "array")][:1]
    if isinstance(head, int):
        return [placed(branch["items"], rest, value)]
    required = {name: RIGHT[name] for name in branch.get("required", []) if name != head}
    return {**required, head: placed(branch["properties"][head], rest, value)}


def named(path: Path) -> str:
    """How an error names the position: ``budget.steps[0].step``."""
    out = str(path[0])
    for part in path[1:]:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


#: a right value for each required argument or field, so that only the wrong one is refused
RIGHT = {
    "request": "x",
    "run_id": "run-abc",
    "decision": "approve",
    "gate_id": "g",
    "task_id": "architect",
    "from_task": "t",
    "step": "writer",
    "input_tokens": 1,
    "output_tokens": 1,
}


def wrong_calls() -> Iterator[tuple[str, dict[str, Any], str, Any]]:
    """(tool, arguments, the argument's name in the error, the wrong value) for every
    wrong-typed value."""
    for tool in build_tools():
        for path, types in fields(tool.parameters, ()):
            assert types, (tool.name, path)
            for value in (v for samples in SAMPLES.values() for v in samples):
                if not takes(types, value):
                    yield tool.name, placed(tool.parameters, path, value), named(path), value


WRONG = list(wrong_calls())


@pytest.fixture
def server(tmp_path: pathlib.Path) -> MCPServer[Services]:
    env = {"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_ORCHESTRATION_STORE": "memory"}
    return ConstructApp(load_settings(env=env)).build_server()


def test_the_walk_covers_every_tool_and_the_coercions_once_accepted() -> None:
    assert {tool for tool, *_ in WRONG} == {t.name for t in build_tools()}
    said = {(tool, where, repr(value)) for tool, _, where, value in WRONG}
    for seen in (
        ("run_status", "wait_seconds", "1"),
        ("run_status", "wait_seconds", True),
        ("runs_list", "limit", "20"),
        ("orchestrate_resume", "detach_children", "yes"),
        ("orchestrate_resume", "usage.input_tokens", "1"),
        ("orchestrate_start", "budget.steps[0].step", 1),
        ("orchestrate_approve", "budget_raise.max_total_tokens", 1.5),
    ):
        assert (seen[0], seen[1], repr(seen[2])) in said, seen


async def test_every_wrong_json_type_is_invalid_argument_naming_it(server: MCPServer[Services]) -> None:
    accepted = []
    for tool, arguments, where, _ in WRONG:
        try:
            result = await server.call_tool(tool, arguments)
        except Exception as exc:  # accepted, then the tool ran here, outside of a request
            accepted.append((tool, arguments, repr(exc)[:120]))
            continue
        assert isinstance(result, CallToolResult)
        block = result.content[0]
        text = block.text if isinstance(block, TextContent) else ""
        # (a union argument, chain: its members' errors are said together)
        if not (result.is_error and text.startswith("invalid_argument: ") and f"{where}: " in text):
            accepted.append((tool, arguments, text[:120]))
    assert accepted == [], "\n".join(map(str, accepted))


async def test_an_integral_number_is_an_integer_and_a_fraction_is_not(server: MCPServer[Services]) -> None:
    async with Client(server) as client:
        assert (await call(client, "runs_list", limit=20.0))["runs"] == []
        text = await call_error(client, "runs_list", limit=20.5)
        assert text == "invalid_argument: limit: input should be a valid integer", text
        # a number where a number is due, integral or not, and a JSON list sent as text (hosts do)
        view = await call(client, "orchestrate_start", request="x", chain='["writer"]', wait_seconds=0.5)
        assert view["next_action"]["task_id"] == "writer"
        view = await call(client, "run_status", run_id=view["run_id"], wait_seconds=1)
        assert view["status"] == "awaiting_host"

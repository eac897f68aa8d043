"""Schemas every function-calling dialect accepts, without loss (issue 21 §2), checked with the
libraries hosts use before a request is sent (the ``test`` extra): OpenAI's strict conversion
(``openai-agents``), Gemini's typed ``Schema`` (``google-genai``), and a plain JSON Schema validator
(``jsonschema``, draft 2020-12) against what the server itself accepts."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agents.strict_schema import ensure_strict_json_schema
from google.genai import types
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]  # ships no type information
from mcp import Client
from mcp.server import MCPServer

from server.app import ConstructApp
from server.mcp.budget_argument import BudgetArgument
from server.mcp.publishing import build_tools
from server.mcp.services import Services
from server.settings.config import load_settings
from tests.acceptance.harness import call, text_of

NULL = {"type": "null"}
PAGE = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
#: keywords a portable schema never holds, anywhere
UNPORTABLE = ("$ref", "$defs", "dependentRequired", "exclusiveMinimum", "exclusiveMaximum")


def server_for(tmp_path: Path) -> MCPServer[Services]:
    env = {"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_ORCHESTRATION_STORE": "memory"}
    return ConstructApp(load_settings(env=env)).build_server()


@asynccontextmanager
async def connected(server: MCPServer[Services]) -> AsyncIterator[Client]:
    async with Client(server) as client:
        yield client


async def published(tmp_path: Path) -> dict[str, tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each tool's input and output schema, as ``tools/list`` sends them."""
    async with connected(server_for(tmp_path)) as client:
        tools = (await client.list_tools()).tools
    return {t.name: (t.input_schema, t.output_schema) for t in tools}


def nodes(schema: Any) -> Iterator[dict[str, Any]]:
    """Every schema object in ``schema`` (itself, properties, items, union branches)."""
    if isinstance(schema, dict):
        yield schema
        for key, value in schema.items():
            if key == "properties":
                for sub in value.values():
                    yield from nodes(sub)
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                yield from nodes(value)
            elif key == "anyOf":
                for sub in value:
                    yield from nodes(sub)


def test_the_walk_sees_nested_keywords() -> None:
    # the walk below must reach an open map two levels down, or the portability test proves nothing
    planted = {"properties": {"b": {"anyOf": [{"items": {"type": ["string", "null"]}}, NULL]}}}
    assert any(isinstance(n.get("type"), list) for n in nodes(planted))


async def test_every_schema_is_flat_and_closed(tmp_path: Path) -> None:
    schemas = await published(tmp_path)
    assert len(schemas) == 10
    for name, (input_schema, output_schema) in schemas.items():
        for node in nodes(input_schema):
            assert not set(UNPORTABLE) & node.keys(), (name, node)
            assert not isinstance(node.get("type"), list), (name, node)
            if node.get("type") == "object":
                # closed, and no open map: every object says its properties
                assert node.get("additionalProperties") is False and "properties" in node, (name, node)
        for node in nodes(output_schema):
            assert not set(UNPORTABLE) & node.keys(), (name, node)
            assert not isinstance(node.get("type"), list), (name, node)


# -- OpenAI strict function calling -------------------------------------------------------------


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as the Agents SDK converts an MCP tool's schema (``convert_schemas_to_strict``),
    refusing open objects like it does."""
    return ensure_strict_json_schema(copy.deepcopy(schema), _reject_open_objects=True)


def branch(schema: dict[str, Any], kind: str) -> dict[str, Any] | None:
    if schema.get("type") == kind:
        return schema
    return next((b for b in schema.get("anyOf", []) if b.get("type") == kind), None)


def as_strict_model_sends(schema: dict[str, Any], value: Any) -> Any:
    """``value`` with every key of every object present, those not given null: what a model in
    strict mode sends (the strict schema makes every property required)."""
    obj = branch(schema, "object") if isinstance(value, dict) else None
    if obj is not None:
        return {k: as_strict_model_sends(sub, value.get(k)) for k, sub in obj["properties"].items()}
    array = branch(schema, "array") if isinstance(value, list) else None
    if array is not None:
        return [as_strict_model_sends(array["items"], item) for item in value]
    return value


async def test_openai_strict_mode_accepts_every_input_schema(tmp_path: Path) -> None:
    for name, (input_schema, _) in (await published(tmp_path)).items():
        converted = strict(input_schema)
        # nothing is lost: the same properties, each optional one nullable (the strict form of
        # "may be omitted"), since strict mode requires them all
        assert converted["properties"].keys() == input_schema["properties"].keys(), name
        for prop, sub in converted["properties"].items():
            if prop not in input_schema.get("required", []):
                assert NULL in sub.get("anyOf", []), (name, prop)
        for node in nodes(converted):
            if branch(node, "object") is node:
                assert set(node["required"]) == set(node["properties"]), (name, node)


#: what a call means, per tool: the arguments a model sets (the rest it leaves out)
MEANT: dict[str, dict[str, Any]] = {
    "orchestrate_start": {
        "request": "Build it",
        "approve_before": ["engineer"],
        "budget": {"max_total_tokens": 100_000, "steps": [{"step": "engineer", "max_total_tokens": 50_000}]},
    },
    "orchestrate_resume": {"run_id": "RUN", "task_id": "architect", "output": "design"},
    "orchestrate_approve": {"run_id": "RUN", "decision": "approve", "gate_id": "before:engineer"},
    "run_status": {"run_id": "RUN"},
    "task_prompt": {"run_id": "RUN", "task_id": "architect"},
    "run_events": {"run_id": "RUN"},
    "runs_list": {},
    "orchestrate_fork": {"run_id": "RUN", "from_task": "engineer"},
    "orchestrate_cancel": {"run_id": "RUN"},
    "orchestrate_upgrade": {"run_id": "RUN"},
}


async def test_nulls_from_a_strict_model_mean_what_omitting_them_means(tmp_path: Path) -> None:
    schemas = await published(tmp_path)
    tools = {tool.name: tool for tool in build_tools()}
    assert MEANT.keys() == tools.keys()
    for name, meant in MEANT.items():
        sent = as_strict_model_sends(strict(schemas[name][0]), meant)
        assert sent.keys() == schemas[name][0]["properties"].keys()
        validate = tools[name].fn_metadata.validate_arguments
        assert validate(sent) == validate(meant), name
    sent_budget = as_strict_model_sends(strict(schemas["orchestrate_start"][0]), MEANT["orchestrate_start"])
    assert (
        sent_budget["budget"]["on_budget"] is None
        and sent_budget["budget"]["steps"][0]["max_cost_usd"] is None
    )
    budget = BudgetArgument.model_validate(sent_budget["budget"]).to_budget()
    assert budget == BudgetArgument.model_validate(MEANT["orchestrate_start"]["budget"]).to_budget()
    assert budget.on_budget == "fail" and budget.steps["engineer"].max_total_tokens == 50_000


async def test_a_strict_model_drives_every_tool(tmp_path: Path) -> None:
    """Every tool, called as a strict model calls it (every key, the unset ones null), answers as
    it does to the call that leaves them out."""
    server = server_for(tmp_path)
    async with connected(server) as client:
        schemas = {t.name: strict(t.input_schema) for t in (await client.list_tools()).tools}

        async def strictly(name: str, **arguments: Any) -> dict[str, Any]:
            sent = as_strict_model_sends(schemas[name], arguments)
            assert None in sent.values() or name == "orchestrate_approve", (name, sent)
            # what the model may send: the strict schema (every key required) takes it
            Draft202012Validator(schemas[name]).validate(sent)
            return await call(client, name, **sent)

        start = MEANT["orchestrate_start"]
        view = await strictly("orchestrate_start", **start)
        run_id = view["run_id"]
        assert view["next_action"]["task_id"] == "architect" and view["budget"]["max_total_tokens"] == 100_000
        # the step's limit from the list reached the run's budget
        assert view["budget"]["steps"]["engineer"]["max_total_tokens"] == 50_000
        view = await strictly("orchestrate_resume", run_id=run_id, task_id="architect", output="design")
        assert view["next_action"]["gate_id"] == "before:engineer"
        view = await strictly(
            "orchestrate_approve", run_id=run_id, decision="approve", gate_id="before:engineer"
        )
        assert view["next_action"]["task_id"] == "engineer"
        for name, arguments in (
            ("run_status", {"run_id": run_id}),
            ("run_events", {"run_id": run_id}),
            ("runs_list", {}),
        ):
            assert await strictly(name, **arguments) == await call(client, name, **arguments), name
        fork = await strictly("orchestrate_fork", run_id=run_id, from_task="engineer")
        assert fork["run_id"] != run_id and fork["next_action"]["task_id"] == "engineer"
        upgrade = await strictly("orchestrate_upgrade", run_id=fork["run_id"])
        assert upgrade == await call(client, "orchestrate_upgrade", run_id=fork["run_id"])
        assert upgrade["verdict"] == "current"  # the configuration did not change
        cancelled = await strictly("orchestrate_cancel", run_id=fork["run_id"])
        assert cancelled["status"] == "cancelled"


# -- Gemini's typed Schema ----------------------------------------------------------------------

#: JSON Schema keyword -> the ``types.Schema`` field that must carry it
CARRIED = {
    "enum": "enum",
    "minimum": "minimum",
    "maximum": "maximum",
    "minLength": "min_length",
    "maxLength": "max_length",
    "minItems": "min_items",
    "maxItems": "max_items",
    "required": "required",
    "description": "description",
    "default": "default",
}


def expected(node: dict[str, Any]) -> dict[str, Any]:
    """What a schema node says, in Gemini's terms: a nullable type (an ``anyOf`` with null), its
    enums and bounds, its properties and items."""
    branches = node.get("anyOf")
    if branches is not None:
        others = [b for b in branches if b != NULL]
        said: dict[str, Any] = (
            expected(others[0]) if len(others) == 1 else {"any_of": [expected(b) for b in others]}
        )
        said["nullable"] = len(others) < len(branches)
        said.update({k: node[k] for k in ("description", "default") if k in node})
        return said
    said = {"type": node["type"].upper(), "nullable": False}
    said.update({field: node[keyword] for keyword, field in CARRIED.items() if keyword in node})
    if "properties" in node:
        said["properties"] = {k: expected(v) for k, v in node["properties"].items()}
    if "items" in node:
        said["items"] = expected(node["items"])
    return said


def is_null(schema: types.Schema) -> bool:
    return schema.type == types.Type.NULL or schema.model_dump(exclude_unset=True) == {"nullable": True}


def carried(schema: types.Schema) -> dict[str, Any]:
    """What a converted ``types.Schema`` says, in the terms of :func:`expected`."""
    if schema.any_of:
        others = [b for b in schema.any_of if not is_null(b)]
        said: dict[str, Any] = (
            carried(others[0]) if len(others) == 1 else {"any_of": [carried(b) for b in others]}
        )
        said["nullable"] = bool(schema.nullable) or len(others) < len(schema.any_of)
        said.update(
            {k: getattr(schema, k) for k in ("description", "default") if getattr(schema, k) is not None}
        )
        return said
    assert schema.type is not None
    said = {"type": schema.type.value, "nullable": bool(schema.nullable)}
    said.update({f: getattr(schema, f) for f in CARRIED.values() if getattr(schema, f) is not None})
    if schema.properties:
        said["properties"] = {k: carried(v) for k, v in schema.properties.items()}
    if schema.items:
        said["items"] = carried(schema.items)
    return said


async def test_gemini_takes_every_input_schema_with_its_enums_and_bounds(tmp_path: Path) -> None:
    for name, (input_schema, _) in (await published(tmp_path)).items():
        # no keyword refused: JSONSchema and Schema forbid extra fields
        as_json_schema = types.JSONSchema.model_validate(input_schema)
        converted = types.Schema.from_json_schema(
            json_schema=as_json_schema, raise_error_on_unsupported_field=True
        )
        validated = types.Schema.model_validate(input_schema)
        want = expected(input_schema)
        assert carried(converted) == want, name
        assert carried(validated) == want, name
        # the typed Schema keeps the closed objects too (from_json_schema drops additionalProperties
        # by design: Gemini's function declarations have no such keyword)
        assert validated.additional_properties is False, name


def test_the_gemini_comparison_sees_a_lost_bound() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}}}
    lossy = types.Schema.model_validate(
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}
    )
    assert carried(lossy) != expected(schema)
    assert carried(types.Schema.model_validate(schema)) == expected(schema)


# -- a plain JSON Schema validator against the server -------------------------------------------

RUN = "RUN"
#: (tool, arguments, what is accepted): True, both the published schema and the server; False,
#: neither; a reason, the schema but not the server, which refuses with ``invalid_argument`` a
#: rule portable schemas cannot say (an exclusive bound, one argument needing another, a step
#: named twice). ``RUN`` is a run awaiting its engineer's output (for orchestrate_approve: the
#: approval of the gate before the engineer).
TABLE: list[tuple[str, dict[str, Any], bool | str]] = [
    ("orchestrate_start", {"request": "x"}, True),
    ("orchestrate_start", {"request": "x", "chain": "default", "wait_seconds": 0}, True),
    ("orchestrate_start", {"request": "x", "chain": ["architect", "engineer"], "model": None}, True),
    ("orchestrate_start", {"request": "x", "timeout_seconds": 0.5, "task_timeout_seconds": 60}, True),
    (
        "orchestrate_start",
        {
            "request": "x",
            "budget": {"max_cost_usd": None, "steps": [{"step": "engineer", "max_total_tokens": 9}]},
        },
        True,
    ),
    ("orchestrate_start", {"request": "x", "budget": {"max_total_tokens": 10, "on_budget": "ask"}}, True),
    ("orchestrate_start", {"request": "x", "new_run": True}, True),
    ("orchestrate_start", {"request": "x", "new_run": None, "idempotency_key": "k"}, True),
    ("orchestrate_start", {"request": "x", "new_run": "maybe"}, False),
    ("orchestrate_start", {}, False),
    ("orchestrate_start", {"request": 7}, False),
    ("orchestrate_start", {"request": "x", "chain": ""}, False),
    ("orchestrate_start", {"request": "x", "chain": []}, False),
    ("orchestrate_start", {"request": "x", "worker_backend": "gpu"}, False),
    ("orchestrate_start", {"request": "x", "timeout_seconds": -1}, False),
    ("orchestrate_start", {"request": "x", "wait_seconds": 301}, False),
    ("orchestrate_start", {"request": "x", "approve_before": ["s"] * 51}, False),
    ("orchestrate_start", {"request": "x", "approver": "me"}, False),
    ("orchestrate_start", {"request": "x", "budget": {"max_total_tokens": 0}}, False),
    ("orchestrate_start", {"request": "x", "budget": {"max_tokens": 5}}, False),
    (
        "orchestrate_start",
        {"request": "x", "budget": {"steps": {"engineer": {"max_total_tokens": 5}}}},
        False,
    ),
    ("orchestrate_start", {"request": "x", "budget": {"steps": [{"max_total_tokens": 5}]}}, False),
    ("orchestrate_start", {"request": "x", "budget": {"on_budget": "maybe"}}, False),
    (
        "orchestrate_start",
        {"request": "x", "timeout_seconds": 0},
        "exclusive bound: more than 0 (exclusiveMinimum is not portable)",
    ),
    (
        "orchestrate_start",
        {"request": "x", "budget": {"max_cost_usd": 0}},
        "exclusive bound: more than 0 (exclusiveMinimum is not portable)",
    ),
    (
        "orchestrate_start",
        {
            "request": "x",
            "budget": {"steps": [{"step": "engineer"}, {"step": "engineer", "max_total_tokens": 1}]},
        },
        "a step named twice in budget.steps",
    ),
    ("orchestrate_start", {"request": "x", "parent_run_id": RUN}, "parent_run_id goes with parent_task_id"),
    ("orchestrate_fork", {"run_id": RUN, "from_task": "engineer"}, True),
    ("orchestrate_fork", {"run_id": RUN, "from_task": "engineer", "chain": None, "request": "y"}, True),
    ("orchestrate_fork", {"run_id": RUN}, False),
    ("orchestrate_fork", {"run_id": RUN, "from_task": ""}, False),
    ("orchestrate_fork", {"run_id": RUN, "from_task": "engineer", "idempotency_key": ""}, False),
    ("orchestrate_resume", {"run_id": RUN, "task_id": "engineer", "output": "code"}, True),
    (
        "orchestrate_resume",
        {
            "run_id": RUN,
            "task_id": "engineer",
            "output": "code",
            "usage": {"input_tokens": 1, "output_tokens": 2, "cost_usd": None},
            "detach_children": None,
        },
        True,
    ),
    ("orchestrate_resume", {"run_id": RUN, "task_id": "engineer", "output": 5}, False),
    ("orchestrate_resume", {"run_id": RUN, "task_id": "", "output": "code"}, False),
    ("orchestrate_resume", {"run_id": "r" * 81}, False),
    (
        "orchestrate_resume",
        {"run_id": RUN, "task_id": "engineer", "output": "c", "usage": {"input_tokens": 1}},
        False,
    ),
    (
        "orchestrate_resume",
        {
            "run_id": RUN,
            "task_id": "engineer",
            "output": "c",
            "usage": {"input_tokens": -1, "output_tokens": 1},
        },
        False,
    ),
    (
        "orchestrate_resume",
        {"run_id": RUN, "output": "code"},
        "output needs task_id (dependentRequired is not portable)",
    ),
    ("orchestrate_resume", {"run_id": RUN, "task_id": "engineer"}, "task_id goes with output"),
    (
        "orchestrate_resume",
        {"run_id": RUN, "usage": {"input_tokens": 1, "output_tokens": 1}},
        "usage goes with output",
    ),
    ("orchestrate_approve", {"run_id": RUN, "decision": "approve", "gate_id": "before:engineer"}, True),
    (
        "orchestrate_approve",
        {
            "run_id": RUN,
            "decision": "reject",
            "gate_id": "before:engineer",
            "comment": "no",
            "approver": None,
        },
        True,
    ),
    ("orchestrate_approve", {"run_id": RUN, "decision": "maybe", "gate_id": "g"}, False),
    ("orchestrate_approve", {"run_id": RUN, "decision": "approve"}, False),
    (
        "orchestrate_approve",
        {"run_id": RUN, "decision": "approve", "gate_id": "g", "comment": "c" * 20_001},
        False,
    ),
    (
        "orchestrate_approve",
        {"run_id": RUN, "decision": "approve", "gate_id": "g", "budget_raise": {"max_total_tokens": 0}},
        False,
    ),
    (
        "orchestrate_approve",
        {"run_id": RUN, "decision": "approve", "gate_id": "g", "budget_raise": {"x": 1}},
        False,
    ),
    (
        "orchestrate_approve",
        {"run_id": RUN, "decision": "approve", "gate_id": "g", "budget_raise": {"max_cost_usd": 0}},
        "exclusive bound: more than 0 (exclusiveMinimum is not portable)",
    ),
    ("run_status", {"run_id": RUN}, True),
    ("run_status", {"run_id": RUN, "detail": "full", "task_id": "architect", "wait_seconds": None}, True),
    ("run_status", {"run_id": RUN, "detail": "all"}, False),
    ("run_status", {"run_id": RUN, "wait_seconds": -1}, False),
    ("run_status", {"run_id": RUN, "wait_seconds": "soon"}, False),
    ("run_status", {"wait_seconds": 0}, False),
    ("orchestrate_upgrade", {"run_id": RUN, "dry_run": None}, True),
    ("orchestrate_upgrade", {"run_id": RUN, "dry_run": "no"}, False),
    ("orchestrate_cancel", {"run_id": RUN, "reason": None}, True),
    ("orchestrate_cancel", {"run_id": RUN, "reason": 5}, False),
    ("orchestrate_cancel", {"run_id": RUN, "reason": "r" * 20_001}, False),
    ("runs_list", {}, True),
    ("runs_list", {"status": ["queued", "awaiting_host"], "limit": 500, "cursor": None}, True),
    ("runs_list", {"limit": 0}, False),
    ("runs_list", {"limit": 501}, False),
    ("runs_list", {"status": ["done"]}, False),
    ("runs_list", {"cursor": "c" * 401}, False),
    ("run_events", {"run_id": RUN, "after_seq": 0, "limit": None}, True),
    ("run_events", {"run_id": RUN, "after_seq": -1}, False),
    ("run_events", {"run_id": RUN, "limit": 501}, False),
    ("task_prompt", {"run_id": RUN, "task_id": "architect", "offset": None}, True),
    ("task_prompt", {"run_id": RUN, "task_id": "architect", "offset": -1}, False),
]


def test_the_table_covers_every_tool() -> None:
    assert {tool for tool, _, _ in TABLE} == {tool.name for tool in build_tools()}
    for tool in {tool for tool, _, _ in TABLE}:
        rows = [accepted for name, _, accepted in TABLE if name == tool]
        assert True in rows and False in rows, tool


async def a_run_awaiting_its_engineer(client: Client, *, gated: bool) -> str:
    """A run whose architect is done, awaiting its engineer's output, or, ``gated``, the approval
    of the gate before the engineer."""
    view = await call(
        client, "orchestrate_start", request="Build it", approve_before=["engineer"] if gated else []
    )
    run_id = str(view["run_id"])
    await call(client, "orchestrate_resume", run_id=run_id, task_id="architect", output="design")
    return run_id


def refused_as_arguments(text: str) -> bool:
    return text.startswith(("invalid_argument:", "too_large:"))


async def test_the_published_schema_accepts_what_the_server_accepts(tmp_path: Path) -> None:
    """Every row of :data:`TABLE`, each on a run of its own (one server: building one per row
    would cost more than the whole check)."""
    schemas = await published(tmp_path)
    validators = {}
    for tool, (input_schema, _) in schemas.items():
        Draft202012Validator.check_schema(input_schema)
        validators[tool] = Draft202012Validator(input_schema)
    wrong = []
    async with connected(server_for(tmp_path)) as client:
        for tool, arguments, accepted in TABLE:
            if validators[tool].is_valid(arguments) is not (accepted is not False):
                wrong.append((tool, arguments, "the schema disagrees"))
            run_id = await a_run_awaiting_its_engineer(client, gated=tool == "orchestrate_approve")
            sent = {k: run_id if v == RUN else v for k, v in arguments.items()}
            result = await client.call_tool(tool, sent)
            text = text_of(result) if result.is_error else ""
            if isinstance(accepted, str):  # a rule only the server checks
                if not text.startswith("invalid_argument:"):
                    wrong.append((tool, arguments, f"{accepted}, but the server answered {text!r}"))
            elif refused_as_arguments(text) is accepted:
                wrong.append((tool, arguments, f"the server answered {text!r}"))
    assert wrong == []


async def test_the_readmes_budget_example_is_what_the_schema_takes(tmp_path: Path) -> None:
    section = PAGE.read_text("utf-8").split("**Budgets** are hard limits", 1)[1]
    example = json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])
    assert example["name"] == "orchestrate_start"
    schema = (await published(tmp_path))["orchestrate_start"][0]
    assert Draft202012Validator(schema).is_valid(example["arguments"])
    budget = BudgetArgument.model_validate(example["arguments"]["budget"]).to_budget()
    assert budget.steps["engineer"].max_cost_usd == 0.5 and budget.on_budget == "ask"

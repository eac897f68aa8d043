"""Typed step outputs: output schemas in the catalog, validation of answers, the prompt's "Answer
format" section, and how views and the timeline show a validated value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.chains.schemas import BUILTIN_SCHEMAS, MAX_SCHEMA_CHARS, validate_output
from orchestration.core.facts import TaskCompleted
from orchestration.errors import ConfigError, InvalidOutput
from server.views.timeline import describe_fact

VERDICT = dict(BUILTIN_SCHEMAS["verdict"])


def load(tmp_path: Path, text: str) -> Catalog:
    path = tmp_path / "construct.toml"
    path.write_text(text)
    return Catalog.load(path)


# --- the catalog ---------------------------------------------------------------------------------


def test_a_step_names_a_builtin_schema_and_the_run_snapshots_it(tmp_path: Path) -> None:
    catalog = load(
        tmp_path,
        '[chains.rev]\nsteps = ["engineer", { specialist = "reviewer", output_schema = "verdict" }]\n',
    )
    chain = catalog.resolve("rev")
    assert chain.step("engineer").output_schema is None
    assert chain.step("reviewer").output_schema == VERDICT
    # The schema is part of the snapshot (and of its hash), not a reference to the config.
    assert chain.model_dump(mode="json")["steps"][1]["output_schema"] == VERDICT


def test_a_step_gives_an_inline_json_schema(tmp_path: Path) -> None:
    catalog = load(
        tmp_path,
        """
[chains.score]
steps = [{ specialist = "reviewer", output_schema = { type = "object", properties = """
        """{ score = { type = "integer", minimum = 0 } }, required = ["score"] } }]
""",
    )
    schema = catalog.resolve("score").step("reviewer").output_schema
    assert schema == {
        "type": "object",
        "properties": {"score": {"type": "integer", "minimum": 0}},
        "required": ["score"],
    }


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ('"verdikt"', "unknown built-in schema 'verdikt'; built-in: verdict"),
        ('{ type = "objekt" }', "is not a valid JSON Schema: at /type:"),
        ('{ type = "object", required = "verdict" }', "is not a valid JSON Schema: at /required:"),
        (
            '{ type = "array", items = { type = "string" } }',
            'must describe an object: give it "type": "object"',
        ),
        ("42", "must be the name of a built-in schema or a table holding a JSON Schema"),
        (
            '{ type = "object", properties = { v = { "$ref" = "#/$defs/nope" } } }',
            "$ref '#/$defs/nope' points at nothing in the schema",
        ),
        (
            '{ type = "object", properties = { v = { "$ref" = "https://example.com/v.json" } } }',
            "$ref 'https://example.com/v.json' is not inside the schema",
        ),
    ],
)
def test_bad_output_schemas_name_the_file_and_field(tmp_path: Path, value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(
            tmp_path,
            f'[chains.x]\nsteps = ["engineer", {{ specialist = "reviewer", output_schema = {value} }}]\n',
        )
    error = info.value
    assert error.code == "config_error"
    assert error.file == str(tmp_path / "construct.toml")
    assert error.field == "chains.x.steps[1].output_schema"
    assert problem in error.problem


def test_a_schema_may_refer_to_its_own_definitions(tmp_path: Path) -> None:
    catalog = load(
        tmp_path,
        '[chains.x]\nsteps = [{ specialist = "reviewer", output_schema = { type = "object", '
        '"$defs" = { grade = { enum = ["a", "b"] } }, '
        'properties = { g = { "$ref" = "#/$defs/grade" } } } }]\n',
    )
    schema = catalog.resolve("x").step("reviewer").output_schema
    assert schema is not None and validate_output(schema, '{"g": "a"}') == {"g": "a"}
    with pytest.raises(InvalidOutput, match=r"at /g: 'c' is not one of \['a', 'b'\]"):
        validate_output(schema, '{"g": "c"}')


def test_a_schema_is_bounded_in_size(tmp_path: Path) -> None:
    enum = ", ".join(f'"value-{i:05d}"' for i in range(MAX_SCHEMA_CHARS // 10))
    with pytest.raises(ConfigError) as info:
        load(
            tmp_path,
            f'[chains.x]\nsteps = [{{ specialist = "reviewer", output_schema = {{ type = "object", '
            f"properties = {{ v = {{ enum = [{enum}] }} }} }} }}]\n",
        )
    assert info.value.field == "chains.x.steps[0].output_schema"
    assert f"at most {MAX_SCHEMA_CHARS}" in info.value.problem


# --- validate_output -----------------------------------------------------------------------------


def test_a_valid_answer_gives_its_value() -> None:
    text = '{"verdict": "approve", "notes": "ship it"}'
    assert validate_output(VERDICT, text) == {"verdict": "approve", "notes": "ship it"}


@pytest.mark.parametrize("fence", ["```json\n{}\n```", "```\n{}\n```", "  ```JSON\n{}\n```\n"])
def test_one_fenced_block_around_the_answer_is_tolerated(fence: str) -> None:
    text = fence.replace("{}", '{"verdict": "revise", "notes": "add tests"}')
    assert validate_output(VERDICT, text) == {"verdict": "revise", "notes": "add tests"}


@pytest.mark.parametrize(
    "text",
    [
        'Here you go:\n```json\n{"verdict": "approve", "notes": ""}\n```',
        '```json\n{"verdict": "approve", "notes": ""}\n```\nHope that helps.',
        'The verdict is {"verdict": "approve", "notes": ""}',
    ],
)
def test_prose_around_the_answer_is_not_json(text: str) -> None:
    with pytest.raises(InvalidOutput) as info:
        validate_output(VERDICT, text)
    assert info.value.code == "invalid_output"
    assert "the answer is not JSON" in info.value.message
    assert "line 1 column 1" in info.value.message


def test_invalid_json_says_where_and_echoes_a_bounded_start() -> None:
    text = '{"verdict": "approve", "notes": "' + "x" * 5000
    with pytest.raises(InvalidOutput) as info:
        validate_output(VERDICT, text)
    message = info.value.message
    assert "Unterminated string" in message and "line 1 column" in message
    assert "x" * 100 not in message and "(5033 characters)" in message
    assert len(message) < 400


def test_json_nested_too_deeply_is_invalid_not_a_crash() -> None:
    with pytest.raises(InvalidOutput, match="nested too deeply"):
        validate_output(VERDICT, "[" * 100_000)


def test_schema_violations_name_their_json_pointer() -> None:
    with pytest.raises(InvalidOutput) as info:
        validate_output(VERDICT, '{"verdict": "maybe", "extra": 1}')
    message = info.value.message
    assert message.startswith("the answer does not match the output schema: ")
    assert "at /verdict: 'maybe' is not one of ['approve', 'revise', 'reject']" in message
    assert "at (root): 'notes' is a required property" in message
    assert "('extra' was unexpected)" in message


def test_at_most_three_violations_are_named_and_each_is_cut() -> None:
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdef"}}
    answer = {k: "y" * 1000 for k in "abcdef"}
    with pytest.raises(InvalidOutput) as info:
        validate_output(schema, json.dumps(answer))
    message = info.value.message
    assert message.count("at /") == 3 and message.endswith("; and 3 more")
    assert "y" * 200 not in message and len(message) < 700


def test_a_json_pointer_escapes_slashes_and_tildes() -> None:
    schema = {"type": "object", "properties": {"a/b~c": {"type": "integer"}}}
    with pytest.raises(InvalidOutput) as info:
        validate_output(schema, '{"a/b~c": "no"}')
    assert "at /a~1b~0c:" in info.value.message


def test_a_non_object_answer_is_refused() -> None:
    with pytest.raises(InvalidOutput) as info:
        validate_output(VERDICT, '["approve"]')
    assert "at (root): ['approve'] is not of type 'object'" in info.value.message


# --- prompts, timeline -----------------------------------------------------------------------------


async def test_a_typed_steps_prompt_carries_the_answer_format(tmp_path: Path) -> None:
    from orchestration.core import StartRequest
    from orchestration.engine.runtime import Runtime
    from stores.memory import MemoryStore

    catalog = load(
        tmp_path,
        '[chains.rev]\nsteps = ["engineer", { specialist = "reviewer", output_schema = "verdict" }]\n',
    )
    runtime = Runtime(MemoryStore(), catalog)
    head, _ = await runtime.start(StartRequest("Build it", chain="rev"))
    await runtime.drive(head.run_id)
    engineer = (await runtime.snapshot(head.run_id)).host_task
    assert engineer is not None and "Answer format" not in engineer.user
    await runtime.submit_host_output(head.run_id, "engineer", "the code")
    await runtime.drive(head.run_id)
    first = (await runtime.snapshot(head.run_id)).host_task
    assert first is not None and first.task_id == "reviewer"
    assert first.user.endswith(
        "## Answer format\n\nAnswer with one JSON object that matches this JSON Schema, and nothing else "
        "(no prose before or after it):\n\n"
        + json.dumps(VERDICT, sort_keys=True, separators=(",", ":"))
        + "\n"
    )
    again = (await runtime.snapshot(head.run_id)).host_task
    assert again is not None and again.user == first.user  # deterministic


def test_the_timeline_shows_a_typed_tasks_value() -> None:
    from datetime import UTC, datetime

    fact = TaskCompleted(
        seq=5,
        at=datetime(2026, 11, 30, tzinfo=UTC),
        task_id="reviewer",
        attempt=1,
        executor="inline:host",
        output='```json\n{"verdict": "revise", "notes": "n"}\n```',
        output_sha256="0" * 64,
        value={"verdict": "revise", "notes": "n"},
    )
    assert describe_fact(fact) == 'reviewer: done by inline:host: value {"verdict": "revise", "notes": "n"}'

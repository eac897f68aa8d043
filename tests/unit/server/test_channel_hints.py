"""An error's next steps in each channel's words (issue 26): the engine names operations
(:class:`~orchestration.errors.Hint`); the MCP tools say them as tool calls, exactly as they always
did; the CLI as ``construct-mcp`` commands and flags; neither says the other's words."""

from __future__ import annotations

import json

import pytest

from orchestration.chains import Catalog
from orchestration.core import StartRequest
from orchestration.errors import ConstructError, Hint, InvalidArgument, RunNotFound, Said, hint, plain_problem
from orchestration.workers.provider_worker import ProviderSettings
from server.cli.command_hints import cli_message, cli_words
from server.mcp.arguments import error_result
from server.mcp.tool_hints import tool_message, tool_words
from tests.unit.helpers import make_runtime

#: Words of the MCP channel a CLI user must never read.
TOOL_WORDS = ("call ", "orchestrate_", "runs_list", "run_status")


def assert_cli_words(text: str) -> None:
    assert not [word for word in TOOL_WORDS if word in text], text


async def test_an_unknown_run_names_the_listing_in_each_channels_words() -> None:
    exc = RunNotFound("run-x01")
    said = "no run with id 'run-x01' in this store; {} to see the runs that exist"
    assert tool_message(exc) == said.format("call runs_list")
    result = error_result(exc)
    assert result.content[0].text == "run_not_found: " + said.format("call runs_list")  # type: ignore[union-attr]
    assert cli_message(exc) == said.format("run `construct-mcp runs list`")
    assert_cli_words(cli_message(exc))
    assert_cli_words(exc.message)  # the neutral words (logs) name no tool either


async def test_the_calls_a_run_awaits_are_tool_calls_for_mcp_and_commands_for_the_cli() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("x", chain=("writer",), approve_before=("writer",)))
    await runtime.drive(head.run_id)
    run_id = head.run_id
    with pytest.raises(ConstructError) as at_gate:
        await runtime.check_resumable(run_id)
    call = json.dumps({"run_id": run_id, "gate_id": "before:writer", "decision": "approve"})
    assert tool_message(at_gate.value).endswith(
        f"; it awaits: call orchestrate_approve with {call} once the user decided "
        "(decision: approve or reject)"
    )
    cli = cli_message(at_gate.value)
    assert cli.endswith(
        f"; it awaits: run `construct-mcp runs approve {run_id} --gate-id before:writer` once the "
        "user decided (--reject to decide otherwise)"
    )
    assert_cli_words(cli)

    await runtime.approve(run_id, "approve", "before:writer")
    await runtime.drive(run_id)
    with pytest.raises(InvalidArgument) as at_task:
        await runtime.check_resumable(run_id)
    call = json.dumps({"run_id": run_id, "task_id": "writer"})
    assert tool_message(at_task.value).endswith(
        f"; it awaits: call orchestrate_resume with {call} plus output (your model's answer to the "
        "task's prompt; run_status shows it)"
    )
    cli = cli_message(at_task.value)
    assert cli.endswith(
        f"; it awaits: run `construct-mcp runs resume {run_id} --task-id writer --output-file ANSWER.md` "
        f"(your model's answer to the task's prompt; `construct-mcp runs status {run_id}` shows it)"
    )
    assert_cli_words(cli)


def test_a_start_without_a_model_names_the_argument_or_the_flag() -> None:
    settings = ProviderSettings(endpoints={})
    step = Catalog.builtin().resolve("default").steps[0]
    with pytest.raises(InvalidArgument) as refused:
        settings.resolve_step(step, None, None)
    said = "no model for step 'architect': {}, set it on the chain step, or set CONSTRUCT_MODEL"
    assert tool_message(refused.value) == said.format("pass model to orchestrate_start")
    assert cli_message(refused.value) == said.format("pass --model to `construct-mcp runs start`")


@pytest.mark.parametrize(
    ("part", "tool", "cli"),
    [
        (
            Hint("show_run", {"run_id": "r1"}, form="name"),
            'run_status with {"run_id": "r1"}',
            "`construct-mcp runs status r1`",
        ),
        (
            Hint("wait_run", run_id="r1", form="name"),
            "run_status with wait_seconds",
            "`construct-mcp runs tail r1`",
        ),
        (Hint("show_run", form="name"), "run_status", "`construct-mcp runs status RUN_ID`"),
        (
            Hint("approve_gate", {"decision": ("approve", "reject", "revise")}, form="choices"),
            "decision: approve, reject or revise",
            "--reject or --revise to decide otherwise",
        ),
        (
            Hint("approve_gate", {"run_id": "r1", "gate_id": "g 1", "decision": "reject"}),
            'call orchestrate_approve with {"run_id": "r1", "gate_id": "g 1", "decision": "reject"}',
            "run `construct-mcp runs approve r1 --gate-id 'g 1' --reject`",
        ),
    ],
)
def test_each_form_of_a_hint_in_both_channels(part: Hint, tool: str, cli: str) -> None:
    assert tool_words(part) == tool
    assert cli_words(part) == cli
    assert_cli_words(cli)


def test_a_message_is_built_from_text_and_hints_as_a_string_is() -> None:
    said = "a " + hint("list_runs") + " b" + Said(("c",))
    assert isinstance(said, Said) and said.hints() == (Hint("list_runs"),)
    assert said.rendered(tool_words) == "a call runs_list bc"
    assert str(InvalidArgument(said)) == "a list the runs bc"


@pytest.mark.parametrize(
    ("error", "plain"),
    [
        (
            {"type": "int_parsing", "msg": "Input should be a valid integer", "input": "many"},
            "must be a whole number (it is a string)",
        ),
        (
            {"type": "string_type", "msg": "Input should be a valid string", "input": 5},
            "must be a string (it is a whole number)",
        ),
        (
            {
                "type": "greater_than_equal",
                "msg": "Input should be greater than or equal to 1",
                "ctx": {"ge": 1},
            },
            "must be at least 1",
        ),
        ({"type": "string_too_short", "msg": "...", "ctx": {"min_length": 1}}, "must not be empty"),
        ({"type": "missing", "msg": "Field required"}, "is required"),
        (
            {
                "type": "literal_error",
                "msg": "...",
                "ctx": {"expected": "'inline' or 'provider'"},
                "input": "provder",
            },
            "must be 'inline' or 'provider' (did you mean 'provider'?)",
        ),
        (
            {"type": "value_error", "msg": "Value error, give one of 'url' or 'command'"},
            "give one of 'url' or 'command'",
        ),
        (
            {"type": "url_parsing", "msg": "Input should be a valid URL, empty host"},
            "must be a valid URL, empty host",
        ),
    ],
)
def test_validation_problems_in_a_config_files_words(error: dict[str, object], plain: str) -> None:
    said = plain_problem(error)
    assert said == plain
    assert "Input should" not in said and "Value error" not in said

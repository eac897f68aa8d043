"""The calls a host is handed, sent as they are, in process through the official client.

Every ``next_action`` (and every entry of a parallel run's ``more_actions``) carries ``tool`` and
``arguments``: sending those arguments to that tool (a host task adds its ``output``, see ``add``)
moves the run on. And every error a wrong tool gets (``orchestrate_resume`` at a gate,
``orchestrate_approve`` at a host task, a call missing its task or gate) names the call that
answers instead, with JSON arguments that, sent, move the run on too."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import Client

from server.app import ConstructApp
from server.settings.config import load_settings

CHILD_CHAINS = """
[chains.gated-inner]
steps = [{ specialist = "engineer", approve_before = true }, "reviewer"]

[chains.outer-gated]
steps = ["architect", { name = "build", chain = "gated-inner" }]
"""


@asynccontextmanager
async def connected(home: Path) -> AsyncIterator[Client]:
    (home / "construct.toml").write_text(CHILD_CHAINS)
    settings = load_settings(env={"CONSTRUCT_HOME": str(home), "CONSTRUCT_POLL_SECONDS": "0.1"})
    async with Client(ConstructApp(settings).build_server()) as client:
        yield client


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def refused(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    text = result.content[0].text  # type: ignore[union-attr]
    assert isinstance(text, str)
    return text


async def follow(client: Client, action: dict[str, Any], output: str | None = None) -> dict[str, Any]:
    """Send the action's call as it is; a host task's with ``output`` added, as ``add`` says."""
    arguments = dict(action["arguments"])
    if action["kind"] == "run_host_task":
        assert list(action["add"]) == ["output"]
        arguments["output"] = output or f"the work of {action['task_id']}"
    return await call(client, action["tool"], arguments)


def named_calls(message: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls an error names: ``call <tool> with {json}``."""
    return [(tool, json.loads(args)) for tool, args in re.findall(r"call (\w+) with (\{[^}]*\})", message)]


async def _at_gate(client: Client) -> dict[str, Any]:
    """A default-chain run gated before the engineer, waiting at that gate."""
    view = await call(
        client, "orchestrate_start", {"request": "Build a URL shortener", "approve_before": ["engineer"]}
    )
    view = await follow(client, view["next_action"])
    assert view["next_action"]["kind"] == "approve", view["next_action"]
    return view


# -- next_action, sent as it is ----------------------------------------------------------------


async def test_a_host_tasks_call_with_its_output_records_the_output(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await call(client, "orchestrate_start", {"request": "Build a URL shortener"})
        action = view["next_action"]
        assert (action["kind"], action["tool"]) == ("run_host_task", "orchestrate_resume")
        assert action["arguments"] == {"run_id": view["run_id"], "task_id": "architect"}
        assert action["add"] == {"output": "your complete answer"}
        after = await follow(client, action, "the design")
        assert after["tasks"][0]["status"] == "done" and after["tasks"][0]["output_chars"] == 10
        assert "the design" in after["next_action"]["user_prompt"]  # so no preview: it travels once
        assert after["next_action"]["arguments"] == {"run_id": view["run_id"], "task_id": "engineer"}


async def test_a_gates_call_sent_as_it_is_approves_and_lists_the_other_choices(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await _at_gate(client)
        action = view["next_action"]
        assert action["tool"] == "orchestrate_approve"
        assert action["arguments"] == {
            "run_id": view["run_id"],
            "gate_id": "before:engineer",
            "decision": "approve",
        }
        # The choices are the gate's decisions, each with what it does.
        gate = next(g for g in view["gates"] if g["gate_id"] == "before:engineer")
        assert list(action["choices"]) == gate["decisions"] == ["approve", "reject", "revise"]
        assert all(isinstance(meaning, str) and meaning for meaning in action["choices"].values())
        after = await follow(client, action)
        assert next(g for g in after["gates"] if g["gate_id"] == "before:engineer")["status"] == "approved"
        assert after["next_action"]["arguments"] == {"run_id": view["run_id"], "task_id": "engineer"}


async def test_another_choice_is_the_same_call_with_decision_set(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await _at_gate(client)
        action = view["next_action"]
        after = await call(client, action["tool"], action["arguments"] | {"decision": "reject"})
        assert after["status"] == "rejected" and after["next_action"]["kind"] == "none"


async def test_an_inline_start_answers_its_first_host_task_without_waiting(tmp_path: Path) -> None:
    """The first host task is prepared in the run's first write (issue 23): even a start that
    does not wait answers with it, not with a wait."""
    async with connected(tmp_path) as client:
        view = await call(
            client, "orchestrate_start", {"request": "Build a URL shortener", "wait_seconds": 0}
        )
        action = view["next_action"]
        assert (view["status"], action["kind"]) == ("awaiting_host", "run_host_task")
        assert action["arguments"] == {"run_id": view["run_id"], "task_id": "architect"}


async def test_a_finished_run_names_no_call_and_says_how_to_read_its_outputs(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await call(client, "orchestrate_start", {"request": "Build a URL shortener"})
        long = "x" * 1000  # longer than a preview
        while view["next_action"]["kind"] == "run_host_task":
            view = await follow(client, view["next_action"], long)
        action = view["next_action"]
        assert (view["status"], action["kind"]) == ("completed", "none")
        # A host that makes every call an answer names stops here: there is none.
        assert set(action) == {"kind", "instruction"}
        assert "run_status" in action["instruction"] and "task_id" in action["instruction"]
        assert all("output" not in t or t["output"] is None for t in view["tasks"])
        whole = await call(client, "run_status", {"run_id": view["run_id"], "detail": "full"})
        assert [t["output"] for t in whole["tasks"]] == [long, long, long]
        assert next(iter(whole)) == "next_action"


async def test_an_answer_names_its_call_first(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await call(
            client, "orchestrate_start", {"request": "Build a URL shortener", "wait_seconds": 0}
        )
        result = await client.call_tool("run_status", {"run_id": view["run_id"]})
        text = result.content[0].text  # type: ignore[union-attr]
        # A host that keeps only an answer's head (Codex keeps its first ~6,000 characters) still
        # shows the call.
        assert text.startswith(
            '{"next_action":{"kind":"run_host_task","tool":"orchestrate_resume","arguments":'
        )


async def test_every_waiting_branch_of_a_parallel_run_is_answered_by_its_own_call(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await call(client, "orchestrate_start", {"request": "Should we adopt X?", "chain": "research"})
        waiting = [view["next_action"], *view["more_actions"]]
        assert len(waiting) == 3
        for action in waiting:
            # three prompts do not fit in one answer: the longest come in parts (task_prompt)
            assert action["tool"] in ("orchestrate_resume", "task_prompt")
            call_of = {"run_id": view["run_id"], "task_id": action["task_id"]}
            assert action["arguments"] == call_of | ({"offset": 0} if action["tool"] == "task_prompt" else {})
        for action in waiting:
            while action["kind"] == "read_prompt":
                action = (await follow(client, action))["next_action"]
            view = await follow(client, action)
        assert "more_actions" not in view
        assert view["next_action"]["arguments"] == {"run_id": view["run_id"], "task_id": "writer"}


async def test_what_a_child_run_waits_for_is_a_call_on_the_child(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await call(client, "orchestrate_start", {"request": "Build it", "chain": "outer-gated"})
        parent = view["run_id"]
        view = await call(
            client,
            "orchestrate_resume",
            view["next_action"]["arguments"] | {"output": "the design", "wait_seconds": 5},
        )
        assert view["status"] == "awaiting_children", view["status"]
        action = view["next_action"]
        child = action["run_id"]
        assert child != parent and action["kind"] == "approve"
        assert action["arguments"] == {"run_id": child, "gate_id": "before:engineer", "decision": "approve"}
        after = await follow(client, action)
        assert after["run_id"] == child and after["next_action"]["arguments"] == {
            "run_id": child,
            "task_id": "engineer",
        }


# -- the wrong tool: the error names the right call ---------------------------------------------


async def test_resume_with_output_at_a_gate_names_the_approval(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await _at_gate(client)
        run_id = view["run_id"]
        text = await refused(
            client, "orchestrate_resume", {"run_id": run_id, "task_id": "engineer", "output": "the code"}
        )
        assert text.startswith("conflict: "), text
        assert named_calls(text) == [
            ("orchestrate_approve", {"run_id": run_id, "gate_id": "before:engineer", "decision": "approve"})
        ]
        assert "approve, reject or revise" in text
        await _sent_moves_on(client, text, run_id)


async def test_resume_without_output_at_a_gate_names_the_approval(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await _at_gate(client)
        run_id = view["run_id"]
        text = await refused(client, "orchestrate_resume", {"run_id": run_id})
        assert text.startswith("invalid_state: "), text
        assert named_calls(text) == [
            ("orchestrate_approve", {"run_id": run_id, "gate_id": "before:engineer", "decision": "approve"})
        ]
        await _sent_moves_on(client, text, run_id)


async def test_output_without_a_task_at_a_gate_names_the_approval(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await _at_gate(client)
        run_id = view["run_id"]
        text = await refused(client, "orchestrate_resume", {"run_id": run_id, "output": "the code"})
        assert text.startswith("invalid_argument: task_id is missing"), text
        assert [tool for tool, _ in named_calls(text)] == ["orchestrate_approve"]
        await _sent_moves_on(client, text, run_id)


async def test_approving_a_gate_while_a_host_task_awaits_output_names_the_resume(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await call(
            client, "orchestrate_start", {"request": "Build a URL shortener", "approve_before": ["engineer"]}
        )
        run_id = view["run_id"]
        text = await refused(
            client,
            "orchestrate_approve",
            {"run_id": run_id, "gate_id": "before:engineer", "decision": "approve"},
        )
        assert text.startswith("invalid_state: "), text
        assert named_calls(text) == [("orchestrate_resume", {"run_id": run_id, "task_id": "architect"})]
        assert "plus output" in text
        await _sent_moves_on(client, text, run_id)


async def test_approving_without_a_gate_while_a_host_task_awaits_output_names_the_resume(
    tmp_path: Path,
) -> None:
    async with connected(tmp_path) as client:
        view = await call(client, "orchestrate_start", {"request": "Build a URL shortener"})
        run_id = view["run_id"]
        text = await refused(client, "orchestrate_approve", {"run_id": run_id, "decision": "approve"})
        assert text.startswith("invalid_argument: gate_id is missing"), text
        assert named_calls(text) == [("orchestrate_resume", {"run_id": run_id, "task_id": "architect"})]
        await _sent_moves_on(client, text, run_id)


async def test_a_gate_or_task_the_run_does_not_have_names_what_it_awaits(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await call(client, "orchestrate_start", {"request": "Build a URL shortener"})
        run_id = view["run_id"]
        # The step's name given as a gate, and a task the chain does not have.
        text = await refused(
            client, "orchestrate_approve", {"run_id": run_id, "gate_id": "architect", "decision": "approve"}
        )
        assert text.startswith("invalid_argument: "), text
        assert named_calls(text) == [("orchestrate_resume", {"run_id": run_id, "task_id": "architect"})]
        text = await refused(
            client, "orchestrate_resume", {"run_id": run_id, "task_id": "design", "output": "x"}
        )
        assert text.startswith("invalid_argument: "), text
        assert named_calls(text) == [("orchestrate_resume", {"run_id": run_id, "task_id": "architect"})]
        await _sent_moves_on(client, text, run_id)


async def test_resume_without_output_in_a_parallel_run_names_every_waiting_task(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        view = await call(client, "orchestrate_start", {"request": "Should we adopt X?", "chain": "research"})
        run_id = view["run_id"]
        text = await refused(client, "orchestrate_resume", {"run_id": run_id})
        assert text.startswith("invalid_argument: "), text
        waiting = [a["task_id"] for a in (view["next_action"], *view["more_actions"])]
        assert named_calls(text) == [
            ("orchestrate_resume", {"run_id": run_id, "task_id": t}) for t in waiting
        ]


async def _sent_moves_on(client: Client, message: str, run_id: str) -> None:
    """The first call ``message`` names, sent (a resume with an output added), moves the run on."""
    before = await call(client, "run_status", {"run_id": run_id, "detail": "full"})
    tool, arguments = named_calls(message)[0]
    if tool == "orchestrate_resume":
        arguments["output"] = "the answer"
    after = await call(client, tool, arguments)
    version = (await call(client, "run_status", {"run_id": run_id, "detail": "full"}))["version"]
    assert version > before["version"]
    assert after["next_action"] != before["next_action"]

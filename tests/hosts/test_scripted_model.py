"""The scripted model's protocol (:class:`tests.hosts.scripted_model.Follower`) on answers written
here: a prompt handed out in parts is joined in offset order, the hosts' wrappings are read through,
a typed reviewer revises once then approves, an unreadable result ends the conversation."""

from __future__ import annotations

import json
from typing import Any

from tests.hosts.scripted_model import Call, Final, Follower, filler, prompt_sha256

TOOLS = [
    "Bash",
    "mcp__construct__orchestrate_start",
    "mcp__construct__orchestrate_resume",
    "mcp__construct__task_prompt",
]


def _answer(next_action: dict[str, Any], **fields: Any) -> str:
    return json.dumps({"run_id": "r1", "next_action": next_action, **fields})


def test_the_prompt_names_the_chain_and_the_request() -> None:
    move = Follower(200).start("Use construct: start the review-loop chain on 'Build a URL shortener'", TOOLS)
    assert move == Call(
        "mcp__construct__orchestrate_start", {"request": "Build a URL shortener", "chain": "review-loop"}
    )


def test_a_prompt_in_parts_is_joined_in_offset_order_and_answered() -> None:
    follower = Follower(300)
    read = {"kind": "read_prompt", "tool": "task_prompt", "task_id": "architect", "chars": 10}
    first = _answer(
        {**read, "arguments": {"run_id": "r1", "task_id": "architect", "offset": 6}},
        task_id="architect",
        offset=0,
        end=6,
        chars=10,
        text="hello ",
        system_prompt="SYS",
    )
    move = follower.follow("mcp__construct__orchestrate_start", "Wall time: 0.1 s\nOutput:\n" + first, TOOLS)
    assert move == Call("mcp__construct__task_prompt", {"run_id": "r1", "task_id": "architect", "offset": 6})
    resume = {
        "kind": "run_host_task",
        "tool": "orchestrate_resume",
        "arguments": {"run_id": "r1", "task_id": "architect"},
        "add": {"output": "your complete answer"},
        "task_id": "architect",
    }
    last = _answer(resume, task_id="architect", offset=6, end=10, chars=10, text="world")
    wrapped = json.dumps({"output": f"<untrusted_context>{last}</untrusted_context>"})
    move = follower.follow("mcp__construct__task_prompt", json.loads(wrapped)["output"], TOOLS)
    assert isinstance(move, Call) and move.tool == "mcp__construct__orchestrate_resume"
    assert move.arguments == {
        "run_id": "r1",
        "task_id": "architect",
        "output": filler("the output of task architect", 300),
    }
    assert follower.prompts == {"architect": ("SYS", "hello world")}
    assert prompt_sha256("SYS", "hello world") == prompt_sha256(*follower.prompts["architect"])


def test_a_typed_reviewer_revises_once_then_approves() -> None:
    follower = Follower(500)
    schema = {
        "type": "object",
        "properties": {"verdict": {"enum": ["approve", "revise", "reject"]}, "notes": {"type": "string"}},
        "required": ["verdict", "notes"],
    }
    verdicts = []
    for task in ("reviewer", "reviewer~2"):
        action = {
            "kind": "run_host_task",
            "tool": "orchestrate_resume",
            "arguments": {"run_id": "r1", "task_id": task},
            "add": {"output": "one JSON object matching output_schema"},
            "task_id": task,
            "system_prompt": "S",
            "user_prompt": "U",
            "output_schema": schema,
        }
        move = follower.follow("mcp__construct__orchestrate_resume", _answer(action), TOOLS)
        assert isinstance(move, Call)
        value = json.loads(move.arguments["output"])
        assert len(move.arguments["output"]) <= 500
        verdicts.append(value["verdict"])
    assert verdicts == ["revise", "approve"]


def test_an_unreadable_result_ends_the_conversation() -> None:
    follower = Follower(200)
    move = follower.follow(
        "mcp__construct__orchestrate_resume", "<persisted-output>\nOutput too large", TOOLS
    )
    assert isinstance(move, Final) and "cannot read" in move.text
    assert follower.seen[-1].answer_chars is None

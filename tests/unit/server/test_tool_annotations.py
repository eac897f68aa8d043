"""Every tool's hints, as hosts receive them in ``tools/list``, against one table: a host decides from
them what to run without asking, and a registry shows them. ``openWorldHint`` is true exactly where a
call can reach a model provider or a remote agent (the rule is written beside the tools, in
:mod:`server.mcp.publishing`); a hint at its default is left out unless it says something a host
should not have to infer."""

from __future__ import annotations

import json
from typing import Any

from server.mcp.publishing import build_tools
from server.mcp.server_card import TOOLS_LIST_FILE

#: tool -> its annotations, as published (camelCase, hints left out where not given)
ANNOTATIONS: dict[str, dict[str, bool]] = {
    # starts a run: its steps may call a provider or delegate to a remote agent
    "orchestrate_start": {"destructiveHint": False, "openWorldHint": True},
    # a new run from a recorded task, driven like a started one
    "orchestrate_fork": {"destructiveHint": False, "openWorldHint": True},
    # the run goes on to its next step, which may be a provider call or an agent step
    "orchestrate_resume": {"destructiveHint": False, "idempotentHint": True, "openWorldHint": True},
    "task_prompt": {"readOnlyHint": True, "openWorldHint": False},
    # an approval lets the run go on; a rejection cancels the remote runs it awaited
    "orchestrate_approve": {"destructiveHint": False, "idempotentHint": True, "openWorldHint": True},
    "run_status": {"readOnlyHint": True, "openWorldHint": False},
    # cancels the remote runs of the agent steps the run awaits, in the call
    "orchestrate_cancel": {"destructiveHint": True, "idempotentHint": True, "openWorldHint": True},
    # the moved run goes on under its new chain version
    "orchestrate_upgrade": {"destructiveHint": False, "idempotentHint": True, "openWorldHint": True},
    "runs_list": {"readOnlyHint": True, "openWorldHint": False},
    "run_events": {"readOnlyHint": True, "openWorldHint": False},
}


def _published() -> dict[str, dict[str, Any]]:
    return {
        tool.name: (tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {})
        for tool in build_tools()
    }


def test_every_tool_has_the_annotations_of_the_table() -> None:
    published = _published()
    assert list(published) == list(ANNOTATIONS), "a tool was added, removed or moved: update the table"
    for name, expected in ANNOTATIONS.items():
        assert published[name] == expected, name


def test_the_early_tools_list_carries_the_same_annotations() -> None:
    # What serve answers the first tools/list with before the SDK is imported (scripts/tools_list.py).
    listed = json.loads(TOOLS_LIST_FILE.read_text("utf-8"))["tools"]
    assert {tool["name"]: tool.get("annotations", {}) for tool in listed} == ANNOTATIONS


def test_open_world_tools_are_exactly_those_that_change_a_run() -> None:
    # A tool that only reads the store never reaches a provider or an agent; every tool that changes
    # a run can (see the rule in server/mcp/publishing.py).
    for name, hints in ANNOTATIONS.items():
        assert hints["openWorldHint"] is not hints.get("readOnlyHint", False), name

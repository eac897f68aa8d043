"""Every tool's hints, as hosts receive them in ``tools/list``, against one table: a host decides from
them what to run without asking, and a registry shows them. ``openWorldHint`` is false on every
tool, so that Codex CLI runs them headless (why is written beside the tools, in
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
    "orchestrate_start": {"destructiveHint": False, "openWorldHint": False},
    # a new run from a recorded task, driven like a started one
    "orchestrate_fork": {"destructiveHint": False, "openWorldHint": False},
    # the run goes on to its next step, which may be a provider call or an agent step
    "orchestrate_resume": {"destructiveHint": False, "idempotentHint": True, "openWorldHint": False},
    "task_prompt": {"readOnlyHint": True, "openWorldHint": False},
    # an approval lets the run go on; a rejection cancels the remote runs it awaited
    "orchestrate_approve": {"destructiveHint": False, "idempotentHint": True, "openWorldHint": False},
    "run_status": {"readOnlyHint": True, "openWorldHint": False},
    # cancels the remote runs of the agent steps the run awaits, in the call
    "orchestrate_cancel": {"destructiveHint": True, "idempotentHint": True, "openWorldHint": False},
    # the moved run goes on under its new chain version
    "orchestrate_upgrade": {"destructiveHint": False, "idempotentHint": True, "openWorldHint": False},
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


def test_no_tool_is_open_world() -> None:
    # Codex CLI refuses an open-world tool that is not read-only under `codex exec` (see
    # server/mcp/publishing.py); tests/hosts runs the chain in Codex.
    for name, hints in ANNOTATIONS.items():
        assert hints["openWorldHint"] is False, name

"""The MCP tools' words for the next steps an error names (see "Next steps in a channel's words"
in :mod:`orchestration.errors`): each operation is a tool, each argument the tool's argument, and
the arguments known now are the JSON a caller can send -- ``call orchestrate_resume with
{"run_id": ..., "task_id": ...} plus output``, ``pass model to orchestrate_start``."""

from __future__ import annotations

from orchestration.errors import ConstructError, Operation, call_words, rendered

#: The tool of each operation, and the arguments it implies (``wait_run``: ``run_status`` with
#: ``wait_seconds``).
TOOL_OF: dict[Operation, tuple[str, tuple[str, ...]]] = {
    "list_runs": ("runs_list", ()),
    "show_run": ("run_status", ()),
    "wait_run": ("run_status", ("wait_seconds",)),
    "start_run": ("orchestrate_start", ()),
    "resume_run": ("orchestrate_resume", ()),
    "approve_gate": ("orchestrate_approve", ()),
}


#: ``hint`` as the tool call it stands for (see :class:`~orchestration.errors.Hint`).
tool_words = call_words(TOOL_OF)


def tool_message(exc: ConstructError) -> str:
    """``exc``'s message as the MCP channel says it: its hints as tool calls."""
    return rendered(exc, tool_words)


def tool_error_text(exc: ConstructError) -> str:
    """``code: message`` of a tool error (an ``isError`` result, a JSON-RPC error's message)."""
    return f"{exc.code}: {tool_message(exc)}"

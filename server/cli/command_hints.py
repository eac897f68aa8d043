"""The CLI's words for the next steps a message names (see "Next steps in a channel's words" in
:mod:`orchestration.errors`): each operation is a ``construct-mcp`` command and each argument its
flag, so a person at a terminal reads what to type -- ``run `construct-mcp runs list` to see the
runs that exist``, ``pass --model to `construct-mcp runs start```. The MCP tools say the same
hints as tool calls (:mod:`server.mcp.tool_hints`)."""

from __future__ import annotations

import shlex

from orchestration.errors import ConstructError, Hint, Operation, either, rendered

#: The command of each operation; ``{run}`` is the run it is about.
COMMAND_OF: dict[Operation, str] = {
    "list_runs": "construct-mcp runs list",
    "show_run": "construct-mcp runs status {run}",
    "wait_run": "construct-mcp runs tail {run}",
    "start_run": "construct-mcp runs start REQUEST",
    "resume_run": "construct-mcp runs resume {run}",
    "approve_gate": "construct-mcp runs approve {run}",
}

#: What an argument the caller supplies itself is on the command line (else ``--name NAME``).
_NEEDED = {"output": "--output-file ANSWER.md"}
#: The flag of each decision (approving is the command without one).
_DECISION_FLAGS = {"approve": "", "reject": "--reject", "revise": "--revise"}
#: Arguments that are no flag: the run is the command's operand, a wait is what ``tail`` does.
_NO_FLAG = frozenset({"run_id", "wait_seconds"})


def flag(name: str) -> str:
    """The command-line flag of argument ``name`` (``task_id`` -> ``--task-id``)."""
    return "--" + name.replace("_", "-")


def _command(hint: Hint) -> str:
    run = hint.arguments.get("run_id", hint.run_id or "RUN_ID")
    words = [COMMAND_OF[hint.operation].format(run=run if isinstance(run, str) else "RUN_ID")]
    for name, value in hint.arguments.items():
        if name in _NO_FLAG or isinstance(value, tuple):
            continue
        if name == "decision":
            words.append(_DECISION_FLAGS.get(value, f"--decision {shlex.quote(value)}"))
        else:
            words.append(f"{flag(name)} {shlex.quote(value)}")
    words += [_NEEDED.get(name, f"{flag(name)} {name.upper()}") for name in hint.needs]
    return " ".join(word for word in words if word)


def cli_words(hint: Hint) -> str:
    """``hint`` as the command (and flags) a person types (see :class:`~orchestration.errors.Hint`)."""
    if hint.form == "choices":
        flags = [
            _DECISION_FLAGS.get(v, flag(v))
            for values in hint.arguments.values()
            if isinstance(values, tuple)
            for v in values
            if v != "approve"
        ]
        return f"{either(flags)} to decide otherwise" if flags else "approve"
    if hint.form == "pass":
        base = COMMAND_OF[hint.operation].split(" {", 1)[0].removesuffix(" REQUEST")
        return f"pass {' and '.join(map(flag, hint.needs))} to `{base}`"
    command = f"`{_command(hint)}`"
    return f"run {command}" if hint.form == "call" else command


def cli_message(exc: ConstructError) -> str:
    """``exc``'s message as the CLI says it: its hints as commands and flags."""
    return rendered(exc, cli_words)

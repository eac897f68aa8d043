"""Steps that delegate to another MCP agent: their argument templates, their error codes, and the
pure rule that says whether an attempt makes its own call or follows an earlier one.

Rendering reads recorded outputs only, so a resumed run sends the same arguments; and
:func:`agent_attempt` decides from the record alone that an attempt after one whose outcome is
unknown follows that attempt's call (its recorded remote run, else its idempotency key), so one
remote run serves every attempt that follows it. The user's side is in docs/chains.md (Agents).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from orchestration.core.models import A2A_SEND, AgentStep, ChainStep, TaskState

#: Errors after which the agent may have acted although the attempt saw no answer: the next
#: attempt follows this one's call instead of making another.
UNKNOWN_OUTCOME_CODES = frozenset({"agent_unreachable", "timeout", "agent_protocol"})

#: The error codes of agent calls (the typed taxonomy of ``TypedError.code``) and whether a retry
#: may help: ``agent_unreachable`` (connection refused or lost, a 5xx, a protocol error) and
#: ``timeout`` are retried within the attempt budget, and so is ``agent_protocol`` (the remote run
#: answered, for longer than its agent's ``unknown_status_seconds``, with a status no construct-mcp
#: has, or with answers that could not be read); ``auth`` (401/403, or the token's environment
#: variable not set), ``agent_not_configured`` (no such ``[agents]`` table here), ``tool_error``
#: (the tool answered with an error), ``agent_run_failed`` (the remote run ended failed, rejected
#: or cancelled), ``invalid_output``, ``malformed_response``, ``agent_answer_refused`` (an answer over a
#: bound: :mod:`orchestration.workers.agent_answers`), ``agent_input_required`` (an A2A agent's task
#: stopped to ask a question a call could not wait for), ``agent_input_declined`` (its question's
#: gate was rejected: :mod:`orchestration.engine.agent_questions`) and the refusals of a delegated start
#: (``delegation_loop``, ``delegation_depth_exceeded``: :mod:`orchestration.core.hops`) are not.
AGENT_ERROR_CODES: Mapping[str, bool] = {
    "agent_unreachable": True,
    "timeout": True,
    "agent_protocol": True,
    "auth": False,
    "agent_not_configured": False,
    "tool_error": False,
    "agent_run_failed": False,
    "invalid_output": False,
    "malformed_response": False,
    "agent_answer_refused": False,
    "agent_input_required": False,
    "agent_input_declined": False,
    "delegation_loop": False,
    "delegation_depth_exceeded": False,
}

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_SIMPLE = frozenset({"request", "run_id", "task_id"})


def _placeholders(template: str) -> list[str]:
    """The placeholders of ``template`` in order; ValueError for a stray brace."""
    names: list[str] = []
    for match in _PLACEHOLDER.finditer(template):
        token = match.group(0)
        if token in ("{{", "}}"):
            continue
        if match.group(1) is None:
            raise ValueError(f"a single {token!r} must be doubled ({token * 2}) to stand for itself")
        names.append(match.group(1).strip())
    return names


def check_template(template: str, steps: Iterable[str], own_step: str) -> None:
    """Refuse (ValueError) a template that names anything but ``{request}``, ``{run_id}``,
    ``{task_id}`` or ``{outputs.STEP}`` for another step of the chain."""
    known = set(steps)
    for name in _placeholders(template):
        if name in _SIMPLE:
            continue
        step = name.removeprefix("outputs.")
        if step == name or not step:
            raise ValueError(
                f"unknown placeholder {{{name}}}; use {{request}}, {{outputs.STEP}}, {{run_id}} or "
                "{task_id} (and {{ }} for literal braces)"
            )
        if step == own_step:
            raise ValueError(f"{{{name}}}: a step cannot use its own output")
        if step not in known:
            raise ValueError(f"{{{name}}}: the chain has no step {step!r}; its steps are: {', '.join(known)}")


def check_arguments(value: Any, steps: Iterable[str], own_step: str) -> None:
    """:func:`check_template` on every string of a step's ``arguments``."""
    names = list(steps)
    for template in _strings(value):
        check_template(template, names, own_step)


def template_steps(value: Any) -> set[str]:
    """The steps whose outputs the templates of ``value`` use."""
    return {
        name.removeprefix("outputs.")
        for template in _strings(value)
        for name in _placeholders(template)
        if name.startswith("outputs.")
    }


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def render(value: Any, lookup: Callable[[str], str]) -> Any:
    """``value`` with every string template filled in by ``lookup(placeholder)``."""
    if isinstance(value, str):

        def fill(match: re.Match[str]) -> str:
            token = match.group(0)
            if token in ("{{", "}}"):
                return token[0]
            return lookup((match.group(1) or "").strip())

        return _PLACEHOLDER.sub(fill, value)
    if isinstance(value, Mapping):
        return {k: render(v, lookup) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [render(v, lookup) for v in value]
    return value


def render_arguments(
    agent: AgentStep, *, request: str, outputs: Mapping[str, str], run_id: str, task_id: str
) -> dict[str, Any]:
    """The arguments of ``agent``'s call: its templates filled from the record (``outputs``: the
    latest done output of each step, by step name)."""
    simple = {"request": request, "run_id": run_id, "task_id": task_id}

    def lookup(name: str) -> str:
        if name in simple:
            return simple[name]
        return outputs.get(name.removeprefix("outputs."), "")

    rendered = render(agent.arguments, lookup)
    assert isinstance(rendered, dict)
    return rendered


def parse_agent_step(
    *,
    specialist: str | None,
    agent: str | None,
    tool: str | None,
    arguments: Mapping[str, Any] | None,
    output_step: str | None,
    provider: str | None,
    agents: object,
    message: str | None = None,
) -> AgentStep | tuple[str, str] | None:
    """A chain step's :class:`AgentStep` from its config keys (None: a specialist's step), or the
    ``(field, problem)`` that refuses it. ``agents``: the file's ``[agents]`` table, which must
    define the agent (its keys are checked by the server's config, :mod:`server.settings.agents`).
    A step of an A2A agent (``protocol = "a2a"``) gives ``message`` (a template) and no ``tool``:
    it becomes tool ``message/send`` with ``arguments = {"message": message}``."""
    if agent is None:
        keys = (("tool", tool), ("arguments", arguments), ("output_step", output_step), ("message", message))
        for key, value in keys:
            if value is not None:
                return key, f"{key} belongs to a step that delegates: name its agent too"
        if specialist is None:
            return "specialist", "a step needs a specialist (or an agent to delegate to)"
        return None
    if specialist is not None:
        return "agent", "a step runs a specialist or delegates to an agent, not both"
    if provider is not None:
        return "agent", "a step that delegates calls its agent, not a provider: drop provider and model"
    known = sorted(agents) if isinstance(agents, Mapping) else []
    if agent not in known:
        listed = f"; defined: {', '.join(known)}" if known else ""
        return "agent", f"no [agents.{agent}] table in this file{listed}"
    assert isinstance(agents, Mapping)
    table = agents[agent]
    if isinstance(table, Mapping) and table.get("protocol") == "a2a":
        return _a2a_step(agent, tool, arguments, output_step, message)
    if message is not None:
        return "message", f"message is for an A2A agent; {agent!r} is an MCP agent: give tool and arguments"
    if tool is None:
        return "tool", f"name the tool of agent {agent!r} to call (e.g. orchestrate_start)"
    if tool == A2A_SEND:
        return "tool", f"{A2A_SEND} is how A2A agents' steps are recorded, not an MCP tool's name"
    step = AgentStep(agent=agent, tool=tool, arguments=dict(arguments or {}), output_step=output_step)
    if output_step is not None and not step.follows_runs:
        return "output_step", "output_step applies to another construct-mcp (tool orchestrate_start)"
    return step


def _a2a_step(
    agent: str,
    tool: str | None,
    arguments: Mapping[str, Any] | None,
    output_step: str | None,
    message: str | None,
) -> AgentStep | tuple[str, str]:
    for key, value in (("tool", tool), ("arguments", arguments), ("output_step", output_step)):
        if value is not None:
            return key, f"agent {agent!r} is an A2A agent: its step gives message (a template), not {key}"
    if message is None:
        return "message", f'agent {agent!r} is an A2A agent: give the message to send (e.g. "{{request}}")'
    return AgentStep(agent=agent, tool=A2A_SEND, arguments={"message": message})


def check_agent_steps(steps: list[ChainStep]) -> tuple[str, str] | None:
    """The ``(field, problem)`` of the first agent step whose argument templates name anything
    unknown."""
    names = [s.name for s in steps]
    for i, step in enumerate(steps):
        if step.agent is None:
            continue
        try:
            check_arguments(step.agent.arguments, names, step.name)
        except ValueError as exc:
            field = "message" if step.agent.sends_messages else "arguments"
            return f"steps[{i}].{field}", str(exc)
    return None


def idempotency_key(run_id: str, task_id: str, attempt: int) -> str:
    """The key an agent call carries: the run, the task instance and the attempt that made the
    first call (a following attempt reuses its key). At most 200 characters (run ids are at most
    80, task ids at most 100 but step names are short)."""
    return f"construct:{run_id}:{task_id}:{attempt}"[:200]


#: the namespace of the A2A message ids derived from keys (:func:`message_id`)
_MESSAGE_NAMESPACE = uuid.UUID("6f1d6c2e-3c1a-5d4e-9a57-2f0c9b8e7a11")


def message_id(key: str) -> str:
    """The A2A message id of a message with idempotency key ``key``: a UUID derived from it, so
    that a resent message carries the same id."""
    return str(uuid.uuid5(_MESSAGE_NAMESPACE, key))


def answer_message_id(run_id: str, task_id: str, attempt: int, question: int) -> str:
    """The A2A message id of the answer to the ``question``-th question (1, 2, ...) that the
    remote task of ``attempt`` of task ``task_id`` of run ``run_id`` asked: derived from them
    only, so that an answer resent after a crash is the same message."""
    return message_id(f"{idempotency_key(run_id, task_id, attempt)}:answer:{question}")


def agent_attempt(agent: AgentStep, task: TaskState) -> tuple[int | None, str | None, bool]:
    """What the next attempt of an agent step does, decided from the record alone (pure):
    ``(follows, remote_run_id, possible_duplicate_call)``.

    After an attempt whose outcome is unknown (still ``running``: the process died; or failed with
    one of :data:`UNKNOWN_OUTCOME_CODES`), the next attempt follows that attempt's call (or the one
    it followed in turn): the recorded remote run, else — for a construct-mcp, which takes
    idempotency keys — the same key (for an A2A agent the same message id, marked a possible
    duplicate call: the protocol does not promise that an agent recognises a resent message). A
    tool without keys is called again, a possible duplicate call. After a first attempt, or one
    that failed with a known outcome, the attempt makes its own call."""
    if not task.attempts:
        return None, None, False
    last = task.attempts[-1]
    unknown = last.outcome == "running" or (
        last.outcome == "failed" and last.error is not None and last.error.code in UNKNOWN_OUTCOME_CODES
    )
    if not unknown:
        return None, None, False
    origin = last.follows or last.number
    if last.remote_run_id is not None:
        return origin, last.remote_run_id, False
    if agent.follows_runs:
        # The same key again: a construct-mcp answers it with the run it made; an A2A agent gets
        # the same message id, which it need not recognise, so a second task may start.
        return origin, None, agent.sends_messages
    return None, None, True


__all__ = [
    "AGENT_ERROR_CODES",
    "UNKNOWN_OUTCOME_CODES",
    "agent_attempt",
    "answer_message_id",
    "check_agent_steps",
    "check_arguments",
    "check_template",
    "idempotency_key",
    "message_id",
    "parse_agent_step",
    "render",
    "render_arguments",
    "template_steps",
]

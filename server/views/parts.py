"""Answers that fit what hosts show: a host task whose prompt is too long for one answer is handed
out in parts.

Host applications cap a tool result and do not say so to their model (Codex CLI keeps about 12,000
characters, the first and last 6,000; Gemini CLI the first 8,000 and last 32,000; Claude Code and
opencode replace a long one by a file path). So no answer's text is longer than the server's
``max_answer_chars``: where a host task's prompts would make it longer, the action becomes
``read_prompt``, a call to the ``task_prompt`` tool that hands out the user prompt in parts
(:func:`prompt_part`), each answer naming the call for the next and the last one the
``orchestrate_resume`` call. The parts, joined in order, are the user prompt byte for byte; the
system prompt comes whole with the first part. Every host can call a tool; not every host reads
resources, so the parts are a tool's answers.

A compact answer too long for its tasks (a run of many) shrinks them instead (:func:`fitted`);
a record too long (``run_status`` with whole outputs) comes in parts too
(:mod:`server.views.record_parts`), and so do lists (:mod:`server.views.fitted_pages`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import Field

from orchestration.chains import Catalog, TaskPrompt
from orchestration.errors import ConfigError
from server.views.compact import answer_text
from server.views.next_step import TYPED_INSTRUCTION, resume_call
from server.views.outline import Outlined

#: the tool that hands out a prompt in parts
PROMPT_TOOL = "task_prompt"

#: the least room a part's text gets, whatever else its answer carries
MIN_PART_CHARS = 500


class PromptPart(Outlined):
    """A part of a host task's user prompt: characters ``offset`` to ``end`` of ``chars``; the
    system prompt with the first part. ``next_action`` names the call for the next part, or, with
    the last one, the call that hands in the task's output."""

    published = ("next_action", "run_id", "task_id", "offset", "end", "chars", "text")
    bare = True

    next_action: dict[str, Any]
    run_id: str
    task_id: str
    offset: int
    end: int
    chars: int = Field(description="The user prompt's length in characters.")
    system_prompt: str | None = Field(default=None, exclude_if=lambda v: v is None)
    text: str = Field(description="The user prompt's characters offset to end.")


def fitted(data: dict[str, Any], bound: int) -> tuple[str, dict[str, Any]]:
    """``data`` (a compact answer's structured content) made to fit in ``bound`` characters, and
    its text (dumped once): as few of its host tasks as it takes made ``read_prompt`` actions
    (:func:`fit_prompts`), and where the tasks are what makes it longer (a run of many tasks), the
    tasks shrunk a step at a time until it fits: first without their output previews, then with
    the done tasks left out, then every task that neither awaits the host, runs nor failed, then
    as many of the remaining ones as it takes, from the last. The tasks left out are counted in
    ``tasks_left_out`` (``count``, ``statuses``, and ``read``: where the whole list is). ``data``
    itself is not changed."""
    text, out = fit_prompts(data, bound)
    if len(text) <= bound or "tasks" not in data:
        return text, out
    for shrink in (_without_previews, _collapsed(COLLAPSED_FIRST), _collapsed(COLLAPSED_NEXT)):
        data = shrink(data)
        text, out = fit_prompts(data, bound)
        if len(text) <= bound:
            return text, out
    # The tasks still shown are few statuses but many tasks: keep the most that fit.
    kept, dropped = 0, len(data["tasks"])
    while dropped - kept > 1:
        middle = (kept + dropped) // 2
        if len(fit_prompts(_cut(data, middle), bound)[0]) <= bound:
            kept = middle
        else:
            dropped = middle
    return fit_prompts(_cut(data, kept), bound)


#: the task statuses a compact answer too long for its bound leaves out first, then next
COLLAPSED_FIRST = frozenset({"done"})
COLLAPSED_NEXT = frozenset({"pending", "skipped", "cancelled"})

#: where the tasks a compact answer leaves out are listed
TASKS_READ = "run_status with detail 'full' lists every task"


def _without_previews(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with no task's output preview (its length and URI stay)."""
    tasks = [{k: v for k, v in task.items() if k != "output_preview"} for task in data["tasks"]]
    return data | {"tasks": tasks}


def _collapsed(statuses: frozenset[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def collapse(data: dict[str, Any]) -> dict[str, Any]:
        """``data`` with its tasks in ``statuses`` counted in ``tasks_left_out`` instead."""
        return _left_out(data, [t for t in data["tasks"] if t["status"] not in statuses])

    return collapse


def _cut(data: dict[str, Any], kept: int) -> dict[str, Any]:
    """``data`` with its first ``kept`` tasks, the others counted in ``tasks_left_out``."""
    return _left_out(data, data["tasks"][:kept])


def _left_out(data: dict[str, Any], tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """``data`` showing only ``tasks`` (of its own), the others added to ``tasks_left_out``, which
    follows ``tasks``."""
    shown = {id(task) for task in tasks}
    before = data.get("tasks_left_out", {"count": 0, "statuses": {}})
    statuses = dict(before["statuses"])
    for task in data["tasks"]:
        if id(task) not in shown:
            statuses[task["status"]] = statuses.get(task["status"], 0) + 1
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "tasks_left_out":
            continue
        out[key] = value
        if key == "tasks":
            out[key] = tasks
            out["tasks_left_out"] = {
                "count": sum(statuses.values()),
                "statuses": statuses,
                "read": TASKS_READ,
            }
    return out


def fit_prompts(data: dict[str, Any], bound: int) -> tuple[str, dict[str, Any]]:
    """``data`` (an answer's structured content) with as few of its host tasks as it takes (the
    longest first) made ``read_prompt`` actions, so that its text fits in ``bound`` characters
    where the prompts are what makes it longer, and its text (dumped once). ``data`` itself is not
    changed."""
    text = answer_text(data)
    if len(text) <= bound:
        return text, data
    slots = [("next_action", -1)] + [("more_actions", i) for i in range(len(data.get("more_actions", ())))]
    hosted = [
        (len(json.dumps(_at(data, slot), ensure_ascii=False)), slot)
        for slot in slots
        if _at(data, slot).get("kind") == "run_host_task" and "user_prompt" in _at(data, slot)
    ]
    out = dict(data)
    if "more_actions" in out:
        out["more_actions"] = list(out["more_actions"])
    for _, slot in sorted(hosted, key=lambda sized: -sized[0]):
        _put(out, slot, read_prompt(_at(out, slot)))
        text = answer_text(out)
        if len(text) <= bound:
            break
    return text, out


def _at(data: dict[str, Any], slot: tuple[str, int]) -> dict[str, Any]:
    key, index = slot
    found: dict[str, Any] = data[key] if index < 0 else data[key][index]
    return found


def _put(data: dict[str, Any], slot: tuple[str, int], action: dict[str, Any]) -> None:
    key, index = slot
    if index < 0:
        data[key] = action
    else:
        data[key][index] = action


def read_prompt(action: dict[str, Any], offset: int = 0) -> dict[str, Any]:
    """The action that reads the host task ``action`` describes in parts, from ``offset``."""
    run_id = action["arguments"]["run_id"]
    chars = action["chars"] if "chars" in action else len(action["user_prompt"])
    read: dict[str, Any] = {
        "kind": "read_prompt",
        "tool": PROMPT_TOOL,
        "arguments": {"run_id": run_id, "task_id": action["task_id"], "offset": offset},
        "task_id": action["task_id"],
        "specialist": action["specialist"],
        "chars": chars,
        "instruction": (
            f"This task's prompt ({chars:,} characters) is longer than one answer holds: call tool "
            "with arguments to read it; each answer's next_action names the call for the next part, "
            "the last one the call that hands in your output. system_prompt comes with the first "
            "part; user_prompt is the parts' text joined in order. Read every part, then run the "
            "whole prompt with your own model."
            if offset == 0
            else f"Call tool with arguments for the next part (characters from {offset:,} of {chars:,})."
        ),
    }
    if "run_id" in action:
        read["run_id"] = action["run_id"]
    return read


def prompt_part(
    run_id: str,
    prompt: TaskPrompt,
    offset: int,
    bound: int,
    output_schema: dict[str, Any] | None,
) -> PromptPart:
    """The part of ``prompt``'s user prompt from ``offset`` that fits, with the system prompt when
    ``offset`` is 0, in an answer of at most ``bound`` characters (but for a system prompt that
    leaves less than :data:`MIN_PART_CHARS` of room)."""
    user = prompt.user
    ahead = {"arguments": {"run_id": run_id}, "task_id": prompt.task_id, "specialist": prompt.specialist}
    last = _hand_in(run_id, prompt, output_schema)

    def answer(end: int, text: str) -> PromptPart:
        more = end < len(user)
        return PromptPart(
            next_action=read_prompt(ahead | {"chars": len(user)}, end) if more else last,
            run_id=run_id,
            task_id=prompt.task_id,
            offset=offset,
            end=end,
            chars=len(user),
            system_prompt=prompt.system if offset == 0 else None,
            text=text,
        )

    # The longer of the two answers this part can be, with no text yet; digits for the offsets.
    frame = max(len(answer(end, "").model_dump_json()) for end in (len(user) - 1, len(user)))
    room = max(MIN_PART_CHARS, bound - frame - 16)
    end = fitting_end(user, offset, room)
    return answer(end, user[offset:end])


def check_room(catalog: Catalog, bound: int) -> None:
    """Refuse (``ConfigError``) a catalog with a specialist whose persona, or a chain step whose
    persona and output schema, leave a long prompt's first or last part less than
    :data:`MIN_PART_CHARS` of room in ``bound`` characters: the system prompt comes whole with the
    first part, and the last part's action carries the step's output schema. Measured on the
    parts themselves, with the longest ids a run and a task can have and a prompt of ten million
    characters; the error names the bound the largest of them needs."""
    run_id, task_id, user = "r" * 80, "t" * 100, "u" * 10**7

    def needs(specialist: str, schema: dict[str, Any] | None) -> int:
        system = catalog.specialists[specialist].persona
        prompt = TaskPrompt(task_id=task_id, specialist=specialist, system=system, user=user)
        # With no room to spare a part gets MIN_PART_CHARS of text: the least bound that holds the
        # first part (the persona) and the last (the hand-in action with the schema).
        first = prompt_part(run_id, prompt, 0, 0, schema)
        last = prompt_part(run_id, prompt, len(user) - MIN_PART_CHARS, 0, schema)
        return max(len(first.model_dump_json()), len(last.model_dump_json()))

    checks = [(f"specialists.{name}.persona", needs(name, None)) for name in catalog.specialists]
    for chain in catalog.chains.values():
        checks += [
            (f"chains.{chain.name}.{step.name}", needs(step.specialist, step.output_schema))
            for step in chain.steps
            if step.output_schema is not None and step.specialist in catalog.specialists
        ]
    where, need = max(checks, key=lambda check: check[1], default=("", 0))
    if need > bound:
        what = (
            "the persona makes"
            if where.startswith("specialists.")
            else "the persona and the output schema make"
        )
        raise ConfigError(
            catalog.source,
            where,
            f"{what} a long prompt's parts {need:,} characters (the first carries the persona whole, the "
            f"last the output schema), over "
            f"max_answer_chars ({bound:,}); shorten them, or raise max_answer_chars to at least {need:,} "
            "(CONSTRUCT_MAX_ANSWER_CHARS)",
        )


def fitting_end(text: str, start: int, room: int) -> int:
    """The end of the longest stretch of ``text`` from ``start`` whose JSON string (quotes and
    escapes) has at most ``room`` characters between its quotes."""
    end = min(len(text), start + room)
    while True:
        escaped = len(json.dumps(text[start:end], ensure_ascii=False)) - 2
        if escaped <= room or end - start <= 1:
            return end
        end = start + max(1, (end - start) * room // escaped - 1)


def _hand_in(run_id: str, prompt: TaskPrompt, output_schema: dict[str, Any] | None) -> dict[str, Any]:
    """The action that follows the last part: run the task, hand in its output."""
    answer = "your complete answer" if output_schema is None else "one JSON object matching output_schema"
    action: dict[str, Any] = {
        "kind": "run_host_task",
        "tool": "orchestrate_resume",
        "arguments": resume_call(run_id, prompt.task_id),
        "add": {"output": answer},
        "task_id": prompt.task_id,
        "specialist": prompt.specialist,
    }
    if output_schema is not None:
        action["output_schema"] = output_schema
    action["instruction"] = (
        "That was the last part: run system_prompt (from the first part) and user_prompt (every part's "
        "text, joined in order) with your own model now, then call tool with arguments plus output: your "
        "whole answer, recorded verbatim." + ("" if output_schema is None else TYPED_INSTRUCTION)
    )
    return action


__all__ = [
    "MIN_PART_CHARS",
    "PROMPT_TOOL",
    "TASKS_READ",
    "PromptPart",
    "check_room",
    "fit_prompts",
    "fitted",
    "fitting_end",
    "prompt_part",
    "read_prompt",
]

"""Prompt materialization: one function for every worker backend.

The system prompt is the specialist's persona from the run's chain snapshot. The user prompt is the
run's request, the outputs of the earlier tasks (from persisted facts only, in chain order) and the
comments approvers left on gates passed so far; a step with an ``output_schema`` ends with an "Answer
format" section giving the schema (every backend, so a provider asked for structured output only
through its prompt gets it too). The same run record always gives the same prompt,
byte for byte: nothing here reads a clock, the environment or the config file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestration.models import RunHead, text_hash
from orchestration.schemas import answer_format
from orchestration.vocabulary import TaskStatus


@dataclass(frozen=True, slots=True)
class TaskPrompt:
    task_id: str
    specialist: str
    system: str
    user: str

    @property
    def sha256(self) -> str:
        return text_hash(self.system + "\x00" + self.user)


def upstream_task_ids(head: RunHead, task_id: str) -> list[str]:
    """The done tasks before ``task_id`` whose outputs its prompt includes."""
    ids: list[str] = []
    for step in head.chain.steps:
        if step.name == task_id:
            break
        if head.task(step.name).status == TaskStatus.DONE:
            ids.append(step.name)
    return ids


def materialize(head: RunHead, task_id: str, outputs: Mapping[str, str]) -> TaskPrompt:
    """The prompts for ``task_id``. ``outputs`` maps the ids from :func:`upstream_task_ids` to their
    persisted outputs; a missing one is a programming error (KeyError)."""
    steps = head.chain.steps
    index = next(i for i, s in enumerate(steps) if s.name == task_id)
    step = steps[index]
    specialist = head.chain.specialist(step.specialist)
    parts = [
        f'You are step {index + 1} of {len(steps)} ("{step.name}", the {specialist.name}) in the '
        f'chain "{head.chain.name}": {" -> ".join(s.name for s in steps)}.',
        "",
        "## Request",
        "",
        head.request.strip(),
    ]
    upstream = upstream_task_ids(head, task_id)
    if upstream:
        parts += ["", "## Work so far"]
        for tid in upstream:
            spec = head.task(tid).specialist
            parts += ["", f"### {tid} ({spec})", "", outputs[tid].strip()]
    notes = [
        g
        for g in head.gates
        if g.status == "approved" and g.comment and _gate_precedes(head, g.task_id, g.position, task_id)
    ]
    if notes:
        parts += ["", "## Approver notes"]
        for gate in notes:
            who = f" ({gate.approver})" if gate.approver else ""
            parts += ["", f"- {gate.gate_id}{who}: {gate.comment}"]
    failed = [s.name for s in steps[:index] if head.task(s.name).status == TaskStatus.FAILED]
    if failed:
        parts += ["", f"Note: these earlier steps failed and produced no output: {', '.join(failed)}."]
    parts += [
        "",
        "## Your task",
        "",
        f"Do the {specialist.name}'s part of this request. Your role: {specialist.description} "
        "Build on the work so far; the next step sees only what you write.",
    ]
    if step.output_schema is not None:
        parts += ["", "## Answer format", "", answer_format(step.output_schema)]
    return TaskPrompt(task_id, specialist.name, specialist.persona, "\n".join(parts) + "\n")


def _gate_precedes(head: RunHead, gate_task: str, position: str, task_id: str) -> bool:
    order = [s.name for s in head.chain.steps]
    gate_index, task_index = order.index(gate_task), order.index(task_id)
    return gate_index < task_index or (gate_index == task_index and position == "before")

"""Prompt materialization: one function for every worker backend.

The system prompt is the specialist's persona from the run's chain snapshot. The user prompt is the
run's request, the outputs of the earlier tasks (from persisted facts only, in chain order) and the
comments approvers left on gates passed so far; a step with an ``output_schema`` ends with an "Answer
format" section giving the schema (every backend, so a provider asked for structured output only
through its prompt gets it too). The same run record always gives the same prompt,
byte for byte: nothing here reads a clock, the environment or the config file.

A later visit of a step (``engineer~2``, created by a route back) sees, for each step before its own
in the chain, the output of that step's latest done instance that ran before it (so the architect's
design, and for ``reviewer~2`` the work of ``engineer~2``), labelled with the instance's id; and,
under "Sent back by", the output of the routing task whose route created it (the reviewer's notes).
A routing step is told what each value of its routed field does. An instance created by a gate's
``revise`` (see :mod:`orchestration.routing`) sees, under "Sent back by the approver", the output
that was sent back and the approver's comment.

In a parallel chain (steps naming what they run ``after``, see :mod:`orchestration.graph`) the
work a task sees is that of its step's *ancestors* in the graph, not of every earlier step: a
writer after three researchers sees all three outputs, each labelled with its task id, and a
researcher does not see its siblings'. A step's own ``instruction`` (the angle a researcher
takes) ends its task section, in every chain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestration.graph import ancestors, is_parallel, latest, predecessors
from orchestration.memo import by_identity
from orchestration.models import ChainSnapshot, RunHead, TaskState, text_hash
from orchestration.routing import routing_note
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


def _position(head: RunHead, task_id: str) -> int:
    return next(i for i, t in enumerate(head.tasks) if t.task_id == task_id)


def _earlier_steps(head: RunHead, task: TaskState) -> list[TaskState]:
    """For each step before ``task``'s in the chain, its latest instance that ran before ``task``
    (for a linear chain: the tasks before it); in a parallel chain, each ancestor's latest
    instance."""
    if is_parallel(head.chain):
        found = (latest(head, name) for name in ancestors(head.chain, task.step_name))
        return [t for t in found if t is not None and t.status != TaskStatus.SKIPPED]
    position = _position(head, task.task_id)
    # One pass over the tasks before it, not one per earlier step: the latest instance of each
    # step that was not skipped.
    latest_before: dict[str, TaskState] = {}
    for t in head.tasks[:position]:
        if t.status != TaskStatus.SKIPPED:
            latest_before[t.step_name] = t
    steps = head.chain.steps[: head.chain.index(task.step_name)]
    return [latest_before[step.name] for step in steps if step.name in latest_before]


def _seen(head: RunHead, task: TaskState, position: int) -> set[str]:
    """The tasks whose gates' notes and failures ``task``'s prompt mentions: the tasks before it,
    or in a parallel chain the instances of its step's ancestors."""
    if is_parallel(head.chain):
        names = set(ancestors(head.chain, task.step_name))
        return {t.task_id for t in head.tasks if t.step_name in names}
    return {t.task_id for t in head.tasks[:position]}


def upstream_task_ids(head: RunHead, task_id: str) -> list[str]:
    """The done tasks whose outputs ``task_id``'s prompt includes: the latest done instance of each
    earlier step, and the routing task that sent the work back (if any), last."""
    task = head.task(task_id)
    ids = [t.task_id for t in _earlier_steps(head, task) if t.status == TaskStatus.DONE]
    sender = task.sent_back_by
    if sender is not None and sender not in ids and head.task(sender).status == TaskStatus.DONE:
        ids.append(sender)
    revised = task.revision_of
    if revised is not None and revised not in ids and head.task(revised).status == TaskStatus.DONE:
        ids.append(revised)
    return ids


def _sent_back_by_approver(head: RunHead, task: TaskState, outputs: Mapping[str, str]) -> list[str]:
    """The section of a task created by a gate's ``revise``: the comment and the output sent back."""
    gate = head.gate(task.revised_by) if task.revised_by is not None else None
    if gate is None or task.revision_of is None:
        return []
    who = f" ({gate.approver})" if gate.approver else ""
    comment = gate.comment.strip() if gate.comment else "(no comment)"
    parts = [
        "",
        f"## Sent back by the approver{who}",
        "",
        f"At gate {gate.gate_id} the approver sent the output of task {task.revision_of} back with "
        f"this comment: {comment}",
        "",
        "Redo that work, taking the comment into account.",
    ]
    if task.revision_of in outputs:
        parts += ["", f"### {task.revision_of} (the output sent back)", "", outputs[task.revision_of].strip()]
    return parts


@by_identity
def describe(chain: ChainSnapshot) -> str:
    """The chain's steps in a line: ``a -> b -> c``, or for a parallel chain each step with what it
    runs after (``r1, r2, writer (after r1, r2)``)."""
    if not is_parallel(chain):
        return " -> ".join(s.name for s in chain.steps)
    said = []
    for step in chain.steps:
        preds = predecessors(chain, step.name)
        said.append(f"{step.name} (after {', '.join(preds)})" if preds else step.name)
    return ", ".join(said)


def materialize(
    head: RunHead, task_id: str, outputs: Mapping[str, str], upstream_ids: Sequence[str] | None = None
) -> TaskPrompt:
    """The prompts for ``task_id``. ``outputs`` maps the ids from :func:`upstream_task_ids` to their
    persisted outputs; a missing one is a programming error (KeyError). ``upstream_ids``:
    ``upstream_task_ids(head, task_id)`` when the caller has it already."""
    steps = head.chain.steps
    task = head.task(task_id)
    index = head.chain.index(task.step_name)
    step = steps[index]
    specialist = head.chain.specialist(step.specialist)
    visit = task.visit_number
    round_note = f", round {visit} (task {task_id})" if visit > 1 else ""
    parts = [
        f'You are step {index + 1} of {len(steps)} ("{step.name}", the {specialist.name}){round_note} in '
        f'the chain "{head.chain.name}": {describe(head.chain)}.',
        "",
        "## Request",
        "",
        head.request.strip(),
    ]
    sender = task.sent_back_by
    if upstream_ids is None:
        upstream_ids = upstream_task_ids(head, task_id)
    upstream = [tid for tid in upstream_ids if tid not in (sender, task.revision_of)]
    if upstream:
        parts += ["", "## Work so far"]
        specialists = {t.task_id: t.specialist for t in head.tasks}
        for tid in upstream:
            spec = specialists[tid]
            parts += ["", f"### {tid} ({spec})", "", outputs[tid].strip()]
    if sender is not None and sender in outputs:
        by = head.task(sender)
        parts += [
            "",
            f"## Sent back by {by.step_name} (round {by.visit_number}, task {sender})",
            "",
            f"The {by.step_name}'s output below sent the work back for round {visit} of {step.name}. "
            "Take it into account.",
            "",
            outputs[sender].strip(),
        ]
    parts += _sent_back_by_approver(head, task, outputs)
    position = _position(head, task_id)
    seen = _seen(head, task, position)
    notes = [
        g
        for g in head.gates
        if g.status == "approved"
        and g.comment
        and (g.task_id in seen or (g.task_id == task_id and g.position == "before"))
    ]
    if notes:
        parts += ["", "## Approver notes"]
        for gate in notes:
            who = f" ({gate.approver})" if gate.approver else ""
            parts += ["", f"- {gate.gate_id}{who}: {gate.comment}"]
    failed = [t.task_id for t in head.tasks if t.status == TaskStatus.FAILED and t.task_id in seen]
    if failed:
        parts += ["", f"Note: these earlier steps failed and produced no output: {', '.join(failed)}."]
    parts += [
        "",
        "## Your task",
        "",
        f"Do the {specialist.name}'s part of this request. Your role: {specialist.description} "
        "Build on the work so far; the next step sees only what you write.",
    ]
    if step.instruction is not None:
        parts += ["", step.instruction.strip()]
    note = routing_note(step)
    if note is not None:
        parts += ["", note]
    if step.output_schema is not None:
        parts += ["", "## Answer format", "", answer_format(step.output_schema)]
    return TaskPrompt(task_id, specialist.name, specialist.persona, "\n".join(parts) + "\n")

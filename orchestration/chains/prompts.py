"""Prompt materialization: one function for every worker backend.

The system prompt is the step's persona; the user prompt the request, the work of the tasks the
task comes after (its step's ancestors in a parallel chain), approvers' comments, what sent it back
and, for a typed step, the answer format. It is read from the run's record alone (no clock,
environment or config), so the same record always gives the same prompt, byte for byte.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

from orchestration.chains.prompt_index import before, chain_plan, locate, work_section
from orchestration.core.graph import ancestors, is_parallel, latest
from orchestration.core.models import RunHead, TaskState
from orchestration.core.vocabulary import TaskStatus

_TASK_ID = attrgetter("task_id")

__all__ = ["TaskPrompt", "Upstream", "materialize", "render", "upstream", "upstream_task_ids"]


@dataclass(frozen=True, slots=True)
class TaskPrompt:
    task_id: str
    specialist: str
    system: str
    user: str

    @property
    def sha256(self) -> str:
        """The SHA-256 of ``system``, a NUL and ``user`` (UTF-8), hashed part by part: the digest
        of the joined text without building it. A system prompt with one non-ASCII character (the
        builtin personas' dashes) makes the joined text a wide string, and encoding a 30 KB one cost
        16 us where the two parts cost 2 us."""
        digest = _system_digest(self.system).copy()
        digest.update(self.user.encode())
        return digest.hexdigest()


class _Digest(Protocol):
    """What :meth:`TaskPrompt.sha256` uses of a ``hashlib`` hash object."""

    def copy(self) -> _Digest: ...

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


@functools.lru_cache(maxsize=64)
def _system_digest(system: str) -> _Digest:
    """The SHA-256 state after ``system`` and the NUL: the same for every prompt of a specialist
    (its persona), so hashed once (a persona is 2-3 KB; a prompt's user part, which holds the
    work so far, is hashed for each prompt)."""
    digest = hashlib.sha256(system.encode())
    digest.update(b"\x00")
    return digest


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where a task is (its position in the run, its step's in the chain) and the done tasks whose
    outputs its prompt includes: ``tasks`` (see :func:`upstream_task_ids`), of which ``work`` are
    shown under "Work so far" (all but the tasks that sent the work back)."""

    task: TaskState
    position: int
    index: int
    tasks: list[TaskState]
    work: list[TaskState]

    @property
    def ids(self) -> list[str]:
        return list(map(_TASK_ID, self.tasks))


def _earlier_steps(head: RunHead, task: TaskState, position: int, index: int) -> list[TaskState]:
    """For each step before ``task``'s in the chain, its latest instance that ran before ``task``
    (for a linear chain: the tasks before it), if it is done; in a parallel chain, each ancestor's
    latest instance, if it is done."""
    if is_parallel(head.chain):
        found = (latest(head, name) for name in ancestors(head.chain, task.step_name))
        return [t for t in found if t is not None and t.status == TaskStatus.DONE]
    done = before(head.tasks, position).done
    # filter(None, ...): a task is never false (a model without __bool__ or __len__); one C loop
    return list(filter(None, map(done.get, chain_plan(head.chain).names[:index])))


def _seen(head: RunHead, task: TaskState, position: int) -> set[str]:
    """The tasks whose gates' notes and failures ``task``'s prompt mentions: the tasks before it,
    or in a parallel chain the instances of its step's ancestors."""
    if is_parallel(head.chain):
        names = set(ancestors(head.chain, task.step_name))
        return {t.task_id for t in head.tasks if t.step_name in names}
    return {t.task_id for t in head.tasks[:position]}


def _where(head: RunHead, task_id: str) -> tuple[TaskState, int, int]:
    position = locate(head.tasks, head.chain, task_id)
    task = head.tasks[position]
    return task, position, head.chain.index(task.step_name)


def upstream(head: RunHead, task_id: str) -> Upstream:
    """What :func:`upstream_task_ids` gives, as tasks, with where ``task_id`` is."""
    task, position, index = _where(head, task_id)
    tasks = _earlier_steps(head, task, position, index)
    work = tasks
    sender, revised = task.sent_back_by, task.revision_of
    if sender is not None or revised is not None:
        ids = [t.task_id for t in tasks]
        work = [t for t in tasks if t.task_id not in (sender, revised)]
        tasks = list(tasks)
        for other in (sender, revised):
            if other is not None and other not in ids:
                found = head.task(other)
                if found.status == TaskStatus.DONE:
                    ids.append(other)
                    tasks.append(found)
    return Upstream(task, position, index, tasks, work)


def upstream_task_ids(head: RunHead, task_id: str) -> list[str]:
    """The done tasks whose outputs ``task_id``'s prompt includes: the latest done instance of each
    earlier step, and the routing task that sent the work back (if any), last."""
    return upstream(head, task_id).ids


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


def materialize(
    head: RunHead, task_id: str, outputs: Mapping[str, str], upstream_ids: Sequence[str] | None = None
) -> TaskPrompt:
    """The prompts for ``task_id``. ``outputs`` maps the ids from :func:`upstream_task_ids` to their
    persisted outputs; a missing one is a programming error (KeyError). ``upstream_ids``:
    ``upstream_task_ids(head, task_id)`` when the caller has it already."""
    if upstream_ids is None:
        up = upstream(head, task_id)
        return render(head, up.task, up.position, up.index, up.work, outputs)
    task, position, index = _where(head, task_id)
    by_id = {t.task_id: t for t in head.tasks}
    shown = (task.sent_back_by, task.revision_of)
    work = [by_id[tid] for tid in upstream_ids if tid not in shown]
    return render(head, task, position, index, work, outputs)


def render(
    head: RunHead,
    task: TaskState,
    position: int,
    index: int,
    work: Sequence[TaskState],
    outputs: Mapping[str, str],
    work_outputs: Sequence[str] | None = None,
) -> TaskPrompt:
    """The prompts of ``task`` (at ``position`` in the run, its step at ``index`` in the chain),
    showing ``work`` under "Work so far"; ``outputs``: as for :func:`materialize`, or
    ``work_outputs``: the outputs of ``work`` in its order, when the task was not sent back."""
    text = chain_plan(head.chain).text(index)
    specialist = text.specialist
    visit = task.visit_number
    round_note = f", round {visit} (task {task.task_id})" if visit > 1 else ""
    parts = [text.opening + round_note + text.closing, "", "## Request", "", head.request.strip()]
    if work:
        parts.append("")
        if work_outputs is None:
            work_outputs = list(map(outputs.__getitem__, map(_TASK_ID, work)))
        parts += work_section(work, work_outputs)
    sender = task.sent_back_by
    if sender is not None and sender in outputs:
        parts += _sent_back_by_route(head, task, sender, index, outputs)
    if task.revised_by is not None:
        parts += _sent_back_by_approver(head, task, outputs)
    parts += _gate_notes_and_failures(head, task, position)
    parts.append(text.tail)
    return TaskPrompt(task.task_id, specialist.name, specialist.persona, "\n".join(parts) + "\n")


def _sent_back_by_route(
    head: RunHead, task: TaskState, sender: str, index: int, outputs: Mapping[str, str]
) -> list[str]:
    """The section of a task created by a route back: the output of ``sender``, the routing task
    that sent it."""
    by = head.task(sender)
    return [
        "",
        f"## Sent back by {by.step_name} (round {by.visit_number}, task {sender})",
        "",
        f"The {by.step_name}'s output below sent the work back for round {task.visit_number} of "
        f"{head.chain.steps[index].name}. Take it into account.",
        "",
        outputs[sender].strip(),
    ]


def _gate_notes_and_failures(head: RunHead, task: TaskState, position: int) -> list[str]:
    """What the tasks ``task``'s prompt mentions (:func:`_seen`) left for it: the comments on their
    approved gates (and on the gate before ``task``), and which of them failed."""
    parts: list[str] = []
    seen: set[str] | None = None  # found once, and only when a section needs it
    commented = [g for g in head.gates if g.status == "approved" and g.comment]
    if commented:
        seen = _seen(head, task, position)
        notes = [
            g
            for g in commented
            if g.task_id in seen or (g.task_id == task.task_id and g.position == "before")
        ]
        if notes:
            parts += ["", "## Approver notes"]
            for gate in notes:
                who = f" ({gate.approver})" if gate.approver else ""
                parts += ["", f"- {gate.gate_id}{who}: {gate.comment}"]
    if is_parallel(head.chain):
        seen = _seen(head, task, position) if seen is None else seen
        failed: Sequence[str] = [
            t.task_id for t in head.tasks if t.status == TaskStatus.FAILED and t.task_id in seen
        ]
    else:
        failed = before(head.tasks, position).failed
    if failed:
        parts += ["", f"Note: these earlier steps failed and produced no output: {', '.join(failed)}."]
    return parts

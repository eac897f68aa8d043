"""What a task's prompt needs (:mod:`orchestration.chains.prompts` says what), found without walking
the whole run at every task boundary, so step 50 costs what step 5 does.

Caches are keyed by the identity of an immutable object the entry itself holds (so no other object
can take its id while it lives), and an entry is used only once all it was computed from compares
equal: it can only give what computing afresh would give.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from orchestration.chains.schemas import answer_format
from orchestration.core.graph import is_parallel, predecessors
from orchestration.core.memo import by_identity
from orchestration.core.models import INSTANCE_SEPARATOR, ChainSnapshot, SpecialistSnapshot, TaskState
from orchestration.core.routing import routing_note
from orchestration.core.vocabulary import TaskStatus

#: entries kept per cache below; past it the cache starts again (each running drive needs one)
LIMIT = 128

_TASK_ID = attrgetter("task_id")


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


@dataclass(frozen=True, slots=True)
class StepText:
    """The parts of a step's prompt that depend on the chain snapshot alone."""

    specialist: SpecialistSnapshot
    #: the first line up to the round note, and from it on
    opening: str
    closing: str
    #: "## Your task" and what follows it, with the blank line before it
    tail: str


@dataclass(frozen=True, slots=True)
class ChainPlan:
    chain: ChainSnapshot
    names: tuple[str, ...]
    #: step texts by position, made on first use (a step whose specialist is missing raises
    #: KeyError when its prompt is made, as before, not when another step's is)
    texts: dict[int, StepText] = field(default_factory=dict)

    def text(self, index: int) -> StepText:
        found = self.texts.get(index)
        if found is None:
            found = self.texts[index] = _step_text(self.chain, index)
        return found


@by_identity
def chain_plan(chain: ChainSnapshot) -> ChainPlan:
    return ChainPlan(chain, tuple(s.name for s in chain.steps))


def _sentence(text: str) -> str:
    """``text`` as a sentence: a description written without a closing full stop gets one, so the
    next sentence of the prompt does not run on from it."""
    text = text.strip()
    return text if not text or text[-1] in ".!?" else text + "."


def _step_text(chain: ChainSnapshot, index: int) -> StepText:
    steps = chain.steps
    step = steps[index]
    specialist = chain.specialist(step.specialist)
    tail = [
        "",
        "## Your task",
        "",
        f"Do the {specialist.name}'s part of this request. Your role: {_sentence(specialist.description)} "
        "Build on the work so far; the next step sees only what you write.",
    ]
    if step.instruction is not None:
        tail += ["", step.instruction.strip()]
    note = routing_note(step)
    if note is not None:
        tail += ["", note]
    if step.output_schema is not None:
        tail += ["", "## Answer format", "", answer_format(step.output_schema)]
    return StepText(
        specialist,
        f'You are step {index + 1} of {len(steps)} ("{step.name}", the {specialist.name})',
        f' in the chain "{chain.name}": {describe(chain)}.',
        "\n".join(tail),
    )


def locate(tasks: Sequence[TaskState], chain: ChainSnapshot, task_id: str) -> int:
    """The position of ``task_id`` among ``tasks`` (KeyError when it is none of them). A step's
    first instance is usually at the step's own position (tasks are created in chain order):
    that one is checked first, then every task."""
    try:
        guess = chain.index(task_id.partition(INSTANCE_SEPARATOR)[0])
    except KeyError:
        guess = -1
    if 0 <= guess < len(tasks) and tasks[guess].task_id == task_id:
        return guess
    try:
        return list(map(_TASK_ID, tasks)).index(task_id)
    except ValueError:
        raise KeyError(task_id) from None


# -- the tasks before a position (linear chains) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Before:
    """What the prompt of a task in a linear chain needs from the tasks before it: for each step,
    its latest instance there that was not skipped if that one is done, and the failed tasks (in
    run order). Never changed once made."""

    tasks: tuple[TaskState, ...]
    done: dict[str, TaskState]
    failed: tuple[str, ...]

    def extended(self, more: Sequence[TaskState]) -> Before:
        done = dict(self.done)
        failed = list(self.failed)
        for t in more:
            status = t.status
            if status == TaskStatus.SKIPPED:
                continue
            if status == TaskStatus.DONE:
                done[t.step_name] = t
            else:
                done.pop(t.step_name, None)
                if status == TaskStatus.FAILED:
                    failed.append(t.task_id)
        return Before((*self.tasks, *more), done, tuple(failed))


_NOTHING_BEFORE = Before((), {}, ())
#: by the id of an entry's last task (which the entry holds)
_befores: dict[int, Before] = {}


def before(tasks: tuple[TaskState, ...], position: int) -> Before:
    """The :class:`Before` of ``tasks[:position]``: the one made for that prefix, or for all of it
    but its last task (the previous boundary's) extended, or one made afresh."""
    if position == 0:
        return _NOTHING_BEFORE
    prefix = tasks[:position]
    found = _befores.get(id(prefix[-1]))
    if found is not None and found.tasks == prefix:
        return found
    if position > 1:
        shorter = _befores.get(id(prefix[-2]))
        if shorter is not None and shorter.tasks == prefix[:-1]:
            made = shorter.extended(prefix[-1:])
            _befores.pop(id(prefix[-2]), None)
            return _keep(_befores, made)
    return _keep(_befores, _NOTHING_BEFORE.extended(prefix))


def _keep(cache: dict[int, Before], made: Before) -> Before:
    if len(cache) >= LIMIT:
        cache.clear()
    cache[id(made.tasks[-1])] = made
    return made


# -- the "Work so far" section ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Work:
    tasks: tuple[TaskState, ...]
    outputs: tuple[str, ...]
    lines: tuple[str, ...]


#: by the id of an entry's last task (which the entry holds)
_works: dict[int, _Work] = {}


def _lines(tasks: Sequence[TaskState], outputs: Sequence[str]) -> list[str]:
    lines: list[str] = []
    for t, output in zip(tasks, outputs, strict=True):
        lines += ["", f"### {t.task_id} ({t.specialist})", "", output.strip()]
    return lines


def work_section(tasks: Sequence[TaskState], outputs: Sequence[str]) -> tuple[str, ...]:
    """The lines of the "Work so far" section: its title and, for each task, a blank line,
    ``### <id> (<specialist>)``, a blank line and its output (stripped). Extended from the lines
    made for all but the last of ``tasks`` (with the same outputs) when there are some; the prompt
    joins them (one copy of the outputs per prompt, not one per section and one per prompt)."""
    key_tasks = tuple(tasks)
    key_outputs = tuple(outputs)
    found = _works.get(id(key_tasks[-1]))
    if found is not None and found.tasks == key_tasks and found.outputs == key_outputs:
        return found.lines
    lines = None
    if len(key_tasks) > 1:
        shorter = _works.get(id(key_tasks[-2]))
        if shorter is not None and shorter.tasks == key_tasks[:-1] and shorter.outputs == key_outputs[:-1]:
            lines = (*shorter.lines, *_lines(key_tasks[-1:], key_outputs[-1:]))
            _works.pop(id(key_tasks[-2]), None)
    if lines is None:
        lines = ("## Work so far", *_lines(key_tasks, key_outputs))
    if len(_works) >= LIMIT:
        _works.clear()
    _works[id(key_tasks[-1])] = _Work(key_tasks, key_outputs, lines)
    return lines


def clear() -> None:
    """Forget every entry (tests)."""
    _befores.clear()
    _works.clear()

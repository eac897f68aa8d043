"""Moving a live run to another version of its chain, in place, without reinterpreting anything
recorded: the verdict (:func:`plan_upgrade`) and what the move changes (:func:`upgrade_effect`,
the fold of ``chain_upgraded``). Pure.

A run may move from chain A to chain B when every step instance with recorded work — an output,
a failure, a decided route, or a gate decided and acted on — exists in B with the same definition
(the step, its specialist's persona, the steps it runs after), and no attempt is in flight. Steps
not yet started may change, be added or be removed. A host task handed out on a step that changed
is replaced by a new instance of the step (its output for the old one is refused); a gate on a
step that changed and has not started is asked again (a decision taken on the old definition
stays in the record, superseded).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestration.core.graph import predecessors
from orchestration.core.models import ChainSnapshot, ChainStep, GateState, RunHead, TaskState, instance_id
from orchestration.core.routing import instance_gates, visits
from orchestration.core.vocabulary import TaskStatus

#: tasks whose step may change: nothing of them is recorded but, at most, a prepared prompt
_UNSTARTED = frozenset({TaskStatus.PENDING, TaskStatus.AWAITING_HOST})


@dataclass(frozen=True, slots=True)
class CannotMove:
    """Why a run cannot move to the chain asked for: ``step`` (None: the run as a whole) and
    what stands in the way, in words. ``code``: ``upgrade_blocked`` (recorded work would be
    reinterpreted: it never will move there) or ``invalid_state`` (not now: an attempt is in
    flight, or the run has ended)."""

    #: ``upgrade_blocked``, ``invalid_state`` or ``pinned`` (the chain's runs do not move)
    code: str
    step: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class UpgradePlan:
    """What moving a run to a chain changes (all empty: the chains are the same for the run)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    #: steps not yet started whose definition changed
    changed: tuple[str, ...]
    #: host tasks handed out that a new instance replaces, and gates asked again
    replaced: tuple[str, ...]
    reasked: tuple[str, ...]

    @property
    def moves(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def step_changes(old: ChainSnapshot, new: ChainSnapshot, name: str) -> list[str]:
    """What differs in step ``name`` between ``old`` and ``new`` (both have it): its fields, the
    steps it runs after, and its specialist's persona; empty when it is defined the same."""
    step, was = new.step(name), old.step(name)
    changed = [k for k in type(step).model_fields if getattr(step, k) != getattr(was, k)]
    if predecessors(new, name) != predecessors(old, name):
        changed.append("the steps it runs after")
    if step.specialist == was.specialist and new.specialist(step.specialist) != old.specialist(
        was.specialist
    ):
        changed.append(f"specialist {step.specialist!r}")
    return changed


def plan_upgrade(head: RunHead, new: ChainSnapshot) -> UpgradePlan | CannotMove:
    """The verdict on moving ``head``'s run to ``new`` (see the module docstring)."""
    if head.status.is_terminal:
        return CannotMove("invalid_state", None, f"the run is {head.status.value}")
    old = head.chain
    names = {s.name for s in new.steps}
    changed = [s.name for s in new.steps if s.name in _names(old) and step_changes(old, new, s.name)]
    for task in head.tasks:
        if task.status == TaskStatus.RUNNING:
            return CannotMove(
                "invalid_state", task.step_name, f"task {task.task_id} has an attempt in flight"
            )
        if task.status in _UNSTARTED and not _acted_on(head, task):
            continue
        if task.step_name not in names:
            return CannotMove(
                "upgrade_blocked",
                task.step_name,
                f"step {task.step_name!r} has recorded work (task {task.task_id} is "
                f"{task.status.value}) and chain {new.name!r} has no such step",
            )
        what = step_changes(old, new, task.step_name)
        if what and task.status != TaskStatus.SKIPPED:
            return CannotMove(
                "upgrade_blocked",
                task.step_name,
                f"step {task.step_name!r} has recorded work (task {task.task_id} is "
                f"{task.status.value}) and is defined differently now ({', '.join(what)})",
            )
    unstarted = [t for t in head.tasks if t.status in _UNSTARTED]
    return UpgradePlan(
        added=tuple(s.name for s in new.steps if s.name not in _names(old)),
        removed=tuple(s.name for s in old.steps if s.name not in names),
        changed=tuple(changed),
        replaced=tuple(
            t.task_id for t in unstarted if t.status == TaskStatus.AWAITING_HOST and t.step_name in changed
        ),
        reasked=tuple(
            g.gate_id
            for g in head.gates
            if g.status != "pending" and _task_of(head, g) in unstarted and _step_of(head, g) in changed
        ),
    )


def _names(chain: ChainSnapshot) -> set[str]:
    return {s.name for s in chain.steps}


def _task_of(head: RunHead, gate: GateState) -> TaskState | None:
    return next((t for t in head.tasks if t.task_id == gate.task_id), None)


def _step_of(head: RunHead, gate: GateState) -> str | None:
    task = _task_of(head, gate)
    return None if task is None else task.step_name


def _acted_on(head: RunHead, task: TaskState) -> bool:
    """Whether an unstarted task's ``after`` gate was decided (it never is before the task ran:
    a record that says so is recorded work all the same)."""
    return any(
        g.task_id == task.task_id and g.position == "after" and g.status != "pending" for g in head.gates
    )


def upgrade_effect(head: RunHead, new: ChainSnapshot) -> tuple[tuple[TaskState, ...], tuple[GateState, ...]]:
    """The run's tasks and gates on ``new`` (a move :func:`plan_upgrade` allowed): tasks of
    removed steps dropped (with their gates); a handed-out host task on a changed step closed
    (``skipped``) and followed by a new instance; gates of changed unstarted steps pending again;
    a first instance, with its gates, for each added step, placed after the tasks of the steps
    it follows in ``new``."""
    old = head.chain
    names = _names(new)
    tasks: list[TaskState] = []
    gates = [g for g in head.gates if _step_of(head, g) in names or g.position == "budget"]
    for task in head.tasks:
        if task.step_name not in names:
            continue
        if task.status not in _UNSTARTED or not step_changes(old, new, task.step_name):
            tasks.append(task)
            continue
        step = new.step(task.step_name)
        gates = [_reset(g) if g.task_id == task.task_id else g for g in gates]
        if task.status == TaskStatus.AWAITING_HOST:
            tasks.append(task.model_copy(update={"status": TaskStatus.SKIPPED}))
            visit = visits(head, task.step_name) + 1
            task_id = instance_id(task.step_name, visit)
            gates = [g for g in gates if g.task_id != task.task_id]
            gates.extend(instance_gates(step, task_id))
            tasks.append(
                TaskState(
                    task_id=task_id,
                    specialist=step.specialist,
                    step=task.step_name,
                    visit=visit,
                    upgraded_from=task.task_id,
                )
            )
        else:
            tasks.append(task.model_copy(update={"specialist": step.specialist}))
            gates = _with_gates_of(gates, step, task.task_id)
    for index, step in enumerate(new.steps):
        if step.name in _names(old):
            continue
        after = {s.name for s in new.steps[:index]}
        at = max((i + 1 for i, t in enumerate(tasks) if t.step_name in after), default=0)
        tasks.insert(at, TaskState(task_id=step.name, specialist=step.specialist))
        gates.extend(instance_gates(step, step.name))
    return tuple(tasks), tuple(gates)


def _reset(gate: GateState) -> GateState:
    """``gate`` to be asked again: what it had (its decision) stays only in the record."""
    return GateState(gate_id=gate.gate_id, task_id=gate.task_id, position=gate.position)


def _with_gates_of(gates: list[GateState], step: ChainStep, task_id: str) -> list[GateState]:
    """``gates`` with ``task_id``'s gates as ``step`` defines them now (kept where they are, pending
    again; added where the step now asks; dropped where it no longer does)."""
    wanted = {g.gate_id: g for g in instance_gates(step, task_id)}
    kept = [g for g in gates if g.task_id != task_id or g.gate_id in wanted]
    have = {g.gate_id for g in kept}
    return kept + [g for gate_id, g in wanted.items() if gate_id not in have]


__all__ = ["CannotMove", "UpgradePlan", "plan_upgrade", "step_changes", "upgrade_effect"]

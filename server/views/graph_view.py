"""The graph part of a run view, whose ``tasks`` are the task instances in run order (the path the
run took through its chain): the routing facts that chose the path, what each waiting task waits
for (in a parallel chain: the predecessors it runs after that have not settled), and the history
of a loop whose bound was reached (shown at its ``exhausted:<task>`` gate). Built from the
persisted record only.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from orchestration.core import (
    GateState,
    RouteDecided,
    RunHead,
    TaskState,
    TaskStatus,
    gate_id_for,
    is_parallel,
    latest,
    predecessors,
    settled,
)
from orchestration.engine import RunSnapshot

#: How much of each round's notes the history of an exhausted loop quotes.
NOTES_PREVIEW_CHARS = 160


class RouteView(BaseModel):
    """One routing fact: the routing task's ``route_on`` field had ``value``; ``target`` is where
    the route points, ``applied`` what was done (the same unless the bound was ``exhausted``),
    ``next_task_id`` the task the run went on with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    route_on: str
    value: str | None
    target: str
    applied: str
    next_task_id: str | None = None
    exhausted: bool = False
    bounded_step: str | None = None
    visits: int | None = None
    seq: int


def route_view(fact: RouteDecided) -> RouteView:
    return RouteView(
        task_id=fact.task_id,
        route_on=fact.route_on,
        value=fact.value,
        target=fact.target,
        applied=fact.applied,
        next_task_id=fact.next_task_id,
        exhausted=fact.exhausted,
        bounded_step=fact.bounded_step,
        visits=fact.visits,
        seq=fact.seq,
    )


def waits_for(head: RunHead, task: TaskState) -> str | None:
    """What a task that has not ended waits for, in a few words (None for an ended task)."""
    if task.status.is_terminal:
        return None
    if task.status == TaskStatus.AWAITING_HOST:
        return "the host's output (orchestrate_resume)"
    if task.status == TaskStatus.RUNNING:
        return "the provider's answer"
    gate = head.gate(gate_id_for("before", task.task_id))
    if gate is not None and gate.status == "requested":
        return f"approval of gate {gate.gate_id}"
    if is_parallel(head.chain):
        # A step after several waits for every predecessor that has not settled.
        found = (latest(head, name) for name in predecessors(head.chain, task.step_name))
        blocking = [t.task_id for t in found if t is not None and not settled(head, t)]
        if blocking:
            return f"task{'s' if len(blocking) > 1 else ''} {', '.join(blocking)}"
        if gate is not None and gate.status == "pending":
            return f"approval of gate {gate.gate_id}"
        return "its turn: the server starts it next"
    index = next(i for i, t in enumerate(head.tasks) if t.task_id == task.task_id)
    earlier = [t for t in head.tasks[:index] if not t.status.is_terminal]
    if earlier:
        return f"task {earlier[-1].task_id}"
    if gate is not None and gate.status == "pending":
        return f"approval of gate {gate.gate_id}"
    return "its turn: the server starts it next"


def loop_history(snapshot: RunSnapshot, gate: GateState) -> str:
    """The rounds of the loop an ``exhausted`` gate ends: each visit of the routing step with the
    value it routed on and the start of its notes."""
    head = snapshot.head
    router = head.task(gate.task_id)
    step = head.step_of(router.task_id)
    field = step.route_on or "value"
    rounds: list[str] = []
    for task in head.tasks:
        if task.step_name != router.step_name or task.status != TaskStatus.DONE:
            continue
        value = snapshot.values.get(task.task_id) or {}
        notes = value.get("notes")
        said = f"{field}={task.route_value}"
        if isinstance(notes, str) and notes.strip():
            flat = " ".join(notes.split())
            cut = flat if len(flat) <= NOTES_PREVIEW_CHARS else flat[: NOTES_PREVIEW_CHARS - 1] + "…"
            said += f", notes: {cut}"
        rounds.append(f"round {task.visit_number} ({task.task_id}): {said}")
    route = next((r for r in reversed(snapshot.routes) if r.task_id == router.task_id), None)
    bound = (
        f"step {route.bounded_step} has had {route.visits} visits, its max_visits"
        if route is not None and route.bounded_step is not None
        else "a step of the loop reached its max_visits"
    )
    return (
        f"The loop through {step.name!r} is exhausted: {bound}, so the route of {router.task_id} "
        f"({field}={router.route_value}) cannot go back again. History: "
        + "; ".join(rounds)
        + ". Approve to accept the work as it is (the run completes); reject to end the run rejected."
    )

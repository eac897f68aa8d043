"""A chain as a graph of steps: edges, ancestry, readiness, and the checks made at load.

A step runs after the steps its ``after`` names, else after the previous step, so a chain without
``after`` means what it always meant. In a parallel chain (:func:`is_parallel`) the steps whose
predecessors have all settled run at once (:func:`ready_tasks`); a loop's body
(:func:`loop_body`) and a jump's skipped steps (:func:`jumped`) follow the same edges.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestration.core.budget import fails_run, open_budget_gate
from orchestration.core.memo import by_identity
from orchestration.core.models import ChainSnapshot, ChainStep, RunHead, TaskState, gate_id_for
from orchestration.core.vocabulary import RunStatus, TaskStatus


def is_parallel(chain: ChainSnapshot | Sequence[ChainStep]) -> bool:
    """Whether a step of the chain names what it runs ``after`` (the chain is then a graph)."""
    if isinstance(chain, ChainSnapshot):
        return _chain_is_parallel(chain)
    return any(step.after is not None for step in chain)


@by_identity
def _chain_is_parallel(chain: ChainSnapshot) -> bool:
    # Once per chain snapshot: every decision and every fold asks it (see orchestration.core.memo).
    return any(step.after is not None for step in chain.steps)


@by_identity
def has_agent_steps(chain: ChainSnapshot) -> bool:
    """Whether a step of the chain delegates to an MCP agent: only such a step's attempt can
    wait for a remote run (:func:`awaits_agent`). Once per chain snapshot."""
    return any(step.agent is not None for step in chain.steps)


def predecessors_in(steps: Sequence[ChainStep], index: int) -> tuple[str, ...]:
    """The names of the steps that step ``steps[index]`` runs after."""
    step = steps[index]
    if step.after is not None:
        return step.after
    return (steps[index - 1].name,) if index > 0 else ()


def predecessors(chain: ChainSnapshot, name: str) -> tuple[str, ...]:
    return predecessors_in(chain.steps, chain.index(name))


def ancestors(chain: ChainSnapshot, name: str) -> list[str]:
    """Every step ``name`` runs after, transitively, in chain order."""
    seen: set[str] = set()
    todo = list(predecessors(chain, name))
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo += predecessors(chain, current)
    return [s.name for s in chain.steps if s.name in seen]


def descendants(chain: ChainSnapshot, name: str) -> list[str]:
    """Every step that runs after ``name``, transitively, in chain order."""
    return [s.name for s in chain.steps if name in ancestors(chain, s.name)]


def loop_body(chain: ChainSnapshot, target: str, router: str) -> list[str]:
    """The steps a route from ``router`` back to ``target`` runs again: those on the paths from
    the target to the router (both included), in chain order."""
    down = {target, *descendants(chain, target)}
    up = {router, *ancestors(chain, router)}
    return [s.name for s in chain.steps if s.name in down and s.name in up]


def jumped(chain: ChainSnapshot, router: str, target: str) -> list[str]:
    """The steps a route from ``router`` forward to ``target`` skips: those between them (after
    the router and before the target), in chain order."""
    after = set(descendants(chain, router))
    return [name for name in ancestors(chain, target) if name in after]


def goes_back(chain: ChainSnapshot, router: str, target: str) -> bool:
    """Whether a route from ``router`` to ``target`` is a loop (the target is the router or runs
    before it) rather than a jump forward."""
    if is_parallel(chain):
        return target == router or target in ancestors(chain, router)
    return chain.index(target) <= chain.index(router)


def latest(head: RunHead, step: str) -> TaskState | None:
    """The latest instance of ``step`` in the run."""
    found = None
    for task in head.tasks:
        if task.step_name == step:
            found = task
    return found


def settled(head: RunHead, task: TaskState) -> bool:
    """Whether the steps after ``task``'s may start: ``task`` is done (its ``approve_after`` gate, if
    any, approved; a routing task's route recorded), failed with ``on_failure = "continue"``, or
    skipped. A predecessor failed with ``on_failure = "fail"`` fails the run instead."""
    if task.status == TaskStatus.DONE:
        step = head.chain.step(task.step_name)
        if step.route_on is not None and (task.routed_to is None or task.routed_to == "ask"):
            # A routing task is settled once its route is recorded (and did not end at a gate).
            return False
        if step.approve_after:
            gate = head.gate(gate_id_for("after", task.task_id))
            return gate is None or gate.status == "approved"
        return True
    return task.status.is_terminal


def preds_settled(head: RunHead, task: TaskState) -> bool:
    """Whether every predecessor of ``task``'s step has settled (its latest instance)."""
    for name in predecessors(head.chain, task.step_name):
        pred = latest(head, name)
        if pred is not None and not settled(head, pred):
            return False
    return True


def ready_tasks(head: RunHead) -> list[TaskState]:
    """The run's tasks that have not ended and whose predecessors have settled, in run order."""
    return [t for t in head.tasks if not t.status.is_terminal and preds_settled(head, t)]


def summary_status(head: RunHead) -> RunStatus:
    """The status of a run of a parallel chain that has not ended, summarizing its branches:
    ``running`` while a provider call is in flight (or orphaned: see DESIGN §4), ``queued`` while
    the server has something to do (a task to start or prepare, a gate to request, a failed
    required task, the run to finish), else paused: ``awaiting_host`` while a host task waits
    (gates may wait too), ``awaiting_approval`` while only gates wait. It does not read a clock:
    a task waiting for a provider's retry-after is work (``queued`` with ``not_before``). A step
    whose child run works (:mod:`orchestration.engine.children`) is not a call in flight: while only
    children work, the run is ``awaiting_children``; nor is a remote agent run followed outside the
    drive (:func:`awaits_agent`): while only those (and children) work, ``awaiting_agent``."""
    if any(_in_flight(head, t) for t in head.tasks):
        return RunStatus.RUNNING
    host = gate = children = agent = False
    for task in head.tasks:
        step = head.chain.step(task.step_name)
        if task.status == TaskStatus.FAILED and (step.on_failure == "fail" or fails_run(task)):
            return RunStatus.QUEUED
        if task.status == TaskStatus.DONE and step.approve_after:
            status = _gate_status(head, "after", task)
            if status == "pending":
                return RunStatus.QUEUED
            gate = gate or status == "requested"
        if task.status == TaskStatus.DONE and step.route_on is not None and settled_gate(head, task):
            if task.routed_to is None:
                return RunStatus.QUEUED  # its route is to be recorded
            if task.routed_to == "ask":
                status = _gate_status(head, "exhausted", task)
                if status != "requested":
                    return RunStatus.QUEUED  # to request, or approved: the run finishes
                gate = True
        if task.status.is_terminal or not preds_settled(head, task):
            continue
        status = _gate_status(head, "before", task) if step.approve_before else None
        if status == "pending":
            return RunStatus.QUEUED
        if status == "requested" or _asks(head, task):
            gate = True
        elif task.status == TaskStatus.AWAITING_HOST:
            host = True
        elif task.status == TaskStatus.RUNNING and awaits_agent(task):
            agent = True  # a remote agent run works, followed outside the drive
        elif task.status == TaskStatus.RUNNING:
            children = True  # a step's child run works (a call in flight returned above)
        else:
            return RunStatus.QUEUED
    if host:
        return RunStatus.AWAITING_HOST
    if gate:
        return RunStatus.AWAITING_APPROVAL
    if agent:
        return RunStatus.AWAITING_AGENT
    if children:
        return RunStatus.AWAITING_CHILDREN
    return RunStatus.QUEUED


def _in_flight(head: RunHead, task: TaskState) -> bool:
    """Whether ``task`` has a call in flight: running, and not a step's child run, nor a remote
    agent run followed outside the drive or parked at its question."""
    return (
        task.status == TaskStatus.RUNNING
        and head.chain.step(task.step_name).chain is None
        and not awaits_agent(task)
        and parked_question(task) is None
    )


def _asks(head: RunHead, task: TaskState) -> bool:
    """Whether ``task`` waits at a gate of its own making: a budget gate, or its remote agent's
    question."""
    return open_budget_gate(head, task.task_id) is not None or parked_question(task) is not None


def awaits_agent(task: TaskState) -> bool:
    """Whether the task's attempt in flight is an agent step's remote run followed outside any
    drive (:mod:`orchestration.engine.agent_waits`): no call is in flight, the run awaits it."""
    last = task.attempts[-1] if task.attempts else None
    return last is not None and last.waits and last.outcome == "running" and task.status == TaskStatus.RUNNING


def parked_question(task: TaskState) -> str | None:
    """The ``question`` gate the task's attempt in flight is parked at (its remote A2A task asks
    a question nobody answered yet: :mod:`orchestration.engine.agent_questions`), or None."""
    last = task.attempts[-1] if task.attempts else None
    if last is None or last.question is None or last.waits or last.outcome != "running":
        return None
    return last.question if task.status == TaskStatus.RUNNING else None


def settled_gate(head: RunHead, task: TaskState) -> bool:
    """Whether a done task's ``approve_after`` gate (if any) has been approved."""
    if not head.chain.step(task.step_name).approve_after:
        return True
    return _gate_status(head, "after", task) == "approved"


def _gate_status(head: RunHead, position: str, task: TaskState) -> str | None:
    found = head.gate(f"{position}:{task.task_id}")
    return None if found is None else found.status


def check_graph(steps: Sequence[ChainStep]) -> tuple[str, str] | None:
    """The first problem of a chain's ``after`` edges and ``instruction``, as ``(field, message)``
    relative to the chain; None when it is sound."""
    names = [s.name for s in steps]
    for i, step in enumerate(steps):
        where = f"steps[{i}]"
        if step.instruction is not None and not step.instruction.strip():
            return (
                f"{where}.instruction",
                "instruction is empty; say what this step should focus on, or omit it",
            )
        if step.after is None:
            continue
        if len(set(step.after)) != len(step.after):
            return f"{where}.after", "a step is named twice"
        for pred in step.after:
            if pred not in names:
                return (
                    f"{where}.after",
                    f"unknown step {pred!r}: name steps of the chain ({', '.join(names)})",
                )
            if pred == step.name:
                return f"{where}.after", f"step {step.name!r} cannot run after itself"
    if is_parallel(steps):
        cycle = _cycle(steps)
        if cycle is not None:
            i = names.index(cycle[0])
            return f"steps[{i}].after", "the steps run after each other in a cycle: " + " -> ".join(cycle)
    return None


def _cycle(steps: Sequence[ChainStep]) -> list[str] | None:
    preds = {s.name: predecessors_in(steps, i) for i, s in enumerate(steps)}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for pred in preds[name]:
            if state.get(pred) == 1:
                return [*path[path.index(pred) :], pred]
            if pred not in state:
                found = visit(pred)
                if found is not None:
                    return found
        path.pop()
        state[name] = 2
        return None

    for step in steps:
        if step.name not in state:
            found = visit(step.name)
            if found is not None:
                return list(reversed(found))
    return None


__all__ = [
    "ancestors",
    "awaits_agent",
    "check_graph",
    "has_agent_steps",
    "is_parallel",
    "latest",
    "parked_question",
    "predecessors",
    "predecessors_in",
    "preds_settled",
    "ready_tasks",
    "settled",
    "summary_status",
]

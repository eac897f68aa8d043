"""Routing and bounded loops: the rules shared by the pure decision, the fold and the catalog.

Deciding reads only the head: the fold of ``task_completed`` keeps the routed value on the task,
:func:`plan_route` turns it into a :class:`RoutePlan`, the drive records it as ``route_decided``
and folding that fact (:func:`route_update`) moves the run. So a restarted run routes exactly as
the crashed one would have, and the log says why. A gate's revise (:func:`revise_plan`) is a loop
a person asks for, under the same bounds. The rules in full: docs/chains.md and docs/approvals.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestration.core.graph import (
    goes_back,
    is_parallel,
    jumped,
    latest,
    loop_body,
    predecessors,
)
from orchestration.core.models import (
    ChainSnapshot,
    ChainStep,
    GateState,
    RunHead,
    TaskState,
    TypedError,
    gate_id_for,
    instance_id,
)
from orchestration.core.vocabulary import TaskStatus

END = "end"
FAIL = "fail"
ASK = "ask"


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """What a routing task's recorded value makes the run do (the content of a ``route_decided``
    fact). ``target`` is what ``routes`` says for the value; ``applied`` is what is done: the same,
    unless the bound was reached (``exhausted``), when it is the step's ``on_exhausted``."""

    task_id: str
    output_seq: int
    route_on: str
    value: str | None
    target: str
    applied: str
    #: the task the run goes on with (a step's instance); None for end, fail and ask
    next_task_id: str | None
    exhausted: bool = False
    #: when exhausted: the step whose bound was reached and the visits it has had
    bounded_step: str | None = None
    visits: int | None = None
    error: TypedError | None = None


def chain_format(chain: ChainSnapshot) -> int:
    """The record format a run of ``chain`` is created with: 3 when a step's gates expire or name
    their approvers (a server that does not know them would let a gate wait forever, or let anyone
    decide it), else 2 when a step routes (a server that
    does not know routes would read the snapshot as a linear chain and decide wrongly, so it must
    refuse the whole run: "Record formats" in docs/development.md), else 1. A parallel
    chain (a step with ``after``) or a step's own ``instruction`` needs format 2 too: routing and
    parallel steps came in the same format, so no server reads format 2 without knowing both.
    A chain-level gate policy (``approvers`` of the chain) needs format 5: a server that does not
    know it would let anyone decide the gates it covers. A step's ``"agent"`` approver needs no
    format of its own: an older server reads it as a name, claimed over stdio as this one does."""
    if chain.approvers is not None:
        return 5
    if any(s.chain is not None for s in chain.steps):
        return 4  # a step that runs a chain as a child run (orchestration.engine.children)
    if any(s.agent is not None for s in chain.steps):
        # A server that does not know agent steps would run them as specialists.
        return 4
    if any(s.expires_after_seconds is not None or s.approvers is not None for s in chain.steps):
        return 3
    graph = any(step.after is not None or step.instruction is not None for step in chain.steps)
    return 2 if graph or any(step.route_on is not None for step in chain.steps) else 1


def route_value_of(step: ChainStep, value: dict[str, Any] | None) -> str | None:
    """The value of the field ``step`` routes on, as the head keeps it (None when it does not
    route, or the output carries no such string)."""
    if step.route_on is None or value is None:
        return None
    found = value.get(step.route_on)
    return found if isinstance(found, str) else None


def _position(head: RunHead, task_id: str) -> int:
    return next(i for i, t in enumerate(head.tasks) if t.task_id == task_id)


def visits(head: RunHead, step: str) -> int:
    """How many instances of ``step`` the run has (skipped ones included)."""
    return sum(1 for t in head.tasks if t.step_name == step)


def _next_pending(head: RunHead, after: int, step: str) -> TaskState | None:
    for task in head.tasks[after + 1 :]:
        if task.step_name == step and task.status == TaskStatus.PENDING:
            return task
    return None


def plan_route(head: RunHead, task: TaskState) -> RoutePlan:
    """Where ``task`` (a done task of a routing step) sends the run. Pure."""
    chain = head.chain
    step = chain.step(task.step_name)
    field = step.route_on or ""
    value = task.route_value
    target = (step.routes or {}).get(value) if value is not None else None
    base: dict[str, Any] = {
        "task_id": task.task_id,
        "output_seq": task.output_seq or 0,
        "route_on": field,
        "value": value,
    }
    if target is None:
        # Cannot happen for a checked chain and a validated output; fail rather than guess.
        error = TypedError(
            code="route_failed",
            message=f"step {step.name} (task {task.task_id}) has no route for {field} = {value!r}",
        )
        return RoutePlan(**base, target=FAIL, applied=FAIL, next_task_id=None, error=error)
    if target == END:
        return RoutePlan(**base, target=END, applied=END, next_task_id=None)
    if target == FAIL:
        error = TypedError(
            code="route_failed",
            message=f"step {step.name} (task {task.task_id}) answered {field} = {value!r}, which routes "
            "to fail",
        )
        return RoutePlan(**base, target=FAIL, applied=FAIL, next_task_id=None, error=error)
    position = _position(head, task.task_id)
    if not goes_back(chain, step.name, target):
        return _forward(head, base, target, target, position)
    for body_step in _body(chain, target, step.name):
        made = visits(head, body_step.name)
        if made >= body_step.max_visits:
            return _exhausted(head, base, step, target, position, body_step, made)
    next_id = instance_id(target, visits(head, target) + 1)
    return RoutePlan(**base, target=target, applied=target, next_task_id=next_id)


def _body(chain: ChainSnapshot, target: str, router: str) -> list[ChainStep]:
    """The steps a loop back from ``router`` to ``target`` visits again, the target first: in a
    linear chain every step from the target to the router; in a parallel one the steps on the
    paths between them (:func:`orchestration.core.graph.loop_body`)."""
    if not is_parallel(chain):
        return list(chain.steps[chain.index(target) : chain.index(router) + 1])
    names = loop_body(chain, target, router)
    return [chain.step(target)] + [chain.step(n) for n in names if n != target]


def _forward(
    head: RunHead, base: dict[str, Any], target: str, applied: str, position: int, **extra: Any
) -> RoutePlan:
    if is_parallel(head.chain):
        found = latest(head, applied)
        upcoming = found if found is not None and found.status == TaskStatus.PENDING else None
    else:
        upcoming = _next_pending(head, position, applied)
    if upcoming is None:  # pragma: no cover - every later step keeps a pending instance
        error = TypedError(code="route_failed", message=f"no pending instance of step {applied} to route to")
        return RoutePlan(**base, target=target, applied=FAIL, next_task_id=None, error=error, **extra)
    return RoutePlan(**base, target=target, applied=applied, next_task_id=upcoming.task_id, **extra)


def _exhausted(
    head: RunHead,
    base: dict[str, Any],
    step: ChainStep,
    target: str,
    position: int,
    bounded: ChainStep,
    made: int,
) -> RoutePlan:
    extra: dict[str, Any] = {"exhausted": True, "bounded_step": bounded.name, "visits": made}
    choice = step.on_exhausted
    if choice in (END, ASK):
        return RoutePlan(**base, target=target, applied=choice, next_task_id=None, **extra)
    if choice == FAIL:
        error = TypedError(
            code="loop_exhausted",
            message=f"step {step.name} (task {base['task_id']}) routed {base['route_on']} = "
            f"{base['value']!r} back to {target}, but step {bounded.name} has had {made} visits "
            f"(max_visits {bounded.max_visits}); on_exhausted is fail",
        )
        return RoutePlan(**base, target=target, applied=FAIL, next_task_id=None, error=error, **extra)
    return _forward(head, base, target, choice, position, **extra)


# --------------------------------------------------------------------------------------------
# The fold of a route_decided fact


def new_instance(step: ChainStep, visit: int, sent_back_by: str) -> tuple[TaskState, list[GateState]]:
    """A later visit of ``step`` (with its own gates), created by the route of ``sent_back_by``."""
    task_id = instance_id(step.name, visit)
    task = TaskState(
        task_id=task_id, specialist=step.specialist, step=step.name, visit=visit, sent_back_by=sent_back_by
    )
    return task, instance_gates(step, task_id)


def instance_gates(step: ChainStep, task_id: str) -> list[GateState]:
    gates: list[GateState] = []
    if step.approve_before:
        gates.append(GateState(gate_id=gate_id_for("before", task_id), task_id=task_id, position="before"))
    if step.approve_after:
        gates.append(GateState(gate_id=gate_id_for("after", task_id), task_id=task_id, position="after"))
    return gates


@dataclass(frozen=True, slots=True)
class RouteEffect:
    """What folding a route changes: the tasks and gates, and whether the run ends (with what)."""

    tasks: tuple[TaskState, ...]
    gates: tuple[GateState, ...]
    ends: str | None = None  # "completed" or "failed"


def route_effect(
    head: RunHead, task_id: str, applied: str, next_task_id: str | None, at: datetime
) -> RouteEffect:
    """The tasks and gates after the route of ``task_id`` did ``applied``. Raises ``ValueError``
    for a route that cannot happen on this head (the fold turns it into IllegalTransition)."""
    chain = head.chain
    position = _position(head, task_id)
    router = head.tasks[position]
    tasks = list(head.tasks)
    gates = list(head.gates)
    tasks[position] = router.model_copy(update={"routed_to": next_task_id or applied})
    if applied in (END, FAIL):
        for i, t in enumerate(tasks):
            if not t.status.is_terminal:
                # A parallel branch still at work when the run ends is cancelled, not skipped.
                closed = TaskStatus.SKIPPED if t.status == TaskStatus.PENDING else TaskStatus.CANCELLED
                tasks[i] = t.model_copy(update={"status": closed, "finished_at": at})
        return RouteEffect(tuple(tasks), tuple(gates), "completed" if applied == END else "failed")
    if applied == ASK:
        gate_id = gate_id_for("exhausted", task_id)
        gates.append(GateState(gate_id=gate_id, task_id=task_id, position="exhausted"))
        return RouteEffect(tuple(tasks), tuple(gates))
    if is_parallel(chain) and not goes_back(chain, router.step_name, applied):
        # A jump forward skips the steps between the router and the target.
        upcoming = latest(head, applied)
        if upcoming is None or upcoming.task_id != next_task_id or upcoming.status != TaskStatus.PENDING:
            raise ValueError(f"no pending task {next_task_id} of step {applied} to go on with")
        order = {t.task_id: i for i, t in enumerate(tasks)}
        for name in jumped(chain, router.step_name, applied):
            skipped = latest(head, name)
            if skipped is None:  # pragma: no cover - every step has an instance
                continue
            if skipped.status != TaskStatus.PENDING:
                raise ValueError(f"task {skipped.task_id} is {skipped.status.value}; a route cannot skip it")
            tasks[order[skipped.task_id]] = skipped.model_copy(
                update={"status": TaskStatus.SKIPPED, "finished_at": at}
            )
        return RouteEffect(tuple(tasks), tuple(gates))
    if not goes_back(chain, router.step_name, applied):
        for i in range(position + 1, len(tasks)):
            t = tasks[i]
            if t.task_id == next_task_id:
                break
            if t.status != TaskStatus.PENDING:
                raise ValueError(f"task {t.task_id} is {t.status.value}; a route cannot skip it")
            tasks[i] = t.model_copy(update={"status": TaskStatus.SKIPPED, "finished_at": at})
        else:
            raise ValueError(f"no pending task {next_task_id} follows {task_id}")
        return RouteEffect(tuple(tasks), tuple(gates))
    body: list[TaskState] = []
    for step in _body(chain, applied, router.step_name):
        instance, instance_gates_ = new_instance(step, visits(head, step.name) + 1, task_id)
        body.append(instance)
        gates.extend(instance_gates_)
    if body[0].task_id != next_task_id:
        raise ValueError(f"the route of {task_id} creates {body[0].task_id}, not {next_task_id}")
    tasks[position + 1 : position + 1] = body
    return RouteEffect(tuple(tasks), tuple(gates))


# --------------------------------------------------------------------------------------------
# Revise: a loop a gate's decision asks for


@dataclass(frozen=True, slots=True)
class RevisePlan:
    """What a ``revise`` of a gate re-runs (the rule: docs/approvals.md): the task whose output the
    gate shows (``revision_of``), the steps that get new instances (the first is re-run), and
    whether the gated task itself is skipped (a ``before`` gate)."""

    gate_id: str
    revision_of: str
    body: tuple[str, ...]
    skip_gated: bool


@dataclass(frozen=True, slots=True)
class NoRevise:
    """Why a gate cannot be revised: ``reason`` (a sentence); ``bound``: because a step's
    ``max_visits`` was reached (the gate has a step to re-run, just no visit left)."""

    reason: str
    bound: bool = False


def revise_plan(head: RunHead, gate: GateState) -> RevisePlan | NoRevise:
    """The plan of a ``revise`` of ``gate``, or why the gate cannot be revised. Pure."""
    chain = head.chain
    if gate.position == "budget":
        return NoRevise("a budget gate raises the budget (approve) or ends the run (reject), not revised")
    if gate.position == "question":
        return NoRevise("a question gate sends its answer (approve with comment) or declines (reject)")
    if gate.position == "exhausted":
        return NoRevise(
            "an exhausted gate accepts or rejects a loop's work whose bound was reached; it cannot be revised"
        )
    gated = next((t for t in head.tasks if t.task_id == gate.task_id), None)
    if gated is None:
        return NoRevise(f"gate {gate.gate_id} has no task")
    step = chain.step(gated.step_name)
    if gate.position == "after":
        shown: TaskState | None = gated
        body = [step]
    else:
        preds = predecessors(chain, step.name)
        if len(preds) != 1:
            said = "it is the chain's first step" if not preds else f"it runs after {len(preds)} steps"
            return NoRevise(
                f"gate {gate.gate_id} is before step {step.name}, which has no single step before it "
                f"({said}): no output to send back"
            )
        shown = latest(head, preds[0])
        body = _body(chain, preds[0], step.name)
    if shown is None or shown.status != TaskStatus.DONE:
        return NoRevise(f"gate {gate.gate_id} shows no output to send back (the step before it did not run)")
    for body_step in body:
        made = visits(head, body_step.name)
        if made >= body_step.max_visits:
            return NoRevise(
                f"revise would run step {body_step.name} again, but it has had {made} visits "
                f"(max_visits {body_step.max_visits}): the loop is exhausted; approve or reject the "
                "gate instead",
                bound=True,
            )
    return RevisePlan(gate.gate_id, shown.task_id, tuple(s.name for s in body), gate.position == "before")


def revise_offered(head: RunHead, gate: GateState) -> bool:
    """Whether a requested ``gate`` can be revised now (its step has output to send back and the
    bounds allow another visit)."""
    return isinstance(revise_plan(head, gate), RevisePlan)


def revise_effect(head: RunHead, plan: RevisePlan, at: datetime) -> RouteEffect:
    """The tasks and gates after a ``revise`` made ``plan``: the new instances inserted right after
    the gated task (skipped for a ``before`` gate)."""
    gate = head.gate(plan.gate_id)
    if gate is None:  # pragma: no cover - the plan was made from this head
        raise ValueError(f"no gate {plan.gate_id}")
    position = _position(head, gate.task_id)
    tasks = list(head.tasks)
    gates = list(head.gates)
    if plan.skip_gated:
        gated = tasks[position]
        if gated.status != TaskStatus.PENDING:
            raise ValueError(f"task {gated.task_id} is {gated.status.value}; a revise cannot skip it")
        tasks[position] = gated.model_copy(update={"status": TaskStatus.SKIPPED, "finished_at": at})
    body: list[TaskState] = []
    for name in plan.body:
        step = head.chain.step(name)
        visit = visits(head, name) + 1
        task_id = instance_id(name, visit)
        first = not body
        body.append(
            TaskState(
                task_id=task_id,
                specialist=step.specialist,
                step=name,
                visit=visit,
                revised_by=plan.gate_id if first else None,
                revision_of=plan.revision_of if first else None,
            )
        )
        gates.extend(instance_gates(step, task_id))
    tasks[position + 1 : position + 1] = body
    return RouteEffect(tuple(tasks), tuple(gates))


# --------------------------------------------------------------------------------------------
# Checks made when a chain is loaded


def routing_note(step: ChainStep) -> str | None:
    """One sentence for a routing step's prompt: what each value of its field does."""
    if step.route_on is None or not step.routes:
        return None
    said = []
    for value, target in step.routes.items():
        where = {END: "ends the run", FAIL: "fails the run"}.get(target, f"sends the work to {target}")
        said.append(f"{value!r} {where}")
    return f"Your answer's {step.route_on!r} decides where the run goes: " + "; ".join(said) + "."


__all__ = [
    "ASK",
    "END",
    "FAIL",
    "NoRevise",
    "RevisePlan",
    "RouteEffect",
    "RoutePlan",
    "chain_format",
    "plan_route",
    "revise_effect",
    "revise_offered",
    "revise_plan",
    "route_effect",
    "route_value_of",
    "routing_note",
    "visits",
]

"""The pure decision (DESIGN §1): what a run does next, from its head and ``now`` alone.

No I/O, no randomness: so a restarted run makes the same next decision the crashed run would have
made (``tests/unit/engine/test_crash_prefixes.py`` checks it for every prefix of full runs' logs).
:func:`next_actions` gives every ready task's action in run order; :func:`next_action` is its
first. Pauses (``Await*``, ``WaitUntil``) and ``Idle`` end a drive; the drive acts on the others.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Literal

from orchestration.core.agent_steps import agent_attempt
from orchestration.core.budget import (
    BUDGET_EXHAUSTED,
    fails_run,
    next_budget_gate_id,
    open_budget_gate,
    refusal,
)
from orchestration.core.costs import BudgetAsk
from orchestration.core.graph import awaits_agent, is_parallel, parked_question, preds_settled
from orchestration.core.models import ChainStep, RunHead, TaskState, TypedError, gate_id_for, step_map
from orchestration.core.routing import ASK, RoutePlan, plan_route
from orchestration.core.settled_prefix import passed_prefix
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.core.wake import task_deadline


@dataclass(frozen=True, slots=True)
class RequestApproval:
    gate_id: str


@dataclass(frozen=True, slots=True)
class AwaitApproval:
    gate_id: str


@dataclass(frozen=True, slots=True)
class ExpireGate:
    """The requested gate ``gate_id`` expired undecided: record its step's ``on_expiry`` as the
    decision (an ``approval_decided`` fact with channel ``expiry``)."""

    gate_id: str
    decision: Literal["approve", "reject", "fail"]


@dataclass(frozen=True, slots=True)
class PrepareHostTask:
    task_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class AwaitHost:
    task_id: str


@dataclass(frozen=True, slots=True)
class StartAttempt:
    """Call the provider for ``task_id`` (attempt ``attempt``)."""

    task_id: str
    attempt: int
    possible_duplicate_call: bool = False
    #: an agent step: the earlier attempt whose remote call this one follows, and that call's
    #: remote run when it was recorded (see :func:`orchestration.core.agent_steps.agent_attempt`)
    follows: int | None = None
    remote_run_id: str | None = None


@dataclass(frozen=True, slots=True)
class StartChild:
    """Start the child run of ``task_id``, a step that runs a chain: record ``child_started``
    (with ``child_run_id``, derived from the run and the task instance), then create the child
    (:mod:`orchestration.engine.children`)."""

    task_id: str
    child_run_id: str
    chain: str


@dataclass(frozen=True, slots=True)
class AwaitChild:
    """The child run ``child_run_id`` of ``task_id`` works; its end is recorded on this run."""

    task_id: str
    child_run_id: str


@dataclass(frozen=True, slots=True)
class AwaitAgent:
    """The remote run ``remote_run_id`` of ``task_id``'s attempt ``attempt`` works at its agent,
    followed outside any drive (:mod:`orchestration.engine.agent_waits`); its end is recorded on
    this run."""

    task_id: str
    attempt: int
    remote_run_id: str


@dataclass(frozen=True, slots=True)
class FailTask:
    task_id: str
    error: TypedError


@dataclass(frozen=True, slots=True)
class RouteTask:
    """Record where the done routing task ``plan.task_id`` sends the run (a ``route_decided``
    fact carrying ``plan``)."""

    plan: RoutePlan


@dataclass(frozen=True, slots=True)
class RequestBudget:
    """The budget does not allow ``ask.task_id``'s call (``on_budget = "ask"``): request the
    budget gate ``gate_id`` (an ``approval_requested`` fact carrying ``ask``)."""

    task_id: str
    gate_id: str
    ask: BudgetAsk


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """A durable wait: nothing to do before ``not_before``."""

    not_before: datetime


@dataclass(frozen=True, slots=True)
class FinishRun:
    status: Literal["completed", "completed_with_failures", "failed"]
    error: TypedError | None = None


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to do: the run is terminal."""

    status: RunStatus


Action = (
    RequestApproval
    | AwaitApproval
    | ExpireGate
    | PrepareHostTask
    | AwaitHost
    | StartAttempt
    | FailTask
    | StartChild
    | AwaitChild
    | AwaitAgent
    | RouteTask
    | RequestBudget
    | WaitUntil
    | FinishRun
    | Idle
)

PAUSING_ACTIONS = (AwaitApproval, AwaitHost, AwaitChild, AwaitAgent, WaitUntil, Idle)


def _gate_action(head: RunHead, gate_id: str, now: datetime) -> Action | None:
    gate = head.gate(gate_id)
    if gate is None or gate.status in ("approved", "revised"):
        # A revised gate's task is superseded by the instances its revise created, which follow.
        return None
    if gate.status == "pending":
        return RequestApproval(gate_id)
    if gate.expires_at is not None and now >= gate.expires_at:
        return ExpireGate(gate_id, head.step_of(gate.task_id).on_expiry)
    # "requested" (a "rejected" or "failed" gate makes the run terminal, handled before we get here)
    return AwaitApproval(gate_id)


def _revised(head: RunHead, task: TaskState) -> bool:
    """Whether ``task``'s output was sent back at its ``after`` gate (it routes nowhere: the new
    instance its revise created does)."""
    gate = head.gate(gate_id_for("after", task.task_id))
    return gate is not None and gate.status == "revised"


def _provider_action(head: RunHead, task: TaskState, now: datetime) -> Action:
    max_attempts = head.contract.max_attempts
    made = len(task.attempts)
    if task.status == TaskStatus.RUNNING:
        # The attempt in flight belongs to a worker that died (we hold the lease now): an orphan.
        if made >= max_attempts:
            return FailTask(
                task.task_id,
                TypedError(
                    code="attempts_exhausted",
                    message=f"the worker died during attempt {made} of {max_attempts}",
                ),
            )
        return StartAttempt(task.task_id, made + 1, possible_duplicate_call=True)
    if made == 0:
        return StartAttempt(task.task_id, 1)
    last = task.attempts[-1]
    error = last.error or TypedError(code="unknown", message="the attempt failed")
    if not error.retryable:
        return FailTask(task.task_id, error)
    if made >= max_attempts:
        return FailTask(
            task.task_id,
            TypedError(
                code="attempts_exhausted",
                message=f"{made} of {max_attempts} attempts failed; the last with {error.code}: "
                f"{error.message}",
                http_status=error.http_status,
                provider_request_id=error.provider_request_id,
            ),
        )
    if head.not_before is not None and head.not_before > now:
        return WaitUntil(head.not_before)
    return StartAttempt(task.task_id, made + 1)


def next_action(head: RunHead, now: datetime) -> Action:
    """The next thing to do for this run (the first of :func:`next_actions`). Pure."""
    if is_parallel(head.chain):
        return next_actions(head, now)[0]
    return _linear_action(head, now)


def next_actions(head: RunHead, now: datetime) -> tuple[Action, ...]:
    """Every next thing to do for this run, one per ready task or gate, in run order (at least
    one). Pure."""
    if not is_parallel(head.chain):
        return (_linear_action(head, now),)
    if head.status.is_terminal or (head.deadline_at is not None and now >= head.deadline_at):
        return (_linear_action(head, now),)
    failed = [t for t in head.tasks if t.status == TaskStatus.FAILED]
    for task in failed:
        if head.chain.step(task.step_name).on_failure == "fail" or fails_run(task):
            return (FinishRun("failed", task.error),)
    any_failed = bool(failed)
    actions: list[Action] = []
    for task in head.tasks:
        step = head.chain.step(task.step_name)
        if task.status == TaskStatus.FAILED:
            continue
        if task.status.is_terminal:
            done = _done_action(head, task, step, now, any_failed)
            if done is not None:
                actions.append(done)
            continue
        if not preds_settled(head, task):
            continue
        action = _task_action(head, task, now)
        if action is not None:
            actions.append(action)
    finish = next((a for a in actions if isinstance(a, FinishRun)), None)
    if finish is not None:
        # A loop's work accepted at its gate ends the run, whatever else was still to do.
        return (finish,)
    if not actions:
        return (FinishRun("completed_with_failures" if any_failed else "completed"),)
    return _bound_children(head, actions)


def _done_action(
    head: RunHead, task: TaskState, step: ChainStep, now: datetime, any_failed: bool
) -> Action | None:
    """What a terminal task still asks for, in a linear and a parallel run alike: a done task's
    ``approve_after`` gate while it is open, then its route (planned once; a loop out of visits asks
    at its ``exhausted`` gate, whose approval accepts the work as it is and ends the run). None:
    nothing (the walk goes past the task)."""
    if task.status != TaskStatus.DONE:
        return None
    if step.approve_after:
        action = _gate_action(head, gate_id_for("after", task.task_id), now)
        if action is not None:
            return action
    if step.route_on is None or _revised(head, task):
        return None
    if task.routed_to is None:
        return RouteTask(plan_route(head, task))
    if task.routed_to == ASK:
        action = _gate_action(head, gate_id_for("exhausted", task.task_id), now)
        accepted = FinishRun("completed_with_failures" if any_failed else "completed")
        return action if action is not None else accepted
    return None


def _live_children(head: RunHead) -> int:
    """How many of the run's child runs have not ended."""
    return sum(c.status == "active" for t in head.tasks for c in t.children or ())


def _bound_children(head: RunHead, actions: list[Action]) -> tuple[Action, ...]:
    """Several steps of a parallel run may start child runs at once: those that would go over the
    chain's ``max_children`` (counting the live ones and the earlier starts) fail, as in a
    linear run (:func:`_child_action`)."""
    limit = head.chain.max_children
    if limit is None:
        return tuple(actions)
    live = _live_children(head)
    out: list[Action] = []
    for action in actions:
        if isinstance(action, StartChild):
            if live >= limit:
                action = FailTask(action.task_id, _too_many(head, live, limit))
            else:
                live += 1
        out.append(action)
    return tuple(out)


def _too_many(head: RunHead, live: int, limit: int) -> TypedError:
    return TypedError(
        code="too_many_children",
        message=f"run {head.run_id} has {live} live child runs; its chain allows {limit} (max_children)",
    )


def _task_action(head: RunHead, task: TaskState, now: datetime) -> Action | None:
    """The action of a ready task that is not terminal: of each ready task of a parallel chain, and
    of the first such task of a linear one (None: it waits for the budget reservations of calls
    in flight, in a parallel run)."""
    step = head.chain.step(task.step_name)
    if step.approve_before:
        action = _gate_action(head, gate_id_for("before", task.task_id), now)
        if action is not None:
            return action
    deadline = task_deadline(head, task)
    if deadline is not None and now >= deadline:
        return FailTask(
            task.task_id,
            TypedError(
                code="deadline_exceeded",
                message=f"task {task.task_id} ran past its limit of {step.timeout_seconds} s",
            ),
        )
    if step.chain is not None:
        return _child_action(head, task, step.chain)
    question = parked_question(task)
    if question is not None:
        # A remote A2A task's question: a gate of this run, decided by a person (no expiry).
        return _gate_action(head, question, now)
    if awaits_agent(task):
        last = task.attempts[-1]
        assert last.remote_run_id is not None
        return AwaitAgent(task.task_id, last.number, last.remote_run_id)
    if task.status == TaskStatus.AWAITING_HOST:
        return AwaitHost(task.task_id)
    if head.contract.worker_backend == "inline" and step.agent is None:
        return _budgeted(head, task, PrepareHostTask(task.task_id, len(task.attempts) + 1), now)
    if not task.attempts and head.not_before is not None and head.not_before > now:
        # A provider asked the run to wait (retry-after): its first calls wait too.
        return WaitUntil(head.not_before)
    action = _provider_action(head, task, now)
    if step.agent is not None and isinstance(action, StartAttempt):
        # An agent step's attempt may follow an earlier attempt's remote call instead of calling
        # (an agent's call is not priced: budgets bound model calls).
        follows, remote_run_id, duplicate = agent_attempt(step.agent, task)
        return StartAttempt(action.task_id, action.attempt, duplicate, follows, remote_run_id)
    return _budgeted(head, task, action, now)


def _budgeted(head: RunHead, task: TaskState, action: Action, now: datetime) -> Action | None:
    """``action``, or what the budget says instead when it is a call the budget does not allow
    (see :mod:`orchestration.core.budget`)."""
    if not isinstance(action, (StartAttempt, PrepareHostTask)):
        return action
    gate = open_budget_gate(head, task.task_id)
    if gate is not None:
        # A requested budget gate is decided by a human (or its expiry), even if another gate's
        # raise let the call fit meanwhile.
        return _gate_action(head, gate.gate_id, now)
    refused = refusal(head, task)
    if refused is None:
        return action
    if refused.wait:
        return None
    costs = head.contract.costs
    if costs is None or costs.budget is None or costs.budget.on_budget == "fail":
        return FailTask(task.task_id, TypedError(code=BUDGET_EXHAUSTED, message=refused.message))
    ask = BudgetAsk(task_id=task.task_id, step=refused.step, note=refused.message)
    return RequestBudget(task.task_id, next_budget_gate_id(head), ask)


def child_run_id(run_id: str, task_id: str) -> str:
    """The run id of the child run of task instance ``task_id`` of run ``run_id``: derived from
    both (not from an attempt), so a restarted parent names the same child."""
    digest = hashlib.sha256(f"{run_id}/{task_id}".encode()).hexdigest()[:32]
    return f"child-{digest}"


def _child_action(head: RunHead, task: TaskState, chain: str) -> Action:
    """A step that runs a chain: start its child (unless that would go deeper than the chain's
    ``max_depth``), or wait for it."""
    if task.status == TaskStatus.RUNNING and task.children:
        return AwaitChild(task.task_id, task.children[-1].run_id)
    depth = (head.parent.depth if head.parent is not None else 0) + 1
    if depth > head.chain.max_depth:
        return FailTask(
            task.task_id,
            TypedError(
                code="child_depth_exceeded",
                message=f"task {task.task_id} would start a child run at depth {depth}; chain "
                f"{head.chain.name!r} allows {head.chain.max_depth} (max_depth)",
            ),
        )
    limit = head.chain.max_children
    live = _live_children(head)
    if limit is not None and live >= limit:
        return FailTask(task.task_id, _too_many(head, live, limit))
    return StartChild(task.task_id, child_run_id(head.run_id, task.task_id), chain)


def _linear_action(head: RunHead, now: datetime) -> Action:
    if head.status.is_terminal:
        return Idle(head.status)
    if head.deadline_at is not None and now >= head.deadline_at:
        error = TypedError(
            code="deadline_exceeded",
            message=f"the run's deadline ({head.deadline_at.isoformat()}) passed",
        )
        for task in head.tasks:
            if task.status in (TaskStatus.RUNNING, TaskStatus.AWAITING_HOST):
                return FailTask(task.task_id, error)
        return FinishRun("failed", error)
    # The first tasks the walk below goes past whatever the gates and the time are (done without
    # a gate or a route, failed without failing the run, skipped): see orchestration.core.settled_prefix.
    start, any_failed = passed_prefix(head)
    steps = step_map(head.chain)
    for task in islice(head.tasks, start, None):
        step = steps[task.step_name]
        if task.status.is_terminal:
            if task.status == TaskStatus.FAILED:
                if step.on_failure == "fail" or fails_run(task):
                    return FinishRun("failed", task.error)
                any_failed = True
                continue
            done = _done_action(head, task, step, now, any_failed)
            if done is not None:
                return done
            continue
        # The first task that is not terminal decides, as one ready task of a parallel chain does
        # (a linear run's head never holds a durable wait for a task without attempts, nor a call
        # in flight besides this task's: it never waits for budget reservations).
        action = _task_action(head, task, now)
        assert action is not None
        return action
    return FinishRun("completed_with_failures" if any_failed else "completed")

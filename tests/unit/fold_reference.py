"""The fold as it was before issue 11's fast path (``model_copy`` for every change, a pass over the
tasks for each lookup, settlement and deadline): a frozen copy of ``orchestration/core/fold.py`` at
2cb0461, only this docstring changed. ``test_fold_equivalence.py`` checks that the
fold gives the same heads (values, fields set, stored text) and the same errors, fact by fact. When
the fold's *rules* change, change them here too, or delete this module and that test."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from operator import attrgetter

from orchestration.core.budget import charge, charge_unmetered, priced, raise_budget
from orchestration.core.facts import (
    ApprovalDecided,
    ApprovalRequested,
    AttemptFailed,
    AttemptStarted,
    ChainUpgraded,
    ChildEnded,
    ChildStarted,
    Fact,
    HostOutputSubmitted,
    HostTaskPrepared,
    PushConfigDeleted,
    PushConfigured,
    RemoteRunStarted,
    RouteDecided,
    RunCancelled,
    RunCreated,
    RunFinished,
    TaskCompleted,
    TaskFailed,
)
from orchestration.core.graph import is_parallel, summary_status
from orchestration.core.models import (
    GATE_STATUS_OF,
    AttemptRecord,
    ChildRef,
    GateState,
    RunHead,
    TaskState,
    Telemetry,
    TypedError,
    gate_id_for,
)
from orchestration.core.routing import RevisePlan, revise_effect, revise_plan, route_effect, route_value_of
from orchestration.core.upgrades import upgrade_effect
from orchestration.core.vocabulary import (
    RunStatus,
    TaskStatus,
    check_run_transition,
    check_task_transition,
)
from orchestration.errors import IllegalTransition


def head_from_creation(fact: RunCreated) -> RunHead:
    """The head a run has right after its ``run_created`` fact (version 1)."""
    tasks = tuple(TaskState(task_id=s.name, specialist=s.specialist) for s in fact.chain.steps)
    gates: list[GateState] = []
    for step in fact.chain.steps:
        if step.approve_before:
            gates.append(
                GateState(gate_id=gate_id_for("before", step.name), task_id=step.name, position="before")
            )
        if step.approve_after:
            gates.append(
                GateState(gate_id=gate_id_for("after", step.name), task_id=step.name, position="after")
            )
    return RunHead(
        run_id=fact.run_id,
        version=1,
        last_seq=fact.seq,
        status=RunStatus.QUEUED,
        request=fact.request,
        chain=fact.chain,
        chain_hash=fact.chain_hash,
        contract=fact.contract,
        idempotency_key=fact.idempotency_key,
        request_hash=fact.request_hash,
        started_by=fact.started_by,
        traceparent=fact.traceparent,
        parent=fact.parent,
        delegation=fact.delegation,
        tasks=tasks,
        gates=tuple(gates),
        deadline_at=fact.deadline_at,
        wake_at=fact.deadline_at,
        created_at=fact.at,
        updated_at=fact.at,
        format=fact.format,
    )


def _with_status(head: RunHead, status: RunStatus) -> dict[str, object]:
    if is_parallel(head.chain):
        # A run of a parallel chain has several branches: its status is their summary, set once
        # the fact is folded (see ``apply``), not a move of one line of work. Its end is still
        # checked, but a gate may be rejected whatever else waits.
        if status.is_terminal and status != RunStatus.REJECTED:
            check_run_transition(head.status, status)
        return {"status": status}
    check_run_transition(head.status, status)
    return {"status": status}


def _not_before(head: RunHead, at: datetime, new: datetime | None = None) -> datetime | None:
    """The run's ``not_before`` after a fact recorded ``at`` that sets ``new`` (None: clears it).
    In a parallel chain a provider's wait holds the run's other calls too, so a sibling's fact
    does not clear it before its time and a shorter wait does not replace a longer one."""
    if not is_parallel(head.chain):
        return new
    kept = head.not_before if head.not_before is not None and head.not_before > at else None
    if kept is None or (new is not None and new > kept):
        return new
    return kept


_TASK_ID = attrgetter("task_id")


def _replace_task(head: RunHead, task: TaskState) -> tuple[TaskState, ...]:
    tasks = head.tasks
    ids = list(map(_TASK_ID, tasks))
    if task.task_id not in ids:
        return tasks
    index = ids.index(task.task_id)
    return (*tasks[:index], task, *tasks[index + 1 :])


def _task_update(head: RunHead, task_id: str, status: TaskStatus, **changes: object) -> tuple[TaskState, ...]:
    try:
        task = head.task(task_id)
    except KeyError:
        raise IllegalTransition(f"run {head.run_id} has no task {task_id!r}") from None
    check_task_transition(task.status, status)
    return _replace_task(head, task.model_copy(update={"status": status, **changes}))


def _replace_attempt(task: TaskState, attempt: int, **changes: object) -> tuple[AttemptRecord, ...]:
    return tuple(a.model_copy(update=changes) if a.number == attempt else a for a in task.attempts)


def _close_open_tasks(head: RunHead, status: TaskStatus, at: datetime) -> tuple[TaskState, ...]:
    out = []
    for task in head.tasks:
        if task.status.is_terminal:
            out.append(task)
        else:
            closed = status
            if status == TaskStatus.SKIPPED and task.status != TaskStatus.PENDING:
                # A parallel branch still at work when the run ends (a sibling failed) is cancelled.
                closed = TaskStatus.CANCELLED
            check_task_transition(task.status, closed)
            out.append(task.model_copy(update={"status": closed, "finished_at": at}))
    return tuple(out)


def _settle_finished(before: tuple[TaskState, ...], after: tuple[TaskState, ...]) -> tuple[TaskState, ...]:
    """``after`` with every task that this fact made terminal settled (see ``TaskState.settled``).
    Tasks are matched by id: a route may insert new instances."""
    # A task that is the same object as before (task ids are unique) was not changed by this fact;
    # the few that are new are found without a Python loop over every task of the run.
    ids = list(map(id, after))
    fresh = set(ids).difference(map(id, before))
    if not fresh:
        return after
    out = list(after)
    for key in fresh:
        index = ids.index(key)
        if out[index].status.is_terminal:
            out[index] = out[index].settled()
    return tuple(out)


def apply(head: RunHead | None, fact: Fact, *, keep_history: bool = False) -> RunHead:
    """Fold one fact into ``head``. Pure; raises IllegalTransition for a fact that cannot happen.

    Tasks that become terminal are settled (their attempts, executor, hashes and times dropped from
    the head) unless ``keep_history``: the head a store keeps does not grow with finished tasks, and
    views fold the full history back with :func:`with_history`."""
    if head is None:
        if not isinstance(fact, RunCreated):
            raise IllegalTransition(f"the first fact of a run must be run_created, not {fact.type}")
        return head_from_creation(fact)
    if isinstance(fact, RunCreated):
        raise IllegalTransition(f"run {head.run_id} already exists")
    if head.status.is_terminal:
        raise IllegalTransition(
            f"run {head.run_id} is {head.status.value}: nothing can be appended after a terminal fact"
        )
    if fact.seq != head.last_seq + 1:
        raise IllegalTransition(f"fact seq {fact.seq} does not follow {head.last_seq} in run {head.run_id}")
    update: dict[str, object] = {"last_seq": fact.seq, "updated_at": fact.at}
    if fact.format > head.format:
        # A head that folds a newer fact is no longer readable by a reader that would not know it.
        update["format"] = fact.format

    if isinstance(fact, ApprovalRequested):
        gate = head.gate(fact.gate_id)
        gates = head.gates
        if gate is None and fact.budget is not None:
            # A budget gate exists from its request on (see orchestration.core.budget).
            gate = GateState(
                gate_id=fact.gate_id,
                task_id=fact.budget.task_id,
                position="budget",
                budget_step=fact.budget.step,
                note=fact.budget.note,
            )
            gates = (*gates, gate)
        if gate is None or gate.status != "pending":
            raise IllegalTransition(f"gate {fact.gate_id} cannot be requested")
        expiry = head.step_of(gate.task_id).expires_after_seconds
        expires_at = None if expiry is None else fact.at + timedelta(seconds=expiry)
        new_gate = gate.model_copy(
            update={"status": "requested", "requested_at": fact.at, "expires_at": expires_at}
        )
        update["gates"] = tuple(new_gate if g.gate_id == gate.gate_id else g for g in gates)
        update |= _with_status(head, RunStatus.AWAITING_APPROVAL)
    elif isinstance(fact, ApprovalDecided):
        update |= _decide_gate(head, fact)
    elif isinstance(fact, HostTaskPrepared):
        task = head.task(fact.task_id)
        attempt = AttemptRecord(
            number=fact.attempt, executor=fact.executor, started_at=fact.at, outcome="prepared"
        )
        update["tasks"] = _task_update(
            head,
            fact.task_id,
            TaskStatus.AWAITING_HOST,
            executor=fact.executor,
            attempts=(*task.attempts, attempt),
            prompt_sha256=fact.prompt_sha256,
            started_at=task.started_at or fact.at,
        )
        update |= _with_status(head, RunStatus.AWAITING_HOST)
    elif isinstance(fact, HostOutputSubmitted):
        task = head.task(fact.task_id)
        if task.status != TaskStatus.AWAITING_HOST:
            raise IllegalTransition(f"task {fact.task_id} is not awaiting the host")
        if fact.prompt_read is not None:
            attempts = tuple(
                a.model_copy(update={"prompt_read": fact.prompt_read}) if a.number == fact.attempt else a
                for a in task.attempts
            )
            update["tasks"] = _replace_task(head, task.model_copy(update={"attempts": attempts}))
    elif isinstance(fact, AttemptStarted):
        task = head.task(fact.task_id)
        attempt = AttemptRecord(
            number=fact.attempt,
            executor=fact.executor,
            started_at=fact.at,
            telemetry=Telemetry(possible_duplicate_call=fact.possible_duplicate_call),
            remote_run_id=fact.remote_run_id,
            follows=fact.follows,
        )
        # An orphaned attempt (the process died during it) is closed as failed when the next starts,
        # and charged at its most: the provider may have billed it.
        # (A fork's copies are not charged: the new run spent nothing on them.)
        for orphan in (a for a in task.attempts if a.outcome == "running" and fact.copied_from is None):
            update["spent"] = charge_unmetered(head, task.step_name, orphan.executor)
        attempts = tuple(
            a.model_copy(
                update={
                    "outcome": "failed",
                    "finished_at": fact.at,
                    "error": TypedError(code="orphaned", message="the worker died during this attempt"),
                }
            )
            if a.outcome == "running"
            else a
            for a in task.attempts
        )
        status = TaskStatus.RUNNING
        if task.status == TaskStatus.RUNNING:
            tasks = _replace_task(head, task.model_copy(update={"attempts": (*attempts, attempt)}))
        else:
            tasks = _task_update(
                head,
                fact.task_id,
                status,
                executor=fact.executor,
                attempts=(*attempts, attempt),
                started_at=task.started_at or fact.at,
            )
        update["tasks"] = tasks
        update["not_before"] = _not_before(head, fact.at)
        update |= _with_status(head, RunStatus.RUNNING)
    elif isinstance(fact, RemoteRunStarted):
        task = head.task(fact.task_id)
        last = task.attempts[-1] if task.attempts else None
        if task.status != TaskStatus.RUNNING or last is None or last.number != fact.attempt:
            raise IllegalTransition(f"task {fact.task_id} has no attempt {fact.attempt} in flight")
        attempts = _replace_attempt(task, fact.attempt, remote_run_id=fact.remote_run_id)
        update["tasks"] = _replace_task(head, task.model_copy(update={"attempts": attempts}))
    elif isinstance(fact, AttemptFailed):
        task = head.task(fact.task_id)
        executor = task.executor or head.contract.executor_for(head.chain.step(task.step_name))
        telemetry = priced(head.contract, executor, fact.telemetry)
        if fact.copied_from is None:
            update["spent"] = charge(head, task.step_name, telemetry)
        attempts = _replace_attempt(
            task,
            fact.attempt,
            outcome="failed",
            finished_at=fact.at,
            error=fact.error,
            telemetry=telemetry,
        )
        update["tasks"] = _task_update(head, fact.task_id, TaskStatus.PENDING, attempts=attempts)
        update["not_before"] = _not_before(head, fact.at, fact.not_before)
        update |= _with_status(head, RunStatus.QUEUED)
    elif isinstance(fact, TaskCompleted):
        task = head.task(fact.task_id)
        telemetry = priced(head.contract, fact.executor, fact.telemetry)
        if fact.copied_from is None:
            update["spent"] = charge(head, task.step_name, telemetry)
        attempts = _replace_attempt(
            task, fact.attempt, outcome="succeeded", finished_at=fact.at, telemetry=telemetry
        )
        routed = route_value_of(head.chain.step(task.step_name), fact.value)
        update["tasks"] = _task_update(
            head,
            fact.task_id,
            TaskStatus.DONE,
            executor=fact.executor,
            attempts=attempts,
            output_seq=fact.seq,
            output_chars=len(fact.output),
            output_sha256=fact.output_sha256,
            finished_at=fact.at,
            error=None,
            **({} if routed is None else {"route_value": routed}),
        )
        update["not_before"] = _not_before(head, fact.at)
        update |= _with_status(head, RunStatus.QUEUED)
    elif isinstance(fact, TaskFailed):
        task = head.task(fact.task_id)
        for cut in (a for a in task.attempts if a.outcome == "running" and fact.copied_from is None):
            # A call closed without an outcome (out of time, an orphan) may have been billed.
            update["spent"] = charge_unmetered(head, task.step_name, cut.executor)
        attempts = tuple(
            a.model_copy(update={"outcome": "failed", "finished_at": fact.at, "error": fact.error})
            if a.outcome in ("running", "prepared")
            else a
            for a in task.attempts
        )
        update["tasks"] = _task_update(
            head, fact.task_id, TaskStatus.FAILED, error=fact.error, finished_at=fact.at, attempts=attempts
        )
        update["not_before"] = _not_before(head, fact.at)
        update |= _with_status(head, RunStatus.QUEUED)
    elif isinstance(fact, RouteDecided):
        update |= _route(head, fact)
    elif isinstance(fact, ChildStarted | ChildEnded):
        update |= _child(head, fact)
    elif isinstance(fact, RunCancelled):
        update |= _with_status(head, RunStatus.CANCELLED)
        update["tasks"] = _close_open_tasks(head, TaskStatus.CANCELLED, fact.at)
        update["finished_at"] = fact.at
        update["not_before"] = None
    elif isinstance(fact, RunFinished):
        update |= _with_status(head, RunStatus(fact.status))
        update["error"] = fact.error
        update["finished_at"] = fact.at
        if fact.status == "failed" or any(not t.status.is_terminal for t in head.tasks):
            # A run that completes with tasks not run (an exhausted loop's work accepted at its
            # gate) skips them, as a failed one does.
            update["tasks"] = _close_open_tasks(head, TaskStatus.SKIPPED, fact.at)
    elif isinstance(fact, ChainUpgraded):
        tasks, gates = upgrade_effect(head, fact.chain)
        update |= {"chain": fact.chain, "chain_hash": fact.to_hash, "chain_moved": True}
        update |= {"tasks": tasks, "gates": gates}
        if head.status in (RunStatus.AWAITING_HOST, RunStatus.AWAITING_APPROVAL):
            waits = [
                status
                for status, waiting in (
                    (RunStatus.AWAITING_HOST, any(t.status == TaskStatus.AWAITING_HOST for t in tasks)),
                    (RunStatus.AWAITING_APPROVAL, any(g.status == "requested" for g in gates)),
                )
                if waiting
            ]
            update |= _with_status(head, waits[0] if waits else RunStatus.QUEUED)
    elif isinstance(fact, PushConfigured):
        ids = head.push_configs
        update["push_configs"] = ids if fact.config_id in ids else (*ids, fact.config_id)
    elif isinstance(fact, PushConfigDeleted):
        update["push_configs"] = tuple(i for i in head.push_configs if i != fact.config_id)
    else:  # pragma: no cover - the union is closed
        raise IllegalTransition(f"unknown fact {fact!r}")
    changed = update.get("tasks")
    if not keep_history and isinstance(changed, tuple):
        update["tasks"] = _settle_finished(head.tasks, changed)
    new_head = head.model_copy(update=update)
    if is_parallel(new_head.chain) and not new_head.status.is_terminal:
        new_head = new_head.model_copy(update={"status": summary_status(new_head)})
    wake = wake_at(new_head)
    # Most facts leave it as it was: no copy then.
    return new_head if wake == new_head.wake_at else new_head.model_copy(update={"wake_at": wake})


def _decide_gate(head: RunHead, fact: ApprovalDecided) -> dict[str, object]:
    """The head's changes for an ``approval_decided`` fact: approve goes on, reject ends the run
    ``rejected``, revise re-runs the step whose output the gate shows
    (:func:`~orchestration.core.routing.revise_plan`), fail (expiry with ``on_expiry = "fail"``) fails
    the run with ``approval_expired``."""
    gate = head.gate(fact.gate_id)
    if gate is None or gate.status != "requested":
        raise IllegalTransition(f"gate {fact.gate_id} is not awaiting a decision")
    new_gate = gate.model_copy(
        update={
            "status": GATE_STATUS_OF[fact.decision],
            "decided_at": fact.at,
            "comment": fact.comment,
            "approver": fact.approver,
            "channel": fact.channel,
            "verified": fact.verified,
        }
    )
    gates = tuple(new_gate if g.gate_id == gate.gate_id else g for g in head.gates)
    update: dict[str, object] = {"gates": gates}
    if fact.decision == "approve":
        update |= _with_status(head, RunStatus.QUEUED)
        if gate.position == "budget":
            update["spent"] = raise_budget(head, gate, fact.budget_raise)
    elif fact.decision == "revise":
        plan = revise_plan(head, gate)
        if not isinstance(plan, RevisePlan):
            raise IllegalTransition(
                f"run {head.run_id}: gate {gate.gate_id} cannot be revised: {plan.reason}"
            )
        try:
            effect = revise_effect(head.model_copy(update={"gates": gates}), plan, fact.at)
        except ValueError as exc:
            raise IllegalTransition(f"run {head.run_id}: revise of {gate.gate_id}: {exc}") from None
        update |= {"tasks": effect.tasks, "gates": effect.gates}
        update |= _with_status(head, RunStatus.QUEUED)
    elif fact.decision == "fail":
        update |= _with_status(head, RunStatus.FAILED)
        update["error"] = TypedError(
            code="approval_expired",
            message=f"gate {gate.gate_id} was not decided by {gate.expires_at or fact.at:%Y-%m-%dT%H:%M:%SZ}"
            ' and its step says on_expiry = "fail"',
        )
        update["tasks"] = _close_open_tasks(head, TaskStatus.SKIPPED, fact.at)
        update["finished_at"] = fact.at
    else:
        update |= _with_status(head, RunStatus.REJECTED)
        update["tasks"] = _close_open_tasks(head, TaskStatus.SKIPPED, fact.at)
        update["finished_at"] = fact.at
    return update


def _child(head: RunHead, fact: ChildStarted | ChildEnded) -> dict[str, object]:
    """The head's changes for a child run's link or end (:mod:`orchestration.engine.children`)."""
    try:
        task = head.task(fact.task_id)
    except KeyError:
        raise IllegalTransition(f"run {head.run_id} has no task {fact.task_id!r}") from None
    children = task.children or ()
    if isinstance(fact, ChildEnded):
        ref = next((c for c in children if c.run_id == fact.child_run_id), None)
        if ref is None or ref.status != "active":
            raise IllegalTransition(f"child run {fact.child_run_id} of task {fact.task_id} is not active")
        ended = tuple(c.model_copy(update={"status": fact.status}) if c is ref else c for c in children)
        return {"tasks": _replace_task(head, task.model_copy(update={"children": ended}))}
    if any(c.run_id == fact.child_run_id for c in children):
        raise IllegalTransition(f"child run {fact.child_run_id} is already linked to task {fact.task_id}")
    linked = (*children, ChildRef(run_id=fact.child_run_id, by=fact.by))
    if fact.by == "host":
        if task.status != TaskStatus.AWAITING_HOST:
            raise IllegalTransition(f"task {fact.task_id} is not awaiting the host")
        return {"tasks": _replace_task(head, task.model_copy(update={"children": linked}))}
    attempt = AttemptRecord(
        number=len(task.attempts) + 1, executor=f"child:{fact.child_run_id}", started_at=fact.at
    )
    tasks = _task_update(
        head,
        fact.task_id,
        TaskStatus.RUNNING,
        executor=attempt.executor,
        attempts=(*task.attempts, attempt),
        started_at=task.started_at or fact.at,
        children=linked,
    )
    return {"tasks": tasks} | _with_status(head, RunStatus.AWAITING_CHILDREN)


def _route(head: RunHead, fact: RouteDecided) -> dict[str, object]:
    """The head's changes for a ``route_decided`` fact (the rule: :mod:`orchestration.core.routing`)."""
    try:
        task = head.task(fact.task_id)
    except KeyError:
        raise IllegalTransition(f"run {head.run_id} has no task {fact.task_id!r}") from None
    step = head.chain.step(task.step_name)
    if step.route_on is None or task.status != TaskStatus.DONE or task.routed_to is not None:
        raise IllegalTransition(f"task {fact.task_id} cannot be routed (it is {task.status.value})")
    try:
        effect = route_effect(head, fact.task_id, fact.applied, fact.next_task_id, fact.at)
    except (KeyError, ValueError) as exc:
        raise IllegalTransition(f"run {head.run_id}: route of {fact.task_id}: {exc}") from None
    update: dict[str, object] = {"tasks": effect.tasks, "gates": effect.gates}
    if effect.ends == "completed":
        update |= _with_status(head, RunStatus.COMPLETED)
        update["finished_at"] = fact.at
    elif effect.ends == "failed":
        update |= _with_status(head, RunStatus.FAILED)
        update["error"] = fact.error
        update["finished_at"] = fact.at
    return update


#: the task statuses that have a deadline (see :func:`task_deadline`)
_IN_PROGRESS = frozenset({TaskStatus.RUNNING, TaskStatus.AWAITING_HOST})


def task_deadline(head: RunHead, task: TaskState) -> datetime | None:
    """When the task in progress runs out of time (its step's ``timeout_seconds`` after it started)."""
    if task.status not in _IN_PROGRESS or task.started_at is None:
        return None
    timeout = head.chain.step(task.step_name).timeout_seconds
    return None if timeout is None else task.started_at + timedelta(seconds=timeout)


def time_limit(head: RunHead) -> datetime | None:
    """The earliest deadline of the run: its own, or a task's in progress (past it, the run records
    ``deadline_exceeded`` and takes no more output or decisions)."""
    if head.status.is_terminal:
        return None
    times = [head.deadline_at] + [task_deadline(head, t) for t in head.tasks if t.status in _IN_PROGRESS]
    present = [t for t in times if t is not None]
    return min(present) if present else None


def wake_at(head: RunHead) -> datetime | None:
    """The earliest time that can change the run's next decision without any write: its
    :func:`time_limit`, or a requested gate's expiry."""
    if head.status.is_terminal:
        return None
    times = [time_limit(head)] + [g.expires_at for g in head.gates if g.status == "requested"]
    present = [t for t in times if t is not None]
    return min(present) if present else None


def apply_write(head: RunHead, facts: Sequence[Fact], *, keep_history: bool = False) -> RunHead:
    """Fold the facts of one atomic write into ``head`` and bump its version."""
    if not facts:
        raise ValueError("a write appends at least one fact")
    for fact in facts:
        head = apply(head, fact, keep_history=keep_history)
    return head.model_copy(update={"version": head.version + 1})


def fold(facts: Iterable[Fact], *, keep_history: bool = False) -> RunHead:
    """The head of a run whose whole log is ``facts`` (one fact per write; used by tests and
    recovery tools — a store keeps the head it was given, with the real write count)."""
    head: RunHead | None = None
    for fact in facts:
        head = apply(head, fact, keep_history=keep_history)
    if head is None:
        raise ValueError("an empty log has no head")
    return head


def with_history(head: RunHead, facts: Iterable[Fact]) -> RunHead:
    """``head`` with every task's full history (attempts, executor, hashes, times), folded from the
    run's log ``facts`` up to ``head.last_seq`` (later facts, written since ``head`` was read, are
    ignored). Raises ``ValueError`` when the log does not reach ``head.last_seq``."""
    detailed = fold((f for f in facts if f.seq <= head.last_seq), keep_history=True)
    if detailed.run_id != head.run_id or detailed.last_seq != head.last_seq:
        raise ValueError(
            f"the log of run {head.run_id} ends at fact {detailed.last_seq}, "
            f"not at the head's {head.last_seq}"
        )
    return head.model_copy(update={"tasks": detailed.tasks})

"""The fold: how a run's facts become its head (DESIGN §3). Pure; a fact the vocabulary does not
allow in the head's state raises :class:`~orchestration.errors.IllegalTransition`, so nothing is
ever appended after a terminal fact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from orchestration.core.budget import charge, charge_unmetered, priced, raise_budget
from orchestration.core.facts import (
    AgentAnswerSending,
    AgentAnswerSent,
    AgentQuestionAsked,
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
    RemoteRunCancelled,
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
    ChainSnapshot,
    ChildRef,
    GateState,
    RunHead,
    TaskState,
    Telemetry,
    TypedError,
    built,
    evolve,
    gate_id_for,
    task_position,
)
from orchestration.core.routing import RevisePlan, revise_effect, revise_plan, route_effect, route_value_of
from orchestration.core.upgrades import CannotMove, plan_upgrade, upgrade_effect
from orchestration.core.vocabulary import (
    RunStatus,
    TaskStatus,
    check_run_transition,
    check_task_transition,
)
from orchestration.core.wake import task_deadline as task_deadline
from orchestration.core.wake import time_limit as time_limit
from orchestration.core.wake import wake_at as wake_at
from orchestration.core.wake import wake_of
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


#: an attempt's telemetry when it starts (one record each: records are immutable)
_STARTED_TELEMETRY = {flag: Telemetry(possible_duplicate_call=flag) for flag in (False, True)}


def _task_update(head: RunHead, task: TaskState, status: TaskStatus, **changes: object) -> TaskState:
    """``task`` (of ``head``) moved to ``status`` with ``changes`` (IllegalTransition when its
    status cannot move there)."""
    check_task_transition(task.status, status)
    return evolve(task, {"status": status, **changes})


def _found(head: RunHead, task_id: str) -> TaskState:
    try:
        return head.task(task_id)
    except KeyError:
        raise IllegalTransition(f"run {head.run_id} has no task {task_id!r}") from None


def _replace_attempt(task: TaskState, attempt: int, **changes: object) -> tuple[AttemptRecord, ...]:
    return tuple(evolve(a, changes) if a.number == attempt else a for a in task.attempts)


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
            out.append(evolve(task, {"status": closed, "finished_at": at}))
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
    return _apply(head, fact, keep_history, None)


def _apply(head: RunHead, fact: Fact, keep_history: bool, version: int | None) -> RunHead:
    """:func:`apply` on a head, and the head's new ``version`` when not None (the last fact of a
    write: not one copy of the head per fact). What the fact changes is its handler's
    (:data:`_HANDLERS`); what every fact changes, and settling the tasks it ended, is here."""
    if isinstance(fact, RunCreated):
        raise IllegalTransition(f"run {head.run_id} already exists")
    if head.status.is_terminal:
        raise IllegalTransition(
            f"run {head.run_id} is {head.status.value}: nothing can be appended after a terminal fact"
        )
    if fact.seq != head.last_seq + 1:
        raise IllegalTransition(f"fact seq {fact.seq} does not follow {head.last_seq} in run {head.run_id}")
    handler = _HANDLERS.get(type(fact))
    if handler is None:  # pragma: no cover - the union is closed (test_fold_handlers)
        raise IllegalTransition(f"unknown fact {fact!r}")
    update: dict[str, object] = {"last_seq": fact.seq, "updated_at": fact.at}
    if fact.format > head.format:
        # A head that folds a newer fact is no longer readable by a reader that would not know it.
        update["format"] = fact.format
    changes, changed = handler(head, fact)
    update |= changes
    if changed is not None:
        # Settled here: the only task of the head this fact made anew.
        if not keep_history and changed.status.is_terminal:
            changed = changed.settled()
        update["tasks"] = _put_task_at(head, changed)
    else:
        tasks = update.get("tasks")
        if not keep_history and isinstance(tasks, tuple):
            update["tasks"] = _settle_finished(head.tasks, tasks)
    return _copy_head(head, update, version)


def _put_task_at(head: RunHead, task: TaskState) -> tuple[TaskState, ...]:
    """``head.tasks`` with ``task`` in place of the task with its id (which the head has)."""
    tasks = head.tasks
    index = task_position(head, task.task_id)
    return (*tasks[:index], task, *tasks[index + 1 :])


def _copy_head(head: RunHead, update: dict[str, object], version: int | None) -> RunHead:
    """``head`` with ``update``, the status of a parallel run's branches, its ``wake_at`` when
    that changed, and ``version`` when not None: what ``model_copy`` made in up to four copies
    before (the same values and the same fields set), in one (two for a parallel chain)."""
    chain = cast(ChainSnapshot, update.get("chain", head.chain))
    if is_parallel(chain):
        new_head = evolve(head, update)
        if not new_head.status.is_terminal:
            update["status"] = summary_status(new_head)
    status = cast(RunStatus, update.get("status", head.status))
    if not status.is_terminal or head.wake_at is not None:
        wake = wake_of(
            chain,
            status,
            head.deadline_at,
            update.get("tasks", head.tasks),  # type: ignore[arg-type]
            update.get("gates", head.gates),  # type: ignore[arg-type]
        )
        # Most facts leave it as it was: not set then.
        if wake != head.wake_at:
            update["wake_at"] = wake
    if version is not None:
        update["version"] = version
    return evolve(head, update)


# The handlers: one per fact type after ``run_created``, each the rule of its fact. A handler gives
# the head's changes for its fact, and the one task the fact changes when it changes one task and no
# other (None otherwise: then a changed ``tasks`` is in the changes). It raises IllegalTransition for
# a fact the head cannot take, before anything is changed.

#: a handler's answer: the head's changes, and the one task the fact changes (or None)
_Change = tuple[dict[str, object], TaskState | None]


def _approval_requested(head: RunHead, fact: ApprovalRequested) -> _Change:
    """A gate is asked for a decision; a budget gate exists from its request on
    (:mod:`orchestration.core.budget`)."""
    gate = head.gate(fact.gate_id)
    gates = head.gates
    if gate is None and fact.budget is not None:
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
    new_gate = evolve(gate, {"status": "requested", "requested_at": fact.at, "expires_at": expires_at})
    update: dict[str, object] = {"gates": tuple(new_gate if g.gate_id == gate.gate_id else g for g in gates)}
    update |= _with_status(head, RunStatus.AWAITING_APPROVAL)
    return update, None


def _approval_decided(head: RunHead, fact: ApprovalDecided) -> _Change:
    """Approve goes on, reject ends the run ``rejected``, revise re-runs the step whose output the
    gate shows (:func:`~orchestration.core.routing.revise_plan`), fail (expiry with
    ``on_expiry = "fail"``) fails the run with ``approval_expired``."""
    gate = head.gate(fact.gate_id)
    if gate is None or gate.status != "requested":
        raise IllegalTransition(f"gate {fact.gate_id} is not awaiting a decision")
    new_gate = evolve(
        gate,
        {
            "status": GATE_STATUS_OF[fact.decision],
            "decided_at": fact.at,
            "comment": fact.comment,
            "approver": fact.approver,
            "channel": fact.channel,
            "verified": fact.verified,
        },
    )
    gates = tuple(new_gate if g.gate_id == gate.gate_id else g for g in head.gates)
    update: dict[str, object] = {"gates": gates}
    if gate.position == "question":
        return _question_decided(head, gate, fact, gates)
    if fact.decision == "approve":
        update |= _with_status(head, RunStatus.QUEUED)
        if gate.position == "budget":
            update["spent"] = raise_budget(head, gate, fact.budget_raise)
    elif fact.decision == "revise":
        update |= _revised(head, gate, gates, fact.at)
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
    return update, None


def _question_decided(
    head: RunHead, gate: GateState, fact: ApprovalDecided, gates: tuple[GateState, ...]
) -> _Change:
    """A remote agent's question answered: approve sends the comment back as the next message
    (the remote task is followed again, the answer sent by its follower first); reject fails the
    step with ``agent_input_declined`` (the remote task is cancelled by the write that records it)."""
    task = head.task(gate.task_id)
    last = task.attempts[-1] if task.attempts else None
    if last is None or last.question != gate.gate_id or last.outcome != "running":
        raise IllegalTransition(f"gate {gate.gate_id}: task {gate.task_id} is not parked at this question")
    if fact.decision == "approve":
        attempts = _replace_attempt(task, last.number, waits=True)
        update: dict[str, object] = {"gates": gates} | _with_status(head, RunStatus.AWAITING_AGENT)
        return update, evolve(task, {"attempts": attempts})
    if fact.decision != "reject":
        raise IllegalTransition(f"gate {gate.gate_id} is a question: it takes approve or reject")
    who = f" by {fact.approver}" if fact.approver else ""
    why = f": {fact.comment}" if fact.comment else ""
    error = TypedError(
        code="agent_input_declined",
        message=f"agent {gate.agent}'s question at gate {gate.gate_id} was declined{who}{why}",
    )
    failed = TaskFailed(seq=fact.seq, at=fact.at, task_id=gate.task_id, error=error)
    update, changed = _task_failed(evolve(head, {"gates": gates}), failed)
    return {"gates": gates} | update, changed


def _revised(head: RunHead, gate: GateState, gates: tuple[GateState, ...], at: datetime) -> dict[str, object]:
    """The head's changes for a ``revise`` decision at ``gate`` (``gates``: the head's gates with
    that decision in them)."""
    plan = revise_plan(head, gate)
    if not isinstance(plan, RevisePlan):
        raise IllegalTransition(f"run {head.run_id}: gate {gate.gate_id} cannot be revised: {plan.reason}")
    try:
        effect = revise_effect(evolve(head, {"gates": gates}), plan, at)
    except ValueError as exc:
        raise IllegalTransition(f"run {head.run_id}: revise of {gate.gate_id}: {exc}") from None
    update: dict[str, object] = {"tasks": effect.tasks, "gates": effect.gates}
    update |= _with_status(head, RunStatus.QUEUED)
    return update


def _host_task_prepared(head: RunHead, fact: HostTaskPrepared) -> _Change:
    """A task is handed to the host (the inline path): it waits for the host's output."""
    task = head.task(fact.task_id)
    attempt = AttemptRecord(
        number=fact.attempt, executor=fact.executor, started_at=fact.at, outcome="prepared"
    )
    changed = _task_update(
        head,
        task,
        TaskStatus.AWAITING_HOST,
        executor=fact.executor,
        attempts=(*task.attempts, attempt),
        prompt_sha256=fact.prompt_sha256,
        started_at=task.started_at or fact.at,
    )
    return _with_status(head, RunStatus.AWAITING_HOST), changed


def _host_output_submitted(head: RunHead, fact: HostOutputSubmitted) -> _Change:
    """The host's output arrived: nothing changes until its outcome is recorded, but for how much
    of a prompt handed out in parts the host read, noted on the attempt."""
    task = head.task(fact.task_id)
    if task.status != TaskStatus.AWAITING_HOST:
        raise IllegalTransition(f"task {fact.task_id} is not awaiting the host")
    if fact.prompt_read is None:
        return {}, None
    return {}, evolve(task, {"attempts": _replace_attempt(task, fact.attempt, prompt_read=fact.prompt_read)})


def _attempt_started(head: RunHead, fact: AttemptStarted) -> _Change:
    """A worker call starts. An orphaned attempt (the process died during it) is closed as failed
    when the next starts, and charged at its most: the provider may have billed it. (A fork's
    copies are not charged: the new run spent nothing on them.)"""
    task = head.task(fact.task_id)
    attempt = built(
        AttemptRecord,
        {
            "number": fact.attempt,
            "executor": fact.executor,
            "started_at": fact.at,
            "telemetry": _STARTED_TELEMETRY[fact.possible_duplicate_call],
            "remote_run_id": fact.remote_run_id,
            "follows": fact.follows,
            **({"waits": True} if fact.waits else {}),
        },
    )
    update: dict[str, object] = {}
    attempts = task.attempts
    if any(a.outcome == "running" for a in attempts):
        for orphan in (a for a in attempts if a.outcome == "running" and fact.copied_from is None):
            update["spent"] = charge_unmetered(head, task.step_name, orphan.executor)
        orphaned = {
            "outcome": "failed",
            "finished_at": fact.at,
            "error": TypedError(code="orphaned", message="the worker died during this attempt"),
        }
        attempts = tuple(evolve(a, orphaned) if a.outcome == "running" else a for a in attempts)
    if task.status == TaskStatus.RUNNING:
        changed = evolve(task, {"attempts": (*attempts, attempt)})
    else:
        changed = _task_update(
            head,
            task,
            TaskStatus.RUNNING,
            executor=fact.executor,
            attempts=(*attempts, attempt),
            started_at=task.started_at or fact.at,
        )
    update["not_before"] = _not_before(head, fact.at)
    update |= _with_status(head, RunStatus.AWAITING_AGENT if fact.waits else RunStatus.RUNNING)
    return update, changed


def _remote_run_started(head: RunHead, fact: RemoteRunStarted) -> _Change:
    """The attempt in flight learnt the id of its run at the remote agent (to resume it); when
    that run had not ended (``waits``), the run awaits the agent."""
    task = head.task(fact.task_id)
    last = task.attempts[-1] if task.attempts else None
    if task.status != TaskStatus.RUNNING or last is None or last.number != fact.attempt:
        raise IllegalTransition(f"task {fact.task_id} has no attempt {fact.attempt} in flight")
    if not fact.waits:
        attempts = _replace_attempt(task, fact.attempt, remote_run_id=fact.remote_run_id)
        return {}, evolve(task, {"attempts": attempts})
    # Followed outside the drive from now on: the run waits for the agent, holding nothing.
    attempts = _replace_attempt(task, fact.attempt, remote_run_id=fact.remote_run_id, waits=True)
    return _with_status(head, RunStatus.AWAITING_AGENT), evolve(task, {"attempts": attempts})


def _remote_run_cancelled(head: RunHead, fact: RemoteRunCancelled) -> _Change:
    """What a cancel did to an awaited remote run (recorded with ``run_cancelled``, which closes
    the task): nothing changes in the head."""
    task = head.task(fact.task_id)
    if not any(a.number == fact.attempt and a.remote_run_id == fact.remote_run_id for a in task.attempts):
        raise IllegalTransition(f"task {fact.task_id} has no attempt {fact.attempt} on {fact.remote_run_id}")
    return {}, None


def _parked_attempt(head: RunHead, task_id: str, attempt: int) -> tuple[TaskState, AttemptRecord]:
    """The task and its attempt in flight ``attempt`` (IllegalTransition when it has none)."""
    task = _found(head, task_id)
    last = task.attempts[-1] if task.attempts else None
    if (
        task.status != TaskStatus.RUNNING
        or last is None
        or last.number != attempt
        or last.outcome != "running"
    ):
        raise IllegalTransition(f"task {task_id} has no attempt {attempt} in flight")
    return task, last


def _agent_question_asked(head: RunHead, fact: AgentQuestionAsked) -> _Change:
    """A remote A2A task asks a question: a ``question`` gate is requested and the attempt parks
    there (nobody follows the remote task until the gate is decided)."""
    task, last = _parked_attempt(head, fact.task_id, fact.attempt)
    if last.remote_run_id != fact.remote_run_id or last.question is not None or head.gate(fact.gate_id):
        raise IllegalTransition(f"task {fact.task_id} cannot ask {fact.gate_id}")
    gate = GateState(
        gate_id=fact.gate_id,
        task_id=fact.task_id,
        position="question",
        status="requested",
        requested_at=fact.at,
        note=fact.question,
        agent=fact.agent,
        attempt=fact.attempt,
        number=fact.number,
        asked_id=fact.asked_id,
        context_id=fact.context_id,
    )
    attempts = _replace_attempt(task, fact.attempt, waits=False, question=fact.gate_id)
    update: dict[str, object] = {"gates": (*head.gates, gate)}
    update |= _with_status(head, RunStatus.AWAITING_APPROVAL)
    return update, evolve(task, {"attempts": attempts})


def _answered(head: RunHead, task_id: str, attempt: int, gate_id: str) -> TaskState:
    task, last = _parked_attempt(head, task_id, attempt)
    gate = head.gate(gate_id)
    if last.question != gate_id or gate is None or gate.status != "approved":
        raise IllegalTransition(f"task {task_id} has no answer to {gate_id} to send")
    return task


def _agent_answer_sending(head: RunHead, fact: AgentAnswerSending) -> _Change:
    """The answer to a question is about to be sent (so a send after a crash may be a duplicate)."""
    task = _answered(head, fact.task_id, fact.attempt, fact.gate_id)
    changes: dict[str, object] = {"answer_sending": True}
    if fact.possible_duplicate_call:
        last = task.attempts[-1]
        changes["telemetry"] = evolve(last.telemetry, {"possible_duplicate_call": True})
    return {}, evolve(task, {"attempts": _replace_attempt(task, fact.attempt, **changes)})


def _agent_answer_sent(head: RunHead, fact: AgentAnswerSent) -> _Change:
    """The answer reached the remote agent: the question is no longer in play."""
    task = _answered(head, fact.task_id, fact.attempt, fact.gate_id)
    attempts = _replace_attempt(task, fact.attempt, question=None, answer_sending=False)
    return {}, evolve(task, {"attempts": attempts})


def _attempt_failed(head: RunHead, fact: AttemptFailed) -> _Change:
    """An attempt failed and is charged; its task waits for the next (``not_before``, if given)."""
    task = head.task(fact.task_id)
    executor = task.executor or head.contract.executor_for(head.chain.step(task.step_name))
    telemetry = priced(head.contract, executor, fact.telemetry)
    update: dict[str, object] = {}
    if fact.copied_from is None:
        update["spent"] = charge(head, task.step_name, telemetry)
    attempts = _replace_attempt(
        task, fact.attempt, outcome="failed", finished_at=fact.at, error=fact.error, telemetry=telemetry
    )
    changed = _task_update(head, task, TaskStatus.PENDING, attempts=attempts)
    update["not_before"] = _not_before(head, fact.at, fact.not_before)
    update |= _with_status(head, RunStatus.QUEUED)
    return update, changed


def _task_completed(head: RunHead, fact: TaskCompleted) -> _Change:
    """A task's output is recorded and charged, with the routed value its step reads from it."""
    task = head.task(fact.task_id)
    telemetry = priced(head.contract, fact.executor, fact.telemetry)
    update: dict[str, object] = {}
    if fact.copied_from is None:
        update["spent"] = charge(head, task.step_name, telemetry)
    attempts = _replace_attempt(
        task, fact.attempt, outcome="succeeded", finished_at=fact.at, telemetry=telemetry
    )
    routed = route_value_of(head.chain.step(task.step_name), fact.value)
    changed = _task_update(
        head,
        task,
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
    return update, changed


def _task_failed(head: RunHead, fact: TaskFailed) -> _Change:
    """A task failed for good; an attempt it cuts short is closed as failed."""
    task = head.task(fact.task_id)
    update: dict[str, object] = {}
    for cut in (a for a in task.attempts if a.outcome == "running" and fact.copied_from is None):
        # A call closed without an outcome (out of time, an orphan) may have been billed.
        update["spent"] = charge_unmetered(head, task.step_name, cut.executor)
    attempts = tuple(
        evolve(a, {"outcome": "failed", "finished_at": fact.at, "error": fact.error})
        if a.outcome in ("running", "prepared")
        else a
        for a in task.attempts
    )
    changed = _task_update(
        head, task, TaskStatus.FAILED, error=fact.error, finished_at=fact.at, attempts=attempts
    )
    update["not_before"] = _not_before(head, fact.at)
    update |= _with_status(head, RunStatus.QUEUED)
    return update, changed


def _route_decided(head: RunHead, fact: RouteDecided) -> _Change:
    """A routed step's value is applied (the rule: :mod:`orchestration.core.routing`)."""
    task = _found(head, fact.task_id)
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
    return update, None


def _child_started(head: RunHead, fact: ChildStarted) -> _Change:
    """A child run is linked to its task (:mod:`orchestration.engine.children`): by the host, to a
    task awaiting it; by the engine, as the task's next attempt, and the run awaits its children."""
    task = _found(head, fact.task_id)
    children = task.children or ()
    if any(c.run_id == fact.child_run_id for c in children):
        raise IllegalTransition(f"child run {fact.child_run_id} is already linked to task {fact.task_id}")
    linked = (*children, ChildRef(run_id=fact.child_run_id, by=fact.by))
    if fact.by == "host":
        if task.status != TaskStatus.AWAITING_HOST:
            raise IllegalTransition(f"task {fact.task_id} is not awaiting the host")
        return {}, evolve(task, {"children": linked})
    attempt = AttemptRecord(
        number=len(task.attempts) + 1, executor=f"child:{fact.child_run_id}", started_at=fact.at
    )
    changed = _task_update(
        head,
        task,
        TaskStatus.RUNNING,
        executor=attempt.executor,
        attempts=(*task.attempts, attempt),
        started_at=task.started_at or fact.at,
        children=linked,
    )
    return _with_status(head, RunStatus.AWAITING_CHILDREN), changed


def _child_ended(head: RunHead, fact: ChildEnded) -> _Change:
    """An active child run of a task ended (:mod:`orchestration.engine.children`)."""
    task = _found(head, fact.task_id)
    children = task.children or ()
    ref = next((c for c in children if c.run_id == fact.child_run_id), None)
    if ref is None or ref.status != "active":
        raise IllegalTransition(f"child run {fact.child_run_id} of task {fact.task_id} is not active")
    ended = tuple(evolve(c, {"status": fact.status}) if c is ref else c for c in children)
    return {}, evolve(task, {"children": ended})


def _run_cancelled(head: RunHead, fact: RunCancelled) -> _Change:
    """The run is cancelled: its open tasks with it."""
    update = _with_status(head, RunStatus.CANCELLED)
    update["tasks"] = _close_open_tasks(head, TaskStatus.CANCELLED, fact.at)
    update["finished_at"] = fact.at
    update["not_before"] = None
    return update, None


def _run_finished(head: RunHead, fact: RunFinished) -> _Change:
    """The run ends. One that completes with tasks not run (an exhausted loop's work accepted at
    its gate) skips them, as a failed one does."""
    update = _with_status(head, RunStatus(fact.status))
    update["error"] = fact.error
    update["finished_at"] = fact.at
    if fact.status == "failed" or any(not t.status.is_terminal for t in head.tasks):
        update["tasks"] = _close_open_tasks(head, TaskStatus.SKIPPED, fact.at)
    return update, None


def _chain_upgraded(head: RunHead, fact: ChainUpgraded) -> _Change:
    """The run moves to ``fact.chain`` (:mod:`orchestration.core.upgrades`): its tasks and gates
    as that chain has them, and a run parked at the host or a gate queued again, so that what it
    waits for is decided anew on the new chain (a host task prepared again, a gate asked again)."""
    if fact.from_hash != head.chain_hash:
        raise IllegalTransition(
            f"run {head.run_id} is on chain {head.chain_hash[:12]}, not {fact.from_hash[:12]}"
        )
    verdict = plan_upgrade(head, fact.chain)
    if isinstance(verdict, CannotMove):
        raise IllegalTransition(
            f"run {head.run_id} cannot move to chain {fact.to_hash[:12]}: {verdict.reason}"
        )
    tasks, gates = upgrade_effect(head, fact.chain)
    update: dict[str, object] = {
        "chain": fact.chain,
        "chain_hash": fact.to_hash,
        "chain_moved": True,
        "tasks": tasks,
        "gates": gates,
    }
    if head.status in (RunStatus.AWAITING_HOST, RunStatus.AWAITING_APPROVAL):
        # What it waits for now: a host task still handed out, a gate still asked, or (replaced,
        # or to be asked again) a decision on the new chain.
        if any(t.status == TaskStatus.AWAITING_HOST for t in tasks):
            update |= _with_status(head, RunStatus.AWAITING_HOST)
        elif any(g.status == "requested" for g in gates):
            update |= _with_status(head, RunStatus.AWAITING_APPROVAL)
        else:
            update |= _with_status(head, RunStatus.QUEUED)
    return update, None


def _push_configured(head: RunHead, fact: PushConfigured) -> _Change:
    """A push notification config is set (replacing one of the same id)."""
    ids = head.push_configs
    return {"push_configs": ids if fact.config_id in ids else (*ids, fact.config_id)}, None


def _push_config_deleted(head: RunHead, fact: PushConfigDeleted) -> _Change:
    """A push notification config is removed (one the run does not have: nothing changes)."""
    return {"push_configs": tuple(i for i in head.push_configs if i != fact.config_id)}, None


#: the handler of each fact type after ``run_created`` (found by the fact's exact type: the facts are
#: a closed union of final records; tests/unit/core/test_fold_handlers.py checks that every one is here)
_HANDLERS: dict[type[object], Callable[[RunHead, Any], _Change]] = {
    ApprovalRequested: _approval_requested,
    ApprovalDecided: _approval_decided,
    HostTaskPrepared: _host_task_prepared,
    HostOutputSubmitted: _host_output_submitted,
    AttemptStarted: _attempt_started,
    RemoteRunStarted: _remote_run_started,
    RemoteRunCancelled: _remote_run_cancelled,
    AgentQuestionAsked: _agent_question_asked,
    AgentAnswerSending: _agent_answer_sending,
    AgentAnswerSent: _agent_answer_sent,
    AttemptFailed: _attempt_failed,
    TaskCompleted: _task_completed,
    TaskFailed: _task_failed,
    RouteDecided: _route_decided,
    ChildStarted: _child_started,
    ChildEnded: _child_ended,
    RunCancelled: _run_cancelled,
    RunFinished: _run_finished,
    ChainUpgraded: _chain_upgraded,
    PushConfigured: _push_configured,
    PushConfigDeleted: _push_config_deleted,
}


def apply_write(head: RunHead, facts: Sequence[Fact], *, keep_history: bool = False) -> RunHead:
    """Fold the facts of one atomic write into ``head`` and bump its version."""
    if not facts:
        raise ValueError("a write appends at least one fact")
    version = head.version + 1
    for fact in facts[:-1]:
        head = _apply(head, fact, keep_history, None)
    return _apply(head, facts[-1], keep_history, version)


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
    return evolve(head, {"tasks": detailed.tasks})

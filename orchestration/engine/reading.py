"""The read side of a run: the outputs of its done tasks, a task's prompts, the snapshot a view
shows, and what the run waits for from a caller. Everything is read from the persisted record (the
head and the facts it points to), never from a value held in memory, so a restarted process reads
exactly what the crashed one would have."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Any

from orchestration.chains.prompts import TaskPrompt, materialize, render, upstream, upstream_task_ids
from orchestration.core.facts import Fact, ForkOrigin, RouteDecided, RunCreated, TaskCompleted, TaskFailed
from orchestration.core.fold import with_history
from orchestration.core.graph import is_parallel
from orchestration.core.models import GateState, RunHead, TaskState
from orchestration.core.routing import revise_offered
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.core.wake import time_limit
from orchestration.errors import (
    ConstructError,
    CorruptRecord,
    IllegalTransition,
    InvalidArgument,
    InvalidState,
    Said,
    hint,
    quoted,
)
from orchestration.store import RunStore


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """Everything a view of a run needs: the head with every task's history (see
    :func:`~orchestration.core.fold.with_history`), the outputs of done tasks, and the prompts of the
    task the host must run now (if any), and the validated values of typed outputs."""

    head: RunHead
    outputs: dict[str, str]
    host_task: TaskPrompt | None
    warnings: tuple[str, ...] = ()
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the run's routing facts, in order
    routes: tuple[RouteDecided, ...] = ()
    #: the prompts of every task awaiting the host, in run order (several in a parallel run)
    host_tasks: tuple[TaskPrompt, ...] = ()
    #: a fork's source run and task, and its copied tasks (task id -> the source fact's seq)
    forked_from: ForkOrigin | None = None
    copied: dict[str, int] = field(default_factory=dict)


async def read_outputs(
    store: RunStore,
    head: RunHead,
    task_ids: Sequence[str] | None = None,
    known: MutableMapping[int, Fact] | None = None,
) -> dict[str, str]:
    """The persisted outputs of done tasks (all of them, or ``task_ids``), read from facts: the
    ones not in ``known`` in one read of the log (``read_facts`` over the stretch that holds them).

    ``known``: facts of this run already read from (or committed to) the store, by sequence
    number. A recorded fact never changes, so one found there is not read again, and every fact
    read here is added to it (a drive keeps one for its run: see
    :class:`~orchestration.engine.drive.Drive`)."""
    ids = None if task_ids is None else set(task_ids)
    wanted = [
        (task.task_id, task.output_seq)
        for task in head.tasks
        if task.output_seq is not None and (ids is None or task.task_id in ids)
    ]
    found: MutableMapping[int, Fact] = {} if known is None else known
    missing = {seq for _, seq in wanted if seq not in found}
    if len(missing) > 1:
        # One read of the stretch of the log that holds them, not one read per output.
        first, last = min(missing), max(missing)
        for fact in await store.read_facts(head.run_id, first - 1, last - first + 1):
            if fact.seq in missing:
                found[fact.seq] = fact
    out: dict[str, str] = {}
    for task_id, seq in wanted:
        cached = found.get(seq)
        if cached is None:
            cached = found[seq] = await store.read_fact(head.run_id, seq)
        fact = cached
        if not isinstance(fact, TaskCompleted):
            raise InvalidState(f"run {head.run_id}: fact {seq} is not a task output")
        out[task_id] = fact.output
    return out


async def read_prompt(
    store: RunStore, head: RunHead, task_id: str, known: MutableMapping[int, Fact] | None = None
) -> TaskPrompt:
    """Materialize ``task_id``'s prompts from the persisted record only (``known``: see
    :func:`read_outputs`)."""
    up = upstream(head, task_id)
    found = None if known is None else _known_outputs(up.tasks, known)
    if found is None:
        outputs = await read_outputs(store, head, up.ids, known)
        return render(head, up.task, up.position, up.index, up.work, outputs)
    if up.work is up.tasks:
        # Nothing was sent back: the outputs are those of the work shown, in its order.
        return render(head, up.task, up.position, up.index, up.work, {}, found)
    outputs = dict(zip(map(_TASK_ID, up.tasks), found, strict=True))
    return render(head, up.task, up.position, up.index, up.work, outputs)


def _known_outputs(tasks: Sequence[TaskState], known: Mapping[int, Fact]) -> list[str] | None:
    """The outputs of ``tasks`` (in their order) as :func:`read_outputs` gives them, when every
    one is among the ``known`` facts (as at every boundary of a drive but its first), without a
    pass over the run's tasks (nor a Python loop over the outputs); None when one is not, or is
    no task output (:func:`read_outputs` then reads, and says what is wrong, as before)."""
    if not tasks:
        return []
    facts = list(map(known.get, map(_OUTPUT_SEQ, tasks)))
    if set(map(type, facts)) != {TaskCompleted}:
        return None
    return list(map(_OUTPUT, facts))


_OUTPUT_SEQ = attrgetter("output_seq")
_OUTPUT = attrgetter("output")
_TASK_ID = attrgetter("task_id")


async def read_log(store: RunStore, run_id: str) -> tuple[RunHead, tuple[Fact, ...]]:
    """The run's head and its facts up to the head's ``last_seq``, as one consistent snapshot
    (facts are never rewritten, so those are the head's whatever is appended meanwhile). Raises
    what ``load`` raises (``RunNotFound``, ``RunPruned``...), also when the run is deleted between
    the two reads: never part of a run."""
    head = await store.load(run_id)
    facts = await store.read_facts(run_id, 0, head.last_seq)
    if len(facts) != head.last_seq:
        await store.load(run_id)  # gone meanwhile: load says how
        raise CorruptRecord(run_id, "facts", f"the log ends before the head's last_seq {head.last_seq}")
    return head, tuple(facts)


async def read_snapshot(store: RunStore, head: RunHead, warnings: tuple[str, ...] = ()) -> RunSnapshot:
    """The run as a view shows it, read in one pass over its log (up to ``head``)."""
    facts = await store.read_facts(head.run_id, 0, head.last_seq)
    try:
        head = with_history(head, facts)
    except (ValueError, IllegalTransition) as exc:
        raise CorruptRecord(head.run_id, "its fact log", f"it does not fold to its head ({exc})") from exc
    outputs = {f.task_id: f.output for f in facts if isinstance(f, TaskCompleted)}
    values = {f.task_id: f.value for f in facts if isinstance(f, TaskCompleted) and f.value is not None}
    host_task = None
    awaiting = [t for t in head.tasks if t.status == TaskStatus.AWAITING_HOST]
    host_tasks: tuple[TaskPrompt, ...] = ()
    if awaiting and (head.status == RunStatus.AWAITING_HOST or is_parallel(head.chain)):
        host_tasks = tuple(
            materialize(head, t.task_id, {k: outputs[k] for k in upstream_task_ids(head, t.task_id)})
            for t in awaiting
        )
        if head.status == RunStatus.AWAITING_HOST:
            host_task = host_tasks[0]
    routes = tuple(f for f in facts if isinstance(f, RouteDecided))
    forked_from = facts[0].forked_from if facts and isinstance(facts[0], RunCreated) else None
    copied = {
        f.task_id: f.copied_from
        for f in facts
        if isinstance(f, TaskCompleted | TaskFailed) and f.copied_from is not None
    }
    return RunSnapshot(head, outputs, host_task, warnings, values, routes, host_tasks, forked_from, copied)


# -- what a run waits for ----------------------------------------------------------------------


def awaiting_host_task(head: RunHead) -> str | None:
    """The task awaiting the host's output, if any."""
    for task in head.tasks:
        if task.status == TaskStatus.AWAITING_HOST:
            return task.task_id
    return None


def awaited_calls(head: RunHead) -> Said:
    """What the run waits for from a caller, as the calls that answer it, for an error to end with
    when the caller called the wrong tool (or named the wrong task or gate): ``"; it awaits: call
    orchestrate_resume with {...} plus output (...)"`` in the tools' words, one call per host task
    and open gate, each with its arguments as JSON a caller can send (hints: each channel says them
    in its words, see :class:`~orchestration.errors.Said`); empty when nothing waits for a caller.
    A linear run waits for what its status says; a parallel run's branches may wait for both at once."""
    run_id = head.run_id
    if head.status.is_terminal:
        return Said()
    parallel = is_parallel(head.chain)
    calls: list[Said] = []
    if head.status == RunStatus.AWAITING_HOST or parallel:
        calls += [
            hint("resume_run", {"run_id": run_id, "task_id": t.task_id}, needs=("output",))
            + " (your model's answer to the task's prompt; "
            + hint("show_run", run_id=run_id, form="name")
            + " shows it)"
            for t in head.tasks
            if t.status == TaskStatus.AWAITING_HOST
        ]
    if head.status == RunStatus.AWAITING_APPROVAL or parallel:
        for gate in head.gates:
            if gate.status != "requested":
                continue
            decisions = (
                ("approve", "reject", "revise") if revise_offered(head, gate) else ("approve", "reject")
            )
            calls.append(
                hint("approve_gate", {"run_id": run_id, "gate_id": gate.gate_id, "decision": "approve"})
                + " once the user decided ("
                + hint("approve_gate", {"decision": decisions}, run_id=run_id, form="choices")
                + ")"
            )
    if not calls and head.status == RunStatus.AWAITING_CHILDREN:
        calls.append(
            "its child runs ("
            + hint("show_run", {"run_id": run_id}, form="name")
            + " shows what they wait for)"
        )
    if not calls and head.status == RunStatus.AWAITING_AGENT:
        calls.append(
            "its agent's remote run (the server follows it; "
            + hint("wait_run", run_id=run_id, form="name")
            + " waits)"
        )
    if not calls:
        return Said()
    said = Said(("; it awaits: ",))
    for i, call in enumerate(calls):
        said += ("; " if i else "") + call
    return said


def missing_task_id_error(head: RunHead, name: str = "task_id") -> ConstructError:
    """The error for host output given without the task it answers (argument ``name``):
    ``invalid_argument`` naming the task the run awaits output for, or saying that none is
    awaited; ``invalid_state`` when the run has ended. It never picks the task itself: a
    retried call must not record its output as the next task's."""
    run_id = head.run_id
    done = [t.task_id for t in head.tasks if t.status == TaskStatus.DONE]
    recorded = f" (output is recorded already for: {', '.join(done)})" if done else ""
    if head.status.is_terminal:
        return InvalidState(
            f"run {run_id} is {head.status.value}; nothing awaits output ({name} was not given){recorded}"
        )
    awaiting = awaiting_host_task(head)
    if awaiting is not None and (head.status == RunStatus.AWAITING_HOST or is_parallel(head.chain)):
        return InvalidArgument(
            f"{name} is missing: name the task your output answers. Run {run_id} awaits output "
            f"for task {awaiting!r}: pass {name}={awaiting!r} if your output is its answer{recorded}"
        )
    return InvalidArgument(
        f"{name} is missing; run {run_id} is {head.status.value} and awaits no host output{recorded}"
        + awaited_calls(head)
    )


def missing_gate_id_error(head: RunHead, name: str = "gate_id") -> ConstructError:
    """The error for a decision given without the gate it decides (argument ``name``):
    ``invalid_argument`` naming the gate the run waits at, or saying that none waits;
    ``invalid_state`` when the run has ended. It never picks the gate itself: a retried
    approval must not approve the next gate, which nobody has seen."""
    run_id = head.run_id
    decided = [f"{g.gate_id} ({g.status})" for g in head.gates if g.decided_at is not None]
    recorded = f" (already decided: {', '.join(decided)})" if decided else ""
    if head.status.is_terminal:
        return InvalidState(
            f"run {run_id} is {head.status.value}; no gate awaits a decision ({name} was not given){recorded}"
        )
    open_gate = next((g for g in head.gates if g.status == "requested"), None)
    if open_gate is not None and (head.status == RunStatus.AWAITING_APPROVAL or is_parallel(head.chain)):
        return InvalidArgument(
            f"{name} is missing: name the gate you decide. Run {run_id} awaits a decision at gate "
            f"{open_gate.gate_id!r}: pass {name}={open_gate.gate_id!r} once the user decided it{recorded}"
        )
    return InvalidArgument(
        f"{name} is missing; run {run_id} is {head.status.value}, not awaiting approval{recorded}"
        + awaited_calls(head)
    )


def require_resumable(head: RunHead) -> RunHead:
    """For a resume without output: ``head`` if the server can advance the run now, else the
    error that tells the caller what the run needs instead."""
    run_id = head.run_id
    if head.status.is_terminal:
        raise InvalidState(f"run {run_id} is {head.status.value}; there is nothing to resume")
    if head.status == RunStatus.AWAITING_APPROVAL:
        gate = next(g for g in head.gates if g.status == "requested")
        raise InvalidState(f"run {run_id} is awaiting approval of gate {gate.gate_id}" + awaited_calls(head))
    if head.status == RunStatus.AWAITING_HOST and is_parallel(head.chain):
        waiting = [t.task_id for t in head.tasks if t.status == TaskStatus.AWAITING_HOST]
        raise InvalidArgument(
            f"run {run_id} is awaiting the host's output for tasks {', '.join(map(repr, waiting))}"
            + awaited_calls(head)
        )
    if head.status == RunStatus.AWAITING_HOST:
        awaiting = awaiting_host_task(head)
        raise InvalidArgument(
            f"run {run_id} is awaiting the host's output for task {awaiting!r}" + awaited_calls(head)
        )
    return head


__all__ = [
    "RunSnapshot",
    "awaited_calls",
    "awaiting_host_task",
    "missing_gate_id_error",
    "missing_task_id_error",
    "read_log",
    "read_outputs",
    "read_prompt",
    "read_snapshot",
    "require_resumable",
]


def gate_to_decide(head: RunHead, gate_id: str) -> GateState:
    """The gate ``gate_id`` of the run, or ``InvalidArgument`` naming the gates it has."""
    gate = head.gate(gate_id)
    if gate is None:
        known = ", ".join(g.gate_id for g in head.gates) or "none"
        raise InvalidArgument(
            f"run {head.run_id} has no gate {quoted(gate_id)}; its gates are: {known}" + awaited_calls(head)
        )
    return gate


def refuse_if_out_of_time(head: RunHead, now: datetime) -> None:
    """``InvalidState`` when the run or its task in progress ran out of time (at ``now``): an
    output or a decision that comes too late is not recorded, the server records
    ``deadline_exceeded``."""
    limit = time_limit(head)
    if limit is not None and now >= limit:
        raise InvalidState(
            f"run {head.run_id} ran out of time at {limit.isoformat()}; the server records deadline_exceeded"
        )

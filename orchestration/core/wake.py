"""When a run needs a decision although nobody writes to it: its deadline, the deadline of a task
in progress, a requested gate's expiry (``wake_at``, which the fold keeps in the head and stores
index). Split from :mod:`orchestration.core.fold`, which re-exports these functions."""

from __future__ import annotations

from datetime import datetime, timedelta

from orchestration.core.memo import by_identity
from orchestration.core.models import ChainSnapshot, GateState, RunHead, TaskState
from orchestration.core.vocabulary import RunStatus, TaskStatus

#: the task statuses that have a deadline (see :func:`task_deadline`)
_IN_PROGRESS = frozenset({TaskStatus.RUNNING, TaskStatus.AWAITING_HOST})


def task_deadline(head: RunHead, task: TaskState) -> datetime | None:
    """When the task in progress runs out of time (its step's ``timeout_seconds`` after it started)."""
    return _deadline(head.chain, task)


def _deadline(chain: ChainSnapshot, task: TaskState) -> datetime | None:
    if task.status not in _IN_PROGRESS or task.started_at is None:
        return None
    timeout = chain.step(task.step_name).timeout_seconds
    return None if timeout is None else task.started_at + timedelta(seconds=timeout)


def time_limit(head: RunHead) -> datetime | None:
    """The earliest deadline of the run: its own, or a task's in progress (past it, the run records
    ``deadline_exceeded`` and takes no more output or decisions)."""
    if head.status.is_terminal:
        return None
    return _time_limit(head.chain, head.deadline_at, head.tasks)


def wake_at(head: RunHead) -> datetime | None:
    """The earliest time that can change the run's next decision without any write: its
    :func:`time_limit`, or a requested gate's expiry."""
    return wake_of(head.chain, head.status, head.deadline_at, head.tasks, head.gates)


def _time_limit(
    chain: ChainSnapshot, deadline_at: datetime | None, tasks: tuple[TaskState, ...]
) -> datetime | None:
    if not _has_task_timeouts(chain):
        # No task has a deadline: no pass over the tasks (one per fact, in the fold).
        return deadline_at
    times = [deadline_at] + [_deadline(chain, t) for t in tasks if t.status in _IN_PROGRESS]
    present = [t for t in times if t is not None]
    return min(present) if present else None


def wake_of(
    chain: ChainSnapshot,
    status: RunStatus,
    deadline_at: datetime | None,
    tasks: tuple[TaskState, ...],
    gates: tuple[GateState, ...],
) -> datetime | None:
    """:func:`wake_at` of a head with these parts (the fold computes it before making the head)."""
    if status.is_terminal:
        return None
    limit = _time_limit(chain, deadline_at, tasks)
    times = [limit] + [g.expires_at for g in gates if g.status == "requested"]
    present = [t for t in times if t is not None]
    return min(present) if present else None


@by_identity
def _has_task_timeouts(chain: ChainSnapshot) -> bool:
    """Whether a step of the chain has a ``timeout_seconds`` (once per chain snapshot)."""
    return any(step.timeout_seconds is not None for step in chain.steps)

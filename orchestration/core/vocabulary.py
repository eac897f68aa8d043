"""The status vocabulary and the legal-transition tables (DESIGN §2).

This module is the single owner of run and task statuses. Every change of status anywhere in the
code base goes through :func:`check_run_transition` / :func:`check_task_transition`, so an illegal
move (for example ``completed -> running``) is a typed :class:`IllegalTransition`, never a silent
corruption of a run.
"""

from __future__ import annotations

from enum import StrEnum

from orchestration.errors import IllegalTransition


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_HOST = "awaiting_host"
    #: a task's child run works (:mod:`orchestration.engine.children`): the run holds no lease and no
    #: dispatcher slot; the child's end is recorded on it (record format 4)
    AWAITING_CHILDREN = "awaiting_children"
    #: a task's remote agent run works (:mod:`orchestration.engine.agent_waits`): the run holds no
    #: lease and no dispatcher slot; the remote run's end is recorded on it (record format 6)
    AWAITING_AGENT = "awaiting_agent"
    COMPLETED = "completed"
    COMPLETED_WITH_FAILURES = "completed_with_failures"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"

    @property
    def kind(self) -> str:
        """``active``, ``paused`` or ``terminal``."""
        if self in ACTIVE_RUN_STATUSES:
            return "active"
        if self in PAUSED_RUN_STATUSES:
            return "paused"
        return "terminal"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_RUN_STATUSES


class TaskStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    AWAITING_HOST = "awaiting_host"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_TASK_STATUSES


ACTIVE_RUN_STATUSES = frozenset({RunStatus.QUEUED, RunStatus.RUNNING})
PAUSED_RUN_STATUSES = frozenset(
    {
        RunStatus.AWAITING_APPROVAL,
        RunStatus.AWAITING_HOST,
        RunStatus.AWAITING_CHILDREN,
        RunStatus.AWAITING_AGENT,
    }
)
TERMINAL_RUN_STATUSES = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.COMPLETED_WITH_FAILURES,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.REJECTED,
    }
)
TERMINAL_TASK_STATUSES = frozenset(
    {TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.SKIPPED, TaskStatus.CANCELLED}
)

_R = RunStatus
_NONTERMINAL_EXITS = frozenset({_R.CANCELLED, _R.FAILED})

#: Legal run transitions. A status may also "move" to itself (for example ``queued -> queued``
#: when a retry is scheduled), which :func:`check_run_transition` always allows for non-terminal
#: statuses.
RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    _R.QUEUED: frozenset(
        {
            _R.RUNNING,
            _R.AWAITING_APPROVAL,
            _R.AWAITING_HOST,
            _R.AWAITING_CHILDREN,
            _R.AWAITING_AGENT,
            _R.COMPLETED,
            _R.COMPLETED_WITH_FAILURES,
        }
    )
    | _NONTERMINAL_EXITS,
    _R.RUNNING: frozenset(
        {_R.QUEUED, _R.AWAITING_APPROVAL, _R.AWAITING_HOST, _R.AWAITING_CHILDREN, _R.AWAITING_AGENT}
    )
    | _NONTERMINAL_EXITS,
    # An approval gate is left by a decision: approve -> queued, reject -> rejected; an A2A
    # agent's question answered -> awaiting_agent (the remote task is followed again).
    _R.AWAITING_APPROVAL: frozenset({_R.QUEUED, _R.REJECTED, _R.AWAITING_AGENT}) | _NONTERMINAL_EXITS,
    # A host task is left when the host's output is recorded (-> queued).
    _R.AWAITING_HOST: frozenset({_R.QUEUED}) | _NONTERMINAL_EXITS,
    # A child run's end is recorded on its parent (-> queued: the parent goes on).
    _R.AWAITING_CHILDREN: frozenset({_R.QUEUED}) | _NONTERMINAL_EXITS,
    # A remote agent run's end (or a failure to follow it) is recorded on the run (-> queued);
    # a remote A2A task's question is a gate of the run (-> awaiting_approval).
    _R.AWAITING_AGENT: frozenset({_R.QUEUED, _R.AWAITING_APPROVAL}) | _NONTERMINAL_EXITS,
    _R.COMPLETED: frozenset(),
    _R.COMPLETED_WITH_FAILURES: frozenset(),
    _R.FAILED: frozenset(),
    _R.CANCELLED: frozenset(),
    _R.REJECTED: frozenset(),
}

_T = TaskStatus
TASK_TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    _T.PENDING: frozenset({_T.RUNNING, _T.AWAITING_HOST, _T.FAILED, _T.SKIPPED, _T.CANCELLED}),
    # running -> pending: the attempt failed and another one will be made.
    _T.RUNNING: frozenset({_T.PENDING, _T.DONE, _T.FAILED, _T.CANCELLED}),
    _T.AWAITING_HOST: frozenset({_T.DONE, _T.FAILED, _T.CANCELLED}),
    _T.DONE: frozenset(),
    _T.FAILED: frozenset(),
    _T.SKIPPED: frozenset(),
    _T.CANCELLED: frozenset(),
}


def check_run_transition(current: RunStatus, new: RunStatus) -> None:
    """Raise :class:`IllegalTransition` unless ``current -> new`` is a legal run transition."""
    if current == new and not current.is_terminal:
        return
    if new not in RUN_TRANSITIONS[current]:
        raise IllegalTransition(f"run status cannot move from {current.value} to {new.value}")


def check_task_transition(current: TaskStatus, new: TaskStatus) -> None:
    """Raise :class:`IllegalTransition` unless ``current -> new`` is a legal task transition."""
    if current == new and not current.is_terminal:
        return
    if new not in TASK_TRANSITIONS[current]:
        raise IllegalTransition(f"task status cannot move from {current.value} to {new.value}")

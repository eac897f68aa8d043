from __future__ import annotations

import pytest

from orchestration.core.vocabulary import (
    RUN_TRANSITIONS,
    TASK_TRANSITIONS,
    TERMINAL_RUN_STATUSES,
    RunStatus,
    TaskStatus,
    check_run_transition,
    check_task_transition,
)
from orchestration.errors import IllegalTransition


def test_every_status_has_a_row_and_a_kind() -> None:
    assert set(RUN_TRANSITIONS) == set(RunStatus)
    assert set(TASK_TRANSITIONS) == set(TaskStatus)
    kinds = {s: s.kind for s in RunStatus}
    assert kinds[RunStatus.QUEUED] == kinds[RunStatus.RUNNING] == "active"
    assert kinds[RunStatus.AWAITING_APPROVAL] == kinds[RunStatus.AWAITING_HOST] == "paused"
    assert {s for s, k in kinds.items() if k == "terminal"} == TERMINAL_RUN_STATUSES


@pytest.mark.parametrize("terminal", sorted(TERMINAL_RUN_STATUSES))
@pytest.mark.parametrize("target", list(RunStatus))
def test_terminal_means_terminal(terminal: RunStatus, target: RunStatus) -> None:
    with pytest.raises(IllegalTransition):
        check_run_transition(terminal, target)


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (RunStatus.QUEUED, RunStatus.RUNNING),
        (RunStatus.RUNNING, RunStatus.AWAITING_HOST),
        (RunStatus.AWAITING_APPROVAL, RunStatus.QUEUED),
        (RunStatus.AWAITING_APPROVAL, RunStatus.REJECTED),
        (RunStatus.AWAITING_HOST, RunStatus.QUEUED),
        (RunStatus.AWAITING_HOST, RunStatus.CANCELLED),
        (RunStatus.QUEUED, RunStatus.COMPLETED),
        (RunStatus.QUEUED, RunStatus.QUEUED),
    ],
)
def test_legal_run_transitions(current: RunStatus, new: RunStatus) -> None:
    check_run_transition(current, new)


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (RunStatus.QUEUED, RunStatus.REJECTED),
        (RunStatus.AWAITING_HOST, RunStatus.AWAITING_APPROVAL),
        (RunStatus.RUNNING, RunStatus.COMPLETED),
        (RunStatus.AWAITING_HOST, RunStatus.REJECTED),
    ],
)
def test_illegal_run_transitions(current: RunStatus, new: RunStatus) -> None:
    with pytest.raises(IllegalTransition, match=f"from {current.value} to {new.value}"):
        check_run_transition(current, new)


def test_task_transitions() -> None:
    check_task_transition(TaskStatus.PENDING, TaskStatus.AWAITING_HOST)
    check_task_transition(TaskStatus.RUNNING, TaskStatus.PENDING)
    check_task_transition(TaskStatus.AWAITING_HOST, TaskStatus.DONE)
    for bad in [(TaskStatus.DONE, TaskStatus.RUNNING), (TaskStatus.PENDING, TaskStatus.DONE)]:
        with pytest.raises(IllegalTransition):
            check_task_transition(*bad)
    for status in TaskStatus:
        if status.is_terminal:
            with pytest.raises(IllegalTransition):
                check_task_transition(status, status)

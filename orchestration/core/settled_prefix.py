"""The settled prefix of a linear run's tasks: how many of its first tasks a linear decision walks
past whatever the gates and the time are, found without reading every task at every decision.
Whether a task is passed depends only on the task and its chain, both immutable, and a cached
answer is reused only for the same objects, so a stale entry can cost time, never an answer.
"""

from __future__ import annotations

from itertools import islice

from orchestration.core.budget import fails_run
from orchestration.core.models import ChainSnapshot, RunHead, step_map
from orchestration.core.vocabulary import TaskStatus

#: runs whose last answer is kept; past it the cache starts again (entries hold a run's task tuple)
LIMIT = 512

_DONE = TaskStatus.DONE
_FAILED = TaskStatus.FAILED
#: terminal statuses a linear decision walks past unconditionally
_PASSED = frozenset({TaskStatus.SKIPPED, TaskStatus.CANCELLED})


class _Entry:
    __slots__ = ("any_failed", "chain", "count", "tasks")

    def __init__(self, chain: ChainSnapshot, tasks: tuple[object, ...], count: int, any_failed: bool) -> None:
        self.chain = chain
        self.tasks = tasks
        self.count = count
        self.any_failed = any_failed


# The last answer per run, with the task tuple and the chain it was computed for. The fold
# replaces one task of the tuple per fact and keeps the others (the same objects), so a write's
# new head shares the settled prefix of the head it was folded from, and the next decision reads
# on from there. Any other head (read back from a store, another run, another chain object) is
# walked from the start.
_last: dict[str, _Entry] = {}


def passed_prefix(head: RunHead) -> tuple[int, bool]:
    """How many of ``head``'s first tasks a linear decision walks past unconditionally, and whether
    one of those failed. A passed task is a terminal task that is neither done nor failed, a done
    task whose step has neither an ``after`` gate nor a route, or a failed task that does not fail
    the run (it only makes the run end ``completed_with_failures``)."""
    tasks = head.tasks
    chain = head.chain
    entry = _last.get(head.run_id)
    start, any_failed, matched = 0, False, False
    if entry is not None and entry.chain is chain:
        count = entry.count
        kept = entry.tasks
        # The last kept task first (a head read back from a store has other objects: no match),
        # then all of them (a tuple comparison checks identity first, in C).
        if count == 0 or (count <= len(tasks) and tasks[count - 1] is kept[-1] and tasks[:count] == kept):
            start, any_failed, matched = count, entry.any_failed, True
    steps = step_map(chain)
    index = start
    for task in islice(tasks, start, None):
        status = task.status
        if status == _DONE:
            step = steps[task.step or task.task_id]
            if step.approve_after or step.route_on is not None:
                break
        elif status == _FAILED:
            if steps[task.step or task.task_id].on_failure == "fail" or fails_run(task):
                break
            any_failed = True
        elif status not in _PASSED:
            break
        index += 1
    if not matched or index != start:
        if entry is None and len(_last) >= LIMIT:
            _last.clear()
        _last[head.run_id] = _Entry(chain, tasks[:index], index, any_failed)
    return index, any_failed


def forget_all() -> None:
    """Drop every kept answer (tests)."""
    _last.clear()


__all__ = ["LIMIT", "forget_all", "passed_prefix"]

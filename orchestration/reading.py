"""The read side of a run: the outputs of its done tasks, a task's prompts, the snapshot a view
shows. Everything is read from the persisted record (the head and the facts it points to), never
from a value held in memory, so a restarted process reads exactly what the crashed one would have."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestration.errors import CorruptRecord, IllegalTransition, InvalidState
from orchestration.facts import TaskCompleted, with_history
from orchestration.models import RunHead
from orchestration.prompts import TaskPrompt, materialize, upstream_task_ids
from orchestration.store import RunStore
from orchestration.vocabulary import RunStatus, TaskStatus


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """Everything a view of a run needs: the head with every task's history (see
    :func:`~orchestration.facts.with_history`), the outputs of done tasks, and the prompts of the
    task the host must run now (if any)."""

    head: RunHead
    outputs: dict[str, str]
    host_task: TaskPrompt | None
    warnings: tuple[str, ...] = ()


async def read_outputs(
    store: RunStore, head: RunHead, task_ids: Sequence[str] | None = None
) -> dict[str, str]:
    """The persisted outputs of done tasks (all of them, or ``task_ids``), read from facts."""
    out: dict[str, str] = {}
    for task in head.tasks:
        if task.output_seq is None or (task_ids is not None and task.task_id not in task_ids):
            continue
        fact = await store.read_fact(head.run_id, task.output_seq)
        if not isinstance(fact, TaskCompleted):
            raise InvalidState(f"run {head.run_id}: fact {task.output_seq} is not a task output")
        out[task.task_id] = fact.output
    return out


async def read_prompt(store: RunStore, head: RunHead, task_id: str) -> TaskPrompt:
    """Materialize ``task_id``'s prompts from the persisted record only."""
    upstream = upstream_task_ids(head, task_id)
    return materialize(head, task_id, await read_outputs(store, head, upstream))


async def read_snapshot(store: RunStore, head: RunHead, warnings: tuple[str, ...] = ()) -> RunSnapshot:
    """The run as a view shows it, read in one pass over its log (up to ``head``)."""
    facts = await store.read_facts(head.run_id, 0, head.last_seq)
    try:
        head = with_history(head, facts)
    except (ValueError, IllegalTransition) as exc:
        raise CorruptRecord(head.run_id, "its fact log", f"it does not fold to its head ({exc})") from exc
    outputs = {f.task_id: f.output for f in facts if isinstance(f, TaskCompleted)}
    host_task = None
    awaiting = [t for t in head.tasks if t.status == TaskStatus.AWAITING_HOST]
    if awaiting and head.status == RunStatus.AWAITING_HOST:
        upstream = upstream_task_ids(head, awaiting[0].task_id)
        host_task = materialize(head, awaiting[0].task_id, {k: outputs[k] for k in upstream})
    return RunSnapshot(head, outputs, host_task, warnings)


__all__ = ["RunSnapshot", "read_outputs", "read_prompt", "read_snapshot"]

"""A parent run's view of its child runs (:mod:`orchestration.engine.children`).

A run whose tasks have child runs lists them in its view (``children``: each child's run id, the
task it belongs to, who started it, its chain, its status and what it waits for). While the run
awaits its children, its ``next_action`` is what its first waiting child waits for — a host task
or an approval gate, however deep the child — with that child's ``run_id`` set, so a host that only
follows ``next_action`` answers the child's task or gate with the right run id; otherwise the run
waits, and the instruction names the children at work. Ended children show the status their end
was recorded with (no read); live ones are read (one head each, their own children in turn).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio

from orchestration.core import RunHead, RunStatus
from orchestration.engine import Runtime, live_children
from orchestration.errors import RunMoved, RunNotFound, RunPruned
from orchestration.store import Tombstone
from server.views.next_step import Approve, RunHostTask, Wait, wait_call
from server.views.run_view import ChildView, RunView

#: at most this many children are listed in a view (the newest are left out)
CHILDREN_SHOWN = 20

LoadView = Callable[[str], Awaitable[RunView]]


async def with_children(view: RunView, head: RunHead, load: LoadView) -> RunView:
    """``view`` with its run's children listed and, while the run awaits them, the first thing one
    of them waits for as its ``next_action``."""
    refs = [(t.task_id, c) for t in head.tasks for c in t.children or ()][:CHILDREN_SHOWN]
    if not refs:
        return view
    children: list[ChildView] = []
    waiting: RunHostTask | Approve | None = None
    for task_id, ref in refs:
        if ref.status != "active":
            children.append(ChildView(run_id=ref.run_id, task_id=task_id, by=ref.by, status=ref.status))
            continue
        try:
            child = await load(ref.run_id)
        except (RunPruned, RunMoved) as gone:
            # deleted by retention, or moved to another store (runs import --move): said so
            status = "pruned" if isinstance(gone, RunPruned) else "moved"
            children.append(ChildView(run_id=ref.run_id, task_id=task_id, by=ref.by, status=status))
            continue
        except RunNotFound:
            # Recorded on the parent, not created yet (a moment later, or after a crash: the
            # drive or the dispatcher's sweep creates it).
            children.append(ChildView(run_id=ref.run_id, task_id=task_id, by=ref.by, status="starting"))
            continue
        action = child.next_action
        said = None
        if isinstance(action, RunHostTask | Approve):
            where = action.run_id or child.run_id
            said = (
                f"host task {action.task_id}" if isinstance(action, RunHostTask) else f"gate {action.gate_id}"
            )
            said += f" in run {where}"
            if waiting is None:
                waiting = action.model_copy(update={"run_id": where})
        children.append(
            ChildView(
                run_id=ref.run_id,
                task_id=task_id,
                by=ref.by,
                chain=child.chain.name,
                status=child.status.value,
                waiting_for=said,
            )
        )
    update: dict[str, object] = {"children": children}
    if head.status == RunStatus.AWAITING_CHILDREN:
        if waiting is not None:
            update["next_action"] = waiting
        else:
            working = ", ".join(c.run_id for c in children if c.status not in _ENDED)
            update["next_action"] = Wait(
                arguments=wait_call(head.run_id),
                instruction=f"Child runs are working ({working}); call run_status with arguments to wait "
                "for them.",
            )
    return view.model_copy(update=update)


_ENDED = {s.value for s in RunStatus if s.is_terminal}


async def settle_children(runtime: Runtime, head: RunHead, seconds: float) -> bool:
    """Wait (at most ``seconds``) until the live children of a run that awaits them settle too
    (theirs in turn), so that a waiting call answers with what a child needs rather than "wait".
    True when a child has ended (its end is about to be recorded on the run, which moves on)."""
    deadline = anyio.current_time() + seconds
    for _, ref in live_children(head):
        for _ in range(100):
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                return False
            try:
                child = await runtime.wait_settled(ref.run_id, remaining)
            except RunNotFound:
                await anyio.sleep(min(0.05, remaining))  # about to be created
                continue
            if child.status.is_terminal:
                return True
            if child.status == RunStatus.AWAITING_CHILDREN:
                # A grandchild that ended moves the child on, not yet the run.
                await settle_children(runtime, child, deadline - anyio.current_time())
            break
    return False


class Tombstones(Protocol):
    """Where the tombstones of deleted runs are read (the runtime; a store)."""

    async def tombstone(self, run_id: str) -> Tombstone | None: ...


async def with_gone_links(view: RunView, runs: Tombstones) -> RunView:
    """``view`` with its links to other runs (``forked_from``, ``parent``) saying when that run
    was pruned or moved to another store (its tombstone: one read per link, only for runs that
    have one)."""
    updates: dict[str, object] = {}
    for name, link in (("forked_from", view.forked_from), ("parent", view.parent)):
        if link is not None:
            tombstone = await runs.tombstone(link.run_id)
            if tombstone is not None:
                updates[name] = link.model_copy(update={"gone": tombstone.reason})
    return view.model_copy(update=updates) if updates else view

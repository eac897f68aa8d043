"""Child runs: a step that runs another chain, and a host that splits its task into sub-chains (what a
user sees: docs/chains.md, Child runs).

Never a second child and never none: the child's run id and idempotency key derive from the parent
run and the task instance (:func:`child_key`), ``child_started`` is recorded before the child is
created, and whoever looks next creates a child a crash left uncreated (:meth:`ChildRuns.ensure`).
A child's end is recorded on its parent in one compare-and-swap made only while the parent still
lists the child as active, so a second recorder (another process, :meth:`ChildRuns.sweep`) writes
nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Protocol

from orchestration.chains.catalog import Catalog
from orchestration.chains.prompts import upstream_task_ids
from orchestration.core.clock import Clock
from orchestration.core.facts import ChildEnded, ChildStarted, Fact, RunCreated, TaskCompleted, TaskFailed
from orchestration.core.fold import apply, apply_write
from orchestration.core.ids import validate_run_id
from orchestration.core.inputs import StartRequest
from orchestration.core.models import (
    ChainSnapshot,
    ChildRef,
    ParentLink,
    RunHead,
    TypedError,
    canonical_hash,
    text_hash,
)
from orchestration.core.routing import chain_format
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.core.wake import time_limit
from orchestration.engine.changes import ChangeFeed
from orchestration.engine.reading import read_outputs
from orchestration.errors import (
    Conflict,
    ConstructError,
    InvalidArgument,
    InvalidState,
    RunNotFound,
    StoreError,
    UnknownChain,
    VersionConflict,
    quoted,
)
from orchestration.store import RunStore

log = logging.getLogger("construct.children")

Resolve = Callable[[str], ChainSnapshot]
Changed = Callable[[RunHead], Awaitable[None]]

#: the error code a step gets for each way its child can fail
FAILURE_CODES = {
    RunStatus.FAILED: "child_failed",
    RunStatus.REJECTED: "child_rejected",
    RunStatus.CANCELLED: "child_cancelled",
}


def child_key(run_id: str, task_id: str) -> str:
    """The idempotency key of the child run of task instance ``task_id`` of run ``run_id``."""
    return f"child:{run_id}:{task_id}"


def live_children(head: RunHead) -> list[tuple[str, ChildRef]]:
    """``(task_id, child)`` for every child of the run not yet recorded as ended."""
    return [(t.task_id, c) for t in head.tasks for c in t.children or () if c.status == "active"]


class ParentRuntime(Protocol):
    """What :class:`ChildRuns` uses of the runtime that made it."""

    store: RunStore
    clock: Clock
    catalog: Catalog

    #: the runtime's change notification, told of every write a child run's records make
    changes: ChangeFeed

    def add_listener(self, listener: Changed) -> None: ...

    async def cancel(self, run_id: str, reason: str | None = None, by: str | None = None) -> RunHead: ...

    async def start(self, request: StartRequest) -> tuple[RunHead, bool]: ...


class ChildRuns:
    """The child-run use cases of one runtime, over its store. It listens to every write the
    runtime makes (:meth:`changed`)."""

    def __init__(self, runtime: ParentRuntime) -> None:
        self.store = runtime.store
        self.clock = runtime.clock
        self.resolve: Resolve = runtime.catalog.resolve
        # The runtime's bookkeeping after a write (log, waiters, listeners): a child's records are
        # written like any external event's.
        self.changes = runtime.changes
        self._cancel = runtime.cancel
        self._start = runtime.start
        runtime.add_listener(self.changed)

    async def _append(self, head: RunHead, facts: Sequence[Fact]) -> RunHead:
        stored = await self.store.append(head.run_id, head.version, facts, apply_write(head, facts))
        await self.changes.recorded(facts, stored)
        return stored

    # -- a step's child ------------------------------------------------------------------------

    async def ensure(self, parent: RunHead, task_id: str) -> bool:
        """Make sure the child the parent's task ``task_id`` names exists (creating it, idempotently,
        when a crash came between ``child_started`` and the creation), and record its end on the
        parent if it has ended. True when that changed the parent (decide again)."""
        task = parent.task(task_id)
        refs = [c for c in task.children or () if c.by == "step" and c.status == "active"]
        if not refs or task.status != TaskStatus.RUNNING:
            return False
        ref = refs[-1]
        try:
            child = await self.store.load(ref.run_id)
        except RunNotFound:
            try:
                child = await self._create(parent, task_id, ref.run_id)
            except UnknownChain as exc:
                error = TypedError(code="unknown_chain", message=exc.message)
                return await self._record_end(parent.run_id, task_id, ref.run_id, RunStatus.FAILED, error)
        if not child.status.is_terminal:
            return False
        return await self.record_end(child)

    async def _create(self, parent: RunHead, task_id: str, child_run_id: str) -> RunHead:
        step = parent.step_of(task_id)
        assert step.chain is not None
        chain = self.resolve(step.chain)
        request = await child_request(self.store, parent, task_id)
        link = ParentLink(run_id=parent.run_id, task_id=task_id, depth=_depth(parent) + 1)
        fact = RunCreated(
            seq=1,
            at=self.clock.now(),
            run_id=child_run_id,
            request=request,
            chain=chain,
            chain_hash=chain.content_hash(),
            contract=parent.contract,
            idempotency_key=child_key(parent.run_id, task_id),
            # Stable across retries: what makes a second creation "the same request".
            request_hash=canonical_hash({"parent": parent.run_id, "task": task_id, "chain": step.chain}),
            deadline_at=time_limit(parent),
            format=chain_format(chain),
            started_by=parent.started_by,
            parent=link,
            # the parent's delegation: the child's agent steps go on counting its hops
            delegation=parent.delegation,
        )
        result = await self.store.create(apply(None, fact), [fact])
        if result.created:
            log.info(
                "child run created",
                extra={"action": "child_created", "run_id": child_run_id, "parent": parent.run_id},
            )
            await self.changes.changed(result.head)
            # A parent that ended while the child was being created (a cancel racing the drive)
            # did not see it to cancel it: do it now.
            current = await self.store.load(parent.run_id)
            if current.status.is_terminal:
                await self.cancel_child(
                    child_run_id, f"its parent run {parent.run_id} is {current.status.value}"
                )
                return await self.store.load(child_run_id)
        return result.head

    # -- a host's child ----------------------------------------------------------------------------

    async def start_for_host(
        self, request: StartRequest, parent_run_id: str, parent_task_id: str
    ) -> tuple[RunHead, bool]:
        """Start a run as a child of the host task ``parent_task_id`` of run ``parent_run_id``
        (the task the host works on): the child's head names its parent, its deadline is bounded
        by the parent's time limit, and the parent's task lists it (a ``child_started`` fact,
        recorded once the child exists; repeating the start with the same idempotency key links
        the same child once). Refused (``invalid_state``) when the task does not await the host,
        the run has ended or has ``max_children`` live children, or the child would be deeper
        than its chain's ``max_depth``."""
        validate_run_id(parent_run_id)
        parent = await self.store.load(parent_run_id)
        check_parent(parent, parent_task_id, None)
        depth = _depth(parent) + 1
        if depth > parent.chain.max_depth:
            raise InvalidState(
                f"a child of run {parent_run_id} would be at depth {depth}; its chain allows "
                f"{parent.chain.max_depth} (max_depth)"
            )
        link = ParentLink(run_id=parent_run_id, task_id=parent_task_id, depth=depth)
        delegation = request.delegation or parent.delegation  # the hops go on through a child
        child, created = await self._start(
            replace(request, parent=link, parent_deadline=time_limit(parent), delegation=delegation)
        )
        if child.parent is None or (child.parent.run_id, child.parent.task_id) != (
            parent_run_id,
            parent_task_id,
        ):
            raise Conflict(
                f"idempotency_key {quoted(request.idempotency_key)} was already used for run {child.run_id}, "
                f"which is not a child of task {parent_task_id} of run {parent_run_id}; use a new key"
            )
        while True:
            parent = await self.store.load(parent_run_id)
            task = parent.task(parent_task_id)
            if any(c.run_id == child.run_id for c in task.children or ()):
                return child, created
            try:
                check_parent(parent, parent_task_id, parent.chain.max_children)
            except ConstructError:
                if created:
                    await self.cancel_child(child.run_id, "it could not be tied to its parent task")
                raise
            try:
                await self._append(
                    parent, [host_child_started(parent, parent_task_id, child, self.clock.now())]
                )
            except VersionConflict:
                continue
            return child, created

    # -- a child's end -------------------------------------------------------------------------

    async def record_end(self, child: RunHead) -> bool:
        """Record the end of the terminal run ``child`` on its parent: ``child_ended`` and, for a
        step's child, the step's outcome. Idempotent: nothing is written when the parent has
        ended or already records it. True when something was written."""
        link = child.parent
        if link is None or not child.status.is_terminal:
            return False
        error = child.error
        output: TaskCompleted | None = None
        if child.status in (RunStatus.COMPLETED, RunStatus.COMPLETED_WITH_FAILURES):
            parent = await self.store.load(link.run_id)
            output = await self._output(parent, link.task_id, child)
            if output is None:
                missing = f"child run {child.run_id} has no done task to take the output of"
                error = TypedError(code="child_no_output", message=missing)
        return await self._record_end(link.run_id, link.task_id, child.run_id, child.status, error, output)

    async def _output(self, parent: RunHead, task_id: str, child: RunHead) -> TaskCompleted | None:
        try:
            wanted = parent.step_of(task_id).output_of
        except KeyError:
            return None
        done = [t for t in child.tasks if t.status == TaskStatus.DONE and t.output_seq is not None]
        if wanted is not None:
            done = [t for t in done if t.step_name == wanted]
        if not done:
            return None
        fact = await self.store.read_fact(child.run_id, done[-1].output_seq or 0)
        return fact if isinstance(fact, TaskCompleted) else None

    async def _record_end(
        self,
        parent_id: str,
        task_id: str,
        child_id: str,
        status: RunStatus,
        error: TypedError | None,
        output: TaskCompleted | None = None,
    ) -> bool:
        while True:
            parent = await self.store.load(parent_id)
            if parent.status.is_terminal:
                return False
            try:
                task = parent.task(task_id)
            except KeyError:
                return False
            ref = next((c for c in task.children or () if c.run_id == child_id), None)
            if ref is None or ref.status != "active":
                return False
            now = self.clock.now()
            seq = parent.last_seq + 1
            ended = ChildEnded(
                seq=seq, at=now, task_id=task_id, child_run_id=child_id, status=status.value, error=error
            )
            facts: list[Fact] = [ended]
            if ref.by == "step" and task.status == TaskStatus.RUNNING:
                if output is not None:
                    facts.append(
                        TaskCompleted(
                            seq=seq + 1,
                            at=now,
                            task_id=task_id,
                            attempt=len(task.attempts) or 1,
                            executor=f"child:{child_id}",
                            output=output.output,
                            output_sha256=text_hash(output.output),
                        )
                    )
                else:
                    failure = _failure(child_id, status, error)
                    facts.append(TaskFailed(seq=seq + 1, at=now, task_id=task_id, error=failure))
            try:
                await self._append(parent, facts)
            except VersionConflict:
                continue
            return True

    # -- the listener and the sweep --------------------------------------------------------------

    async def changed(self, head: RunHead) -> None:
        """After every write: a child that ended is recorded on its parent; a run that ended cancels
        its live children."""
        if not head.status.is_terminal:
            return
        if head.parent is not None:
            await self.record_end(head)
        for _, ref in live_children(head):
            await self.cancel_child(ref.run_id, f"its parent run {head.run_id} is {head.status.value}")

    async def cancel_child(self, run_id: str, reason: str) -> None:
        try:
            await self._cancel(run_id, reason, None)
        except RunNotFound:
            pass  # never created (a crash before the creation): nothing to cancel
        except InvalidState:
            pass  # it ended otherwise meanwhile

    async def sweep(self, limit: int = 100) -> int:
        """The safety net: look at the runs that wait for children, create the children a crash
        left uncreated, record the ends nobody recorded. Returns how many parents it changed.
        Holds no lease; every write is a compare-and-swap. Every run ``awaiting_children`` is
        looked at (page by page); of the runs paused otherwise (a host's children, a parallel run's
        children beside a host task or a gate), the newest ``limit`` of each status."""
        changed = 0
        for status in (RunStatus.AWAITING_CHILDREN, RunStatus.AWAITING_HOST, RunStatus.AWAITING_APPROVAL):
            cursor: str | None = None
            while True:
                page = await self.store.list_runs(frozenset({status}), limit, cursor)
                for parent in page.runs:
                    changed += await self._sweep_parent(parent)
                cursor = page.next_cursor
                if cursor is None or status != RunStatus.AWAITING_CHILDREN:
                    break
        return changed

    async def _sweep_parent(self, parent: RunHead) -> int:
        changed = 0
        for task_id, ref in live_children(parent):
            try:
                if ref.by == "step":
                    changed += await self.ensure(parent, task_id)
                    continue
                changed += await self.record_end(await self.store.load(ref.run_id))
            except StoreError:
                raise
            except ConstructError as exc:
                log.warning(
                    "child run %s of %s could not be checked: %s",
                    ref.run_id,
                    parent.run_id,
                    exc,
                    extra={"action": "child_sweep_failed", "run_id": parent.run_id},
                )
        return changed


def _depth(head: RunHead) -> int:
    return head.parent.depth if head.parent is not None else 0


def _failure(child_id: str, status: RunStatus, error: TypedError | None) -> TypedError:
    code = FAILURE_CODES.get(status, "child_failed")
    why = f": {error.code}: {error.message}" if error is not None else ""
    return TypedError(code=code, message=f"child run {child_id} ended {status.value}{why}")


async def child_request(store: RunStore, parent: RunHead, task_id: str) -> str:
    """The request a step's child run works on: the parent's request, the work the step would see
    (the outputs of its upstream tasks), and the step's own instruction."""
    step = parent.step_of(task_id)
    upstream = upstream_task_ids(parent, task_id)
    outputs = await read_outputs(store, parent, upstream)
    parts = [parent.request.strip()]
    if upstream:
        parts += ["", f"## Work so far (run {parent.run_id})"]
        for tid in upstream:
            parts += ["", f"### {tid} ({parent.task(tid).specialist})", "", outputs[tid].strip()]
    if step.instruction:
        parts += ["", "## Instruction", "", step.instruction.strip()]
    return "\n".join(parts)


def refuse_detached(head: RunHead, task_id: str, detach: bool) -> None:
    """Refuse to complete a host task while children it started are live (``InvalidState``),
    unless ``detach``."""
    if detach:
        return
    try:
        task = head.task(task_id)
    except KeyError:
        return
    if task.status.is_terminal:
        return  # a repeat of an output already recorded
    live = [c.run_id for c in task.children or () if c.status == "active"]
    if live:
        raise InvalidState(
            f"task {task_id} of run {head.run_id} has live child runs ({', '.join(live)}); wait for "
            "them to end, or pass detach_children=true to complete it anyway"
        )


def check_parent(head: RunHead, task_id: str, max_children: int | None) -> None:
    """A host's child may be tied to ``task_id`` of run ``head`` (the task awaits the host, the
    run has room for one more live child), else ``InvalidArgument``/``InvalidState``."""
    if head.status.is_terminal:
        raise InvalidState(f"run {head.run_id} is {head.status.value}; it takes no more children")
    try:
        task = head.task(task_id)
    except KeyError:
        tasks = ", ".join(t.task_id for t in head.tasks)
        raise InvalidArgument(f"run {head.run_id} has no task {task_id!r}; its tasks are: {tasks}") from None
    if task.status != TaskStatus.AWAITING_HOST:
        raise InvalidState(
            f"task {task_id} of run {head.run_id} is {task.status.value}; a host starts a child only "
            "for the task it works on (awaiting_host)"
        )
    if max_children is not None and len(live_children(head)) >= max_children:
        raise InvalidState(
            f"run {head.run_id} has {max_children} live child runs (its chain's max_children); "
            "wait for one to end"
        )


def host_child_started(head: RunHead, task_id: str, child: RunHead, at: datetime) -> ChildStarted:
    return ChildStarted(
        seq=head.last_seq + 1,
        at=at,
        task_id=task_id,
        child_run_id=child.run_id,
        chain=child.chain.name,
        by="host",
    )


__all__ = ["ChildRuns", "child_key", "child_request", "live_children", "refuse_detached"]

"""Fork and rewind: a new run that starts from another run's recorded work.

:func:`fork` creates, in one atomic write, a run whose log copies the source's facts of every task
instance that had ended before ``from_task``'s started; folding the copies replays the source (its
routes too), so nothing is decided again or sent to a worker before ``from_task``. The source is
only read. The chain is re-read from the configuration as it is now, and every copied step must be
unchanged in it (else ``fork_mismatch``). The rules in full: docs/operations.md (Fork and rewind).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from orchestration.core.facts import (
    ApprovalDecided,
    ApprovalRequested,
    Fact,
    ForkOrigin,
    RouteDecided,
    RunCreated,
)
from orchestration.core.fold import apply
from orchestration.core.ids import validate_run_id
from orchestration.core.inputs import StartRequest, check_id, check_start, stored_key
from orchestration.core.models import ChainSnapshot, RunHead, canonical_hash
from orchestration.core.routing import chain_format
from orchestration.core.upgrades import step_changes
from orchestration.core.vocabulary import TaskStatus
from orchestration.engine import Runtime, repeated
from orchestration.errors import ForkMismatch, IllegalTransition, InvalidArgument, quoted

log = logging.getLogger("construct.runtime")


@dataclass(frozen=True, slots=True)
class ForkRequest:
    """What a caller asks a fork for (the fields: docs/operations.md, Fork and rewind)."""

    run_id: str
    from_task: str
    request: str | None = None
    chain: str | tuple[str, ...] | None = None
    #: None: the source's gated steps
    approve_before: tuple[str, ...] | None = None
    idempotency_key: str | None = None
    #: the verified identity forking (recorded on the new run's ``run_created``)
    started_by: str | None = None

    def request_hash(self) -> str:
        """What makes two forks "the same" for idempotency: the arguments as given."""
        return canonical_hash(
            {
                "fork_of": self.run_id,
                "from_task": self.from_task,
                "request": self.request,
                "chain": list(self.chain) if isinstance(self.chain, tuple) else self.chain,
                "approve_before": None if self.approve_before is None else sorted(self.approve_before),
            }
        )


async def fork_run(runtime: Runtime, fork: ForkRequest) -> tuple[RunHead, bool]:
    """Create the fork (see the module's docstring) through ``runtime``'s public methods, which
    tell its listeners of the new run. Returns ``(head, created)``; ``created`` is False when an
    earlier fork with the same idempotency key made the run. Raises
    ``RunNotFound``, ``InvalidArgument`` (an unknown or skipped task, bad arguments),
    ``ForkMismatch``, ``Conflict`` (the key used for something else), ``UnknownChain``..."""
    source, start = await _source(runtime, fork)
    facts = await runtime.read_facts(source.run_id, 0, source.last_seq)
    prefix, point = _prefix(facts, source, fork.from_task)
    if prefix.task(fork.from_task).status == TaskStatus.SKIPPED:
        raise InvalidArgument(
            f"task {fork.from_task} of run {source.run_id} was skipped (a route or a revise went past "
            "it): there is nothing to redo from it; fork from a task that ran"
        )
    kept = _ended(prefix)
    chain = runtime.catalog.resolve_again(source.chain, fork.chain, fork.approve_before)
    _check_steps(source.chain, chain, sorted({prefix.task(t).step_name for t in kept}))
    created = _run_created(runtime, source, start, chain, fork)
    copies = _copies([f for f in facts if 1 < f.seq < point], prefix, kept, created.at)
    head = _replay(created, copies, source, fork)
    earlier = None
    if fork.idempotency_key is not None:
        earlier = await runtime.keyed_before_namespaces(fork.idempotency_key, fork.started_by)
    stored, created_now = (earlier, False) if earlier else await runtime.create(head, [created, *copies])
    if not created_now:
        return repeated(stored, head.request_hash, fork.idempotency_key, "fork"), False
    log.info(
        "run forked from %s at %s, %d facts copied",
        source.run_id,
        fork.from_task,
        len(copies),
        extra={"action": "run_forked", "run_id": head.run_id},
    )
    return stored, True


async def _source(runtime: Runtime, fork: ForkRequest) -> tuple[RunHead, StartRequest]:
    """The run forked, which must have ``fork.from_task``, and the new run's start request
    (checked as a start's)."""
    validate_run_id(fork.run_id)
    check_id("from_task", fork.from_task, runtime.limits)
    source = await runtime.status(fork.run_id)
    if fork.from_task not in {t.task_id for t in source.tasks}:
        raise InvalidArgument(
            f"run {source.run_id} has no task {quoted(fork.from_task)}; its tasks are: "
            f"{', '.join(t.task_id for t in source.tasks)}"
        )
    start = StartRequest(
        request=source.request if fork.request is None else fork.request,
        chain=fork.chain,
        approve_before=fork.approve_before or (),
        idempotency_key=fork.idempotency_key,
        worker_backend=source.contract.worker_backend,
        started_by=fork.started_by,
    )
    check_start(start, runtime.limits)
    return source, start


def _run_created(
    runtime: Runtime, source: RunHead, start: StartRequest, chain: ChainSnapshot, fork: ForkRequest
) -> RunCreated:
    """The new run's ``run_created``, made now: the source's time limit counts from the fork."""
    contract = runtime.resolve_contract(start, chain)
    now = runtime.clock.now()
    limit = None if source.deadline_at is None else source.deadline_at - source.created_at
    return RunCreated(
        seq=1,
        at=now,
        deadline_at=None if limit is None else now + limit,
        run_id=validate_run_id(runtime.new_id()),
        request=start.request,
        chain=chain,
        chain_hash=chain.content_hash(),
        contract=contract,
        idempotency_key=None
        if fork.idempotency_key is None
        else stored_key(fork.idempotency_key, fork.started_by),
        request_hash=fork.request_hash(),
        format=max(chain_format(chain), contract.record_format()),
        started_by=fork.started_by,
        forked_from=ForkOrigin(run_id=source.run_id, task_id=fork.from_task),
        # a fork of a delegated run is as far from the delegation's start as its source
        delegation=source.delegation,
    )


def _replay(created: RunCreated, copies: Sequence[Fact], source: RunHead, fork: ForkRequest) -> RunHead:
    """The new run's head, folded from ``created`` and the ``copies``; ``ForkMismatch`` when the
    copies do not fold on the new chain (a copied route that does not replay)."""
    head = apply(None, created)
    try:
        for copy in copies:
            head = apply(head, copy)
    except IllegalTransition as exc:
        raise ForkMismatch(
            f"the recorded work of run {source.run_id} before task {fork.from_task} does not replay "
            f"on chain {created.chain.name!r} as it is now ({exc}); fork from an earlier task"
        ) from exc
    return head


def _concerns(fact: Fact, task_id: str, before_gates: set[str]) -> bool:
    """Whether ``fact`` is about ``task_id``'s instance having started (its own facts, or its
    ``before`` gate being asked)."""
    if isinstance(fact, ApprovalRequested):
        return fact.gate_id in before_gates
    return not isinstance(fact, RouteDecided) and getattr(fact, "task_id", None) == task_id


def _prefix(facts: Sequence[Fact], source: RunHead, task_id: str) -> tuple[RunHead, int]:
    """The source's head just before the fork point, and the fork point's sequence number (the
    first fact about ``task_id``'s instance, or the fact that ended the run, or past the end)."""
    before = {g.gate_id for g in source.gates if g.task_id == task_id and g.position == "before"}
    head: RunHead | None = None
    for fact in facts:
        if head is not None and _concerns(fact, task_id, before):
            return head, fact.seq
        folded = apply(head, fact)
        if head is not None and folded.status.is_terminal:
            return head, fact.seq
        head = folded
    if head is None:  # pragma: no cover - a stored run has its run_created fact
        raise InvalidArgument(f"run {source.run_id} has no facts")
    return head, head.last_seq + 1


def _ended(prefix: RunHead) -> set[str]:
    """The instances whose work is copied: those that had ended, and that the run went on from."""
    return {
        t.task_id
        for t in prefix.tasks
        if t.status in (TaskStatus.DONE, TaskStatus.SKIPPED)
        or (t.status == TaskStatus.FAILED and prefix.step_of(t.task_id).on_failure == "continue")
    }


def _copies(facts: Sequence[Fact], prefix: RunHead, kept: set[str], now: datetime) -> list[Fact]:
    """The copies of ``facts`` (the source's, before the fork point) that belong to ``kept``
    instances, numbered from 2 (after the new ``run_created``)."""
    gate_task = {g.gate_id: g.task_id for g in prefix.gates}
    decided = {f.gate_id for f in facts if isinstance(f, ApprovalDecided)}
    renumbered: dict[int, int] = {}
    out: list[Fact] = []
    for fact in facts:
        if isinstance(fact, (ApprovalRequested, ApprovalDecided)):
            keep = fact.gate_id in decided and gate_task.get(fact.gate_id) in kept
        else:
            keep = getattr(fact, "task_id", None) in kept
        if not keep:
            continue
        seq = renumbered[fact.seq] = len(out) + 2
        update: dict[str, object] = {"seq": seq, "at": now, "copied_from": fact.seq}
        if isinstance(fact, RouteDecided):
            update["output_seq"] = renumbered[fact.output_seq]
        out.append(fact.model_copy(update=update))
    return out


def _check_steps(old: ChainSnapshot, new: ChainSnapshot, copied: Sequence[str]) -> None:
    """Every step whose work is copied is in ``new``, defined as in ``old``, with the same persona."""
    for name in copied:
        if name not in {s.name for s in new.steps}:
            raise ForkMismatch(
                f"chain {new.name!r} has no step {name!r}, whose recorded output the fork copies; "
                f"its steps are: {', '.join(s.name for s in new.steps)}"
            )
        changed = step_changes(old, new, name)
        if changed:
            raise ForkMismatch(
                f"step {name!r}, whose recorded output the fork copies, is defined differently in chain "
                f"{new.name!r} now ({', '.join(changed)}); fork from an earlier task, or keep that step"
            )


__all__ = ["ForkRequest", "fork_run"]

"""The runtime: start, resume, approve, cancel, status and list — and ``drive``, the
decide → act → record loop that advances a run (DESIGN §1).

Two kinds of writes happen here:

* **external events** a caller brings (a new run, a host's output, an approval decision, a
  cancellation). They are recorded with a compare-and-swap on the run's version; a caller that loses
  the race re-reads and re-checks, so exactly one of two racing callers makes each transition, and a
  repeat of the same request returns the current state without appending anything.
* **decisions**, made only by :meth:`Runtime.drive` while it holds the run's lease: it reads the
  run, asks the pure :func:`~orchestration.decide.next_action`, does that one thing, records the
  resulting facts in one write, and reads the run again. Every write of a drive is fenced by its
  lease (the store refuses it once a later claim replaced the lease's token), so a drive that
  stalled past its lease while another worker took the run over records nothing more.

Nothing is ever decided from a value held in memory across a write: after every write the loop
re-reads the record, so a restarted process makes exactly the decision the crashed one would have.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

import anyio

from orchestration.backoff import Backoff, Outage
from orchestration.catalog import Catalog
from orchestration.clock import Clock, SystemClock
from orchestration.decide import (
    PAUSING_ACTIONS,
    Action,
    FailTask,
    FinishRun,
    PrepareHostTask,
    RequestApproval,
    StartAttempt,
    WaitUntil,
    next_action,
)
from orchestration.errors import (
    Conflict,
    ConstructError,
    CorruptRecord,
    IllegalTransition,
    InvalidArgument,
    InvalidState,
    LeaseLost,
    StoreError,
    StoreUnavailable,
    TooLarge,
    VersionConflict,
    quoted,
)
from orchestration.facts import (
    ApprovalDecided,
    ApprovalRequested,
    AttemptFailed,
    AttemptStarted,
    Fact,
    RunCancelled,
    RunCreated,
    RunFinished,
    TaskCompleted,
    TaskFailed,
    apply,
    apply_write,
    with_history,
)
from orchestration.ids import IdGenerator, new_run_id, validate_run_id
from orchestration.models import (
    ChainSnapshot,
    DecisionChannel,
    ExecutionContract,
    GateState,
    RunHead,
    WorkerBackend,
    canonical_hash,
    text_hash,
)
from orchestration.prompts import TaskPrompt, materialize, upstream_task_ids
from orchestration.store import Lease, RunPage, RunStore
from orchestration.vocabulary import RunStatus, TaskStatus
from orchestration.workers.base import AttemptSucceeded, TaskWorker
from orchestration.workers.host import host_output_facts, host_task_prepared

log = logging.getLogger("construct.runtime")

ChangeListener = Callable[[RunHead], Awaitable[None]]

#: How long a drive waits to release its lease before leaving it to expire (short: a server shutting
#: down with its store away must not be held up by it).
_RELEASE_SECONDS = 2.0
ProgressCallback = Callable[[RunHead], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits on what callers send (characters, or items for a list). Over a limit is a
    ``too_large`` error (an idempotency key or a cursor of the wrong length: ``invalid_argument``,
    since no valid one is that long). Every string a caller sends has one: what is recorded (a
    comment, an approver) is copied into the run's head or facts, and a 1 MB approver would slow
    every later write. The MCP tools publish the same bounds in their input schemas."""

    max_request_chars: int = 200_000
    max_output_chars: int = 1_000_000
    #: an approval's comment, a cancellation's reason
    max_comment_chars: int = 20_000
    max_approver_chars: int = 200
    max_idempotency_key_chars: int = 200
    #: a task id, a gate id
    max_id_chars: int = 100
    #: a chain, specialist or step name, a provider or model name
    max_name_chars: int = 100
    #: the specialists of a chain given as a list, the steps named in approve_before
    max_list_items: int = 50
    #: a runs_list cursor (the ones the stores give out are about 150 characters)
    max_cursor_chars: int = 400


@dataclass(frozen=True, slots=True)
class StartRequest:
    request: str
    chain: str | tuple[str, ...] | None = None
    approve_before: tuple[str, ...] = ()
    idempotency_key: str | None = None
    worker_backend: WorkerBackend | None = None
    provider: str | None = None
    model: str | None = None
    #: the whole run's time limit, from start; passing it fails the run with deadline_exceeded
    timeout_seconds: float | None = None
    #: each task's time limit, for steps whose chain definition sets none
    task_timeout_seconds: float | None = None
    #: the verified identity starting the run (recorded on ``run_created``); not part of the
    #: request's hash: who retries a start does not make it another request
    started_by: str | None = None

    def request_hash(self) -> str:
        """What makes two starts "the same request" for idempotency."""
        return canonical_hash(
            {
                "request": self.request,
                "chain": list(self.chain) if isinstance(self.chain, tuple) else self.chain,
                "approve_before": sorted(self.approve_before),
                "worker_backend": self.worker_backend,
                "provider": self.provider,
                "model": self.model,
                "timeout_seconds": self.timeout_seconds,
                "task_timeout_seconds": self.task_timeout_seconds,
            }
        )


ContractResolver = Callable[[StartRequest, ChainSnapshot], ExecutionContract]


def inline_contract(request: StartRequest, _: ChainSnapshot) -> ExecutionContract:
    if request.worker_backend not in (None, "inline"):
        raise InvalidArgument(
            f"worker_backend {quoted(request.worker_backend)} is not available on this server; use 'inline'"
        )
    return ExecutionContract(worker_backend="inline")


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """Everything a view of a run needs: the head with every task's history (see
    :func:`~orchestration.facts.with_history`), the outputs of done tasks, and the prompts of the
    task the host must run now (if any)."""

    head: RunHead
    outputs: dict[str, str]
    host_task: TaskPrompt | None
    warnings: tuple[str, ...] = ()


@dataclass
class _Hold:
    """The lease one drive holds. Renewal replaces it (same token, later expiry); a claim this
    runtime made again on the run meanwhile is handed over here (:meth:`Runtime.hand_over`), so
    the drive's next write carries the current token."""

    lease: Lease
    #: set when a renewal found the lease replaced by another claim (the drive then stops)
    lost: bool = False


@dataclass
class _Waiters:
    events: dict[str, anyio.Event] = field(default_factory=dict)

    def event(self, run_id: str) -> anyio.Event:
        ev = self.events.get(run_id)
        if ev is None:
            ev = self.events[run_id] = anyio.Event()
        return ev

    def fire(self, run_id: str) -> None:
        ev = self.events.pop(run_id, None)
        if ev is not None:
            ev.set()


def is_settled(head: RunHead, now: datetime) -> bool:
    """A run is settled when it needs someone outside the server (a host, an approver), has
    ended, or waits durably until a time in the future."""
    if head.status.is_terminal or head.status in (RunStatus.AWAITING_APPROVAL, RunStatus.AWAITING_HOST):
        return True
    return head.status == RunStatus.QUEUED and head.not_before is not None and head.not_before > now


class Runtime:
    """The orchestration use cases over one :class:`RunStore`. All I/O seams are injected."""

    def __init__(
        self,
        store: RunStore,
        catalog: Catalog,
        *,
        clock: Clock | None = None,
        new_id: IdGenerator = new_run_id,
        limits: Limits = Limits(),
        owner: str = "runtime",
        lease_ttl_seconds: float = 30.0,
        resolve_contract: ContractResolver = inline_contract,
        worker: TaskWorker | None = None,
        in_memory_wait_cap_seconds: float = 30.0,
        cancel_poll_seconds: float = 0.5,
        warnings: Sequence[str] = (),
        store_outage_seconds: float = 30.0,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.clock = clock or SystemClock()
        self.new_id = new_id
        self.limits = limits
        self.owner = owner
        self.lease_ttl_seconds = lease_ttl_seconds
        self.resolve_contract = resolve_contract
        self.worker = worker
        self.in_memory_wait_cap_seconds = in_memory_wait_cap_seconds
        self.cancel_poll_seconds = cancel_poll_seconds
        self.warnings = tuple(warnings)
        #: how long a drive rides out a store outage (its writes wait, its call goes on) before it
        #: stops; see :meth:`drive`
        self.store_outage_seconds = store_outage_seconds
        self._listeners: list[ChangeListener] = []
        self._waiters = _Waiters()
        self._cancel_scopes: dict[str, anyio.CancelScope] = {}
        self._stopping = False
        #: how long :meth:`drive` leaves a run alone after its record could not be read
        self.unreadable_retry_seconds = 60.0
        self._unreadable: dict[str, datetime] = {}
        #: the runs this runtime is driving now (None while the drive is claiming): one drive per run
        self._driving: dict[str, _Hold | None] = {}
        #: leases a drive could not release (the store was away); see :meth:`release_unreleased`
        self._unreleased: dict[str, Lease] = {}

    def stop(self) -> None:
        """Graceful shutdown: every ``drive`` returns at its next step boundary (after the write in
        progress), so nothing new is started; what is left is picked up from the record later."""
        self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- change notification ---------------------------------------------------------------

    def add_listener(self, listener: ChangeListener) -> None:
        """``listener(head)`` is awaited after every write this runtime makes (errors are logged)."""
        self._listeners.append(listener)

    async def _changed(self, head: RunHead) -> None:
        self._waiters.fire(head.run_id)
        for listener in self._listeners:
            try:
                await listener(head)
            except Exception:
                log.exception("listener failed", extra={"action": "listener_failed", "run_id": head.run_id})

    async def _append(
        self,
        head: RunHead,
        facts: Sequence[Fact],
        outage: Outage | None = None,
        hold: _Hold | None = None,
    ) -> RunHead:
        """Record ``facts`` on top of ``head`` (compare-and-swap). A drive passes its ``outage`` and
        its lease (``hold``): the write is then fenced by the lease (``LeaseLost`` once another
        claim replaced it), and a store error does not end it: see :meth:`_append_through_outage`.
        External events pass neither."""
        new_head = apply_write(head, facts)
        if outage is None or hold is None:
            stored = await self.store.append(head.run_id, head.version, facts, new_head)
        else:
            stored = await self._append_through_outage(head, facts, new_head, outage, hold)
        log.info(
            "recorded %s",
            ",".join(f.type for f in facts),
            extra={"action": "facts_recorded", "run_id": head.run_id, "version": stored.version},
        )
        await self._changed(stored)
        return stored

    # -- queries ---------------------------------------------------------------------------

    async def status(self, run_id: str) -> RunHead:
        return await self.store.load(validate_run_id(run_id))

    async def list_runs(
        self, statuses: frozenset[RunStatus] | None = None, limit: int = 50, cursor: str | None = None
    ) -> RunPage:
        if not 1 <= limit <= 500:
            raise InvalidArgument(f"limit must be between 1 and 500, not {limit}")
        if cursor is not None and len(cursor) > self.limits.max_cursor_chars:
            raise InvalidArgument(
                f"cursor {quoted(cursor, 60)} is not a cursor this server gave out; "
                "omit it to start from the newest run"
            )
        return await self.store.list_runs(statuses, limit, cursor)

    async def outputs(self, head: RunHead, task_ids: Sequence[str] | None = None) -> dict[str, str]:
        """The persisted outputs of done tasks (all of them, or ``task_ids``), read from facts."""
        out: dict[str, str] = {}
        for task in head.tasks:
            if task.output_seq is None or (task_ids is not None and task.task_id not in task_ids):
                continue
            fact = await self.store.read_fact(head.run_id, task.output_seq)
            if not isinstance(fact, TaskCompleted):
                raise InvalidState(f"run {head.run_id}: fact {task.output_seq} is not a task output")
            out[task.task_id] = fact.output
        return out

    async def prompt_for(self, head: RunHead, task_id: str) -> TaskPrompt:
        """Materialize ``task_id``'s prompts from the persisted record only."""
        upstream = upstream_task_ids(head, task_id)
        return materialize(head, task_id, await self.outputs(head, upstream))

    async def snapshot(self, run_id: str, head: RunHead | None = None) -> RunSnapshot:
        """The run as a view shows it, read in one pass over its log (up to ``head``)."""
        head = head or await self.status(run_id)
        facts = await self.store.read_facts(head.run_id, 0, head.last_seq)
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
        return RunSnapshot(head, outputs, host_task, self.warnings)

    # -- external events -------------------------------------------------------------------

    async def start(self, request: StartRequest) -> tuple[RunHead, bool]:
        """Create a run. Returns ``(head, created)``; ``created`` is False when an earlier start with
        the same idempotency key and the same request made the run. The same key with a different
        request is a ``Conflict``."""
        text = request.request
        if not isinstance(text, str) or not text.strip():
            raise InvalidArgument("request is empty; say what the chain should work on")
        if len(text) > self.limits.max_request_chars:
            raise TooLarge(
                f"request is {len(text)} characters; the limit is {self.limits.max_request_chars} "
                "(CONSTRUCT_MAX_REQUEST_CHARS)"
            )
        key = request.idempotency_key
        if key is not None and not 1 <= len(key) <= self.limits.max_idempotency_key_chars:
            raise InvalidArgument(
                f"idempotency_key must be 1-{self.limits.max_idempotency_key_chars} characters"
            )
        self._check_names(request)
        for name, value in (
            ("timeout_seconds", request.timeout_seconds),
            ("task_timeout_seconds", request.task_timeout_seconds),
        ):
            if value is not None and not 0 < value <= 30 * 86400:
                raise InvalidArgument(f"{name} must be between 0 and 2592000 (30 days), not {value}")
        chain = self.catalog.resolve(request.chain, request.approve_before)
        if request.task_timeout_seconds is not None:
            steps = tuple(
                s
                if s.timeout_seconds is not None
                else s.model_copy(update={"timeout_seconds": request.task_timeout_seconds})
                for s in chain.steps
            )
            chain = chain.model_copy(update={"steps": steps})
        contract = self.resolve_contract(request, chain)
        run_id = validate_run_id(self.new_id())
        now = self.clock.now()
        deadline = (
            None if request.timeout_seconds is None else now + timedelta(seconds=request.timeout_seconds)
        )
        fact = RunCreated(
            seq=1,
            at=now,
            deadline_at=deadline,
            run_id=run_id,
            request=text,
            chain=chain,
            chain_hash=chain.content_hash(),
            contract=contract,
            idempotency_key=key,
            request_hash=request.request_hash(),
            started_by=request.started_by,
        )
        head = apply(None, fact)
        result = await self.store.create(head, [fact])
        if not result.created:
            if result.head.request_hash != head.request_hash:
                raise Conflict(
                    f"idempotency_key {quoted(key)} was already used for run {result.head.run_id} with a "
                    "different request; use a new key, or repeat the original request exactly"
                )
            return result.head, False
        log.info("run created", extra={"action": "run_created", "run_id": run_id})
        await self._changed(result.head)
        return result.head, True

    def _check_names(self, request: StartRequest) -> None:
        """Bound the names a start carries (the chain, approve_before, provider and model): they are
        copied into the run, and an error quoting one must stay short."""
        limits = self.limits
        names: list[tuple[str, str | None]] = [("provider", request.provider), ("model", request.model)]
        for field_name, values in (("chain", request.chain), ("approve_before", request.approve_before)):
            if isinstance(values, str) or values is None:
                names.append((field_name, values))
                continue
            if len(values) > limits.max_list_items:
                raise TooLarge(f"{field_name} has {len(values)} items; the limit is {limits.max_list_items}")
            names += [(f"{field_name}[{i}]", v) for i, v in enumerate(values)]
        for field_name, value in names:
            if value is not None and len(value) > limits.max_name_chars:
                raise TooLarge(
                    f"{field_name} is {len(value)} characters; names have at most {limits.max_name_chars}"
                )

    async def submit_host_output(self, run_id: str, task_id: str, output: str) -> RunHead:
        """Record the host's output for ``task_id``, the task awaiting it. The caller always names
        the task its output answers (there is no "the awaiting one" default): a call retried after
        the run moved on must not land on the next task. Repeating the same output for a task
        that is already done returns the current state and appends nothing; a different output for
        a done task, or output for a task that is not the awaiting one, is a ``Conflict``."""
        validate_run_id(run_id)
        self._check_id("task_id", task_id)
        if not isinstance(output, str) or not output.strip():
            raise InvalidArgument("output is empty; pass the host model's answer for the task")
        if len(output) > self.limits.max_output_chars:
            raise TooLarge(
                f"output is {len(output)} characters; the limit is {self.limits.max_output_chars} "
                "(CONSTRUCT_MAX_OUTPUT_CHARS)"
            )
        while True:
            head = await self.store.load(run_id)
            try:
                task = head.task(task_id)
            except KeyError:
                raise InvalidArgument(
                    f"run {run_id} has no task {quoted(task_id)}; its tasks are: "
                    f"{', '.join(t.task_id for t in head.tasks)}"
                ) from None
            if task.status == TaskStatus.DONE and task.output_seq is not None:
                done = await self.store.read_fact(run_id, task.output_seq)
                if isinstance(done, TaskCompleted) and done.output_sha256 == text_hash(output):
                    return head
                raise Conflict(
                    f"task {task_id} of run {run_id} is already done with a different output; "
                    "a done task's output cannot be replaced"
                )
            if head.status.is_terminal:
                raise InvalidState(f"run {run_id} is {head.status.value}; it takes no more output")
            self._refuse_if_out_of_time(head)
            if task.status != TaskStatus.AWAITING_HOST:
                awaiting = _awaiting_host_task(head)
                hint = f"the task awaiting output is {awaiting!r}" if awaiting else "no task awaits output"
                raise Conflict(
                    f"task {task_id} of run {run_id} is {task.status.value}, not awaiting output; {hint}"
                )
            attempt = task.attempts[-1].number if task.attempts else 1
            facts = host_output_facts(head, task_id, attempt, output, self.clock.now())
            try:
                return await self._append(head, facts)
            except VersionConflict:
                continue

    async def approve(
        self,
        run_id: str,
        decision: Literal["approve", "reject"],
        gate_id: str,
        comment: str | None = None,
        approver: str | None = None,
        *,
        channel: DecisionChannel | None = None,
        verified: bool = False,
    ) -> RunHead:
        """Decide the gate ``gate_id``, which the run must be waiting at. The caller always names
        the gate (there is no "the open one" default): an approval retried after the run moved on
        must not approve the next gate, which nobody has seen. The decision record is immutable:
        the same decision, comment and approver on an already decided gate returns the current
        state and appends nothing, whatever ``channel`` and ``verified`` the repeat came with;
        anything else there is a ``Conflict``. Approving a run that is not awaiting approval is
        ``InvalidState``.

        ``channel`` (how the decision came in) and ``verified`` (whether ``approver`` is an
        identity the edge verified, or only claimed) are recorded with the decision; the edge
        (:mod:`server`) says which."""
        validate_run_id(run_id)
        if decision not in ("approve", "reject"):
            raise InvalidArgument(f"decision must be 'approve' or 'reject', not {quoted(decision)}")
        self._check_id("gate_id", gate_id)
        if comment is not None and len(comment) > self.limits.max_comment_chars:
            raise TooLarge(f"comment is over {self.limits.max_comment_chars} characters")
        if approver is not None and len(approver) > self.limits.max_approver_chars:
            raise TooLarge(f"approver is over {self.limits.max_approver_chars} characters")
        while True:
            head = await self.store.load(run_id)
            gate = _gate_to_decide(head, gate_id)
            if gate.status in ("approved", "rejected"):
                if (gate.status == "approved") != (decision == "approve"):
                    raise Conflict(
                        f"gate {gate.gate_id} of run {run_id} was already {gate.status}; "
                        "a decided gate cannot be changed"
                    )
                if (gate.comment, gate.approver) != (comment, approver):
                    raise Conflict(
                        f"gate {gate.gate_id} of run {run_id} was already {gate.status} with "
                        f"comment {quoted(gate.comment)} by approver {quoted(gate.approver)}; "
                        "a decision's record cannot be changed (repeat it exactly, or leave it)"
                    )
                return head
            self._refuse_if_out_of_time(head)
            if head.status != RunStatus.AWAITING_APPROVAL or gate.status != "requested":
                raise InvalidState(
                    f"run {run_id} is {head.status.value}, not awaiting approval of gate {gate.gate_id}"
                )
            fact = ApprovalDecided(
                seq=head.last_seq + 1,
                at=self.clock.now(),
                gate_id=gate.gate_id,
                decision=decision,
                comment=comment,
                approver=approver,
                channel=channel,
                verified=verified,
            )
            try:
                return await self._append(head, [fact])
            except VersionConflict:
                continue

    async def missing_task_id(self, run_id: str, name: str = "task_id") -> ConstructError:
        """The error for host output given without the task it answers (argument ``name``):
        ``invalid_argument`` naming the task the run awaits output for, or saying that none is
        awaited; ``invalid_state`` when the run has ended. It never picks the task itself: a
        retried call must not record its output as the next task's."""
        head = await self.status(run_id)
        done = [t.task_id for t in head.tasks if t.status == TaskStatus.DONE]
        recorded = f" (output is recorded already for: {', '.join(done)})" if done else ""
        if head.status.is_terminal:
            return InvalidState(
                f"run {run_id} is {head.status.value}; nothing awaits output ({name} was not given){recorded}"
            )
        awaiting = _awaiting_host_task(head)
        if head.status == RunStatus.AWAITING_HOST and awaiting is not None:
            return InvalidArgument(
                f"{name} is missing: name the task your output answers. Run {run_id} awaits output "
                f"for task {awaiting!r}: pass {name}={awaiting!r} if your output is its answer{recorded}"
            )
        return InvalidArgument(
            f"{name} is missing; run {run_id} is {head.status.value} and awaits no host output{recorded}"
        )

    async def missing_gate_id(self, run_id: str, name: str = "gate_id") -> ConstructError:
        """The error for a decision given without the gate it decides (argument ``name``):
        ``invalid_argument`` naming the gate the run waits at, or saying that none waits;
        ``invalid_state`` when the run has ended. It never picks the gate itself: a retried
        approval must not approve the next gate, which nobody has seen."""
        head = await self.status(run_id)
        decided = [f"{g.gate_id} ({g.status})" for g in head.gates if g.decided_at is not None]
        recorded = f" (already decided: {', '.join(decided)})" if decided else ""
        if head.status.is_terminal:
            return InvalidState(
                f"run {run_id} is {head.status.value}; no gate awaits a decision ({name} was not given)"
                f"{recorded}"
            )
        open_gate = next((g for g in head.gates if g.status == "requested"), None)
        if head.status == RunStatus.AWAITING_APPROVAL and open_gate is not None:
            return InvalidArgument(
                f"{name} is missing: name the gate you decide. Run {run_id} awaits a decision at gate "
                f"{open_gate.gate_id!r}: pass {name}={open_gate.gate_id!r} once the user decided it{recorded}"
            )
        return InvalidArgument(
            f"{name} is missing; run {run_id} is {head.status.value}, not awaiting approval{recorded}"
        )

    def _check_id(self, name: str, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise InvalidArgument(f"{name} is empty; pass the id from next_action.{name}")
        if len(value) > self.limits.max_id_chars:
            raise TooLarge(f"{name} is {len(value)} characters; ids have at most {self.limits.max_id_chars}")

    async def cancel(self, run_id: str, reason: str | None = None, by: str | None = None) -> RunHead:
        """Cancel the run. Cancelling a cancelled run returns it unchanged; cancelling a run that
        ended otherwise is ``InvalidState``. A provider call in flight in this process is aborted."""
        validate_run_id(run_id)
        if reason is not None and len(reason) > self.limits.max_comment_chars:
            raise TooLarge(f"reason is over {self.limits.max_comment_chars} characters")
        while True:
            head = await self.store.load(run_id)
            if head.status == RunStatus.CANCELLED:
                return head
            if head.status.is_terminal:
                raise InvalidState(f"run {run_id} is already {head.status.value}; it cannot be cancelled")
            fact = RunCancelled(seq=head.last_seq + 1, at=self.clock.now(), reason=reason, cancelled_by=by)
            try:
                stored = await self._append(head, [fact])
            except VersionConflict:
                continue
            scope = self._cancel_scopes.get(run_id)
            if scope is not None:
                scope.cancel()
            return stored

    async def check_resumable(self, run_id: str) -> RunHead:
        """For a resume without output: the run if it can be advanced by the server now, else the
        error that tells the caller what the run needs instead."""
        head = await self.status(run_id)
        if head.status.is_terminal:
            raise InvalidState(f"run {run_id} is {head.status.value}; there is nothing to resume")
        if head.status == RunStatus.AWAITING_APPROVAL:
            gate = next(g for g in head.gates if g.status == "requested")
            raise InvalidState(
                f"run {run_id} is awaiting approval of gate {gate.gate_id}; call orchestrate_approve"
            )
        if head.status == RunStatus.AWAITING_HOST:
            awaiting = _awaiting_host_task(head)
            raise InvalidArgument(
                f"run {run_id} is awaiting the host's output for task {awaiting!r}; "
                "call orchestrate_resume with task_id and output"
            )
        return head

    def _refuse_if_out_of_time(self, head: RunHead) -> None:
        if head.wake_at is not None and self.clock.now() >= head.wake_at:
            raise InvalidState(
                f"run {head.run_id} ran out of time at {head.wake_at.isoformat()}; "
                "the server records deadline_exceeded"
            )

    # -- waiting ---------------------------------------------------------------------------

    async def wait_settled(
        self,
        run_id: str,
        timeout_seconds: float,
        on_progress: ProgressCallback | None = None,
        poll_seconds: float = 0.25,
    ) -> RunHead:
        """Block (at most ``timeout_seconds``) until the run is settled (see :func:`is_settled`).
        Woken at once by this process's writes; polls the store for other processes' writes.
        Returns the current state early when the runtime is stopping (a server shutting down must
        not be held up by callers waiting)."""
        head = await self.status(run_id)
        deadline = anyio.current_time() + max(0.0, timeout_seconds)
        last_version = head.version
        while not self._stopping and not is_settled(head, self.clock.now()):
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                break
            event = self._waiters.event(run_id)
            with anyio.move_on_after(min(remaining, poll_seconds)):
                await event.wait()
            head = await self.status(run_id)
            if on_progress is not None and head.version != last_version:
                last_version = head.version
                await on_progress(head)
        return head

    # -- the decide -> act -> record loop ----------------------------------------------------

    async def drive(self, run_id: str, lease: Lease | None = None) -> Action | None:
        """Advance the run until it pauses or ends, holding its lease. Returns the pausing action,
        or None when another worker holds the lease, this runtime is already driving the run, or
        the runtime is stopping. May be called at any time from any process: the lease and the
        compare-and-swap decide who advances the run. A drive that meets an unreadable record
        raises ``CorruptRecord``; later drives of that run return None at once for
        :attr:`unreadable_retry_seconds` after the error.

        ``lease``: a lease on the run that this runtime's owner already holds (a dispatcher's
        batch claim); the drive then does not claim again, and renews and releases that lease as
        its own. If this runtime is driving the run already, that drive takes the lease over
        (:meth:`hand_over`) and this call returns None.

        **One drive per run per runtime.** A second drive of a run this runtime is driving (or
        claiming) returns None at once, without claiming: a same-owner claim would replace the
        first drive's lease token and two drives would call the provider twice.

        **The lease is a fence.** Every write the drive makes carries its lease, and the store
        accepts it only while the run's lease still carries its token. When the run was claimed
        again meanwhile — by another worker, typically because this process stalled past the
        lease's expiry (a GC pause, a suspended VM) — the drive stops at its next write or at its
        next renewal (which also cancels a provider call in flight), whichever comes first, records
        nothing more, and raises ``LeaseLost``: the run belongs to the new holder. A lease that
        expired but that nobody claimed again still carries its token, so a slow drive goes on.

        **Store outages.** A drive rides out a short outage: a provider call in flight goes on,
        the write of its outcome waits for the store (an append whose commit status is unknown is
        reconciled by re-reading the run), the lease is renewed again once the store answers. When
        the store has been failing for :attr:`store_outage_seconds`, the drive stops cleanly — a
        call in flight is cancelled rather than finished into a dead store — and raises
        ``StoreUnavailable``; its lease expires (or the dispatcher releases it) and the run is
        resumed later from its facts, the cancelled attempt as an orphan."""
        if lease is not None and lease.owner != self.owner:
            raise InvalidArgument(f"the lease on run {run_id} belongs to {lease.owner}, not to {self.owner}")
        if run_id in self._driving:
            if lease is not None and not self.hand_over(lease):
                await self._release(lease)
            return None
        set_aside = self._unreadable.get(run_id)
        if self._stopping or (set_aside is not None and self.clock.now() < set_aside):
            if lease is not None:
                await self._release(lease)
            return None
        # Taken before the first await, so that a concurrent drive of the run sees it.
        self._driving[run_id] = None
        try:
            if lease is None:
                lease = await self.store.claim_lease(
                    run_id, self.owner, self.lease_ttl_seconds, self.clock.now()
                )
                if lease is None:
                    return None
            hold = self._driving[run_id] = _Hold(lease)
            return await self._drive_holding(run_id, hold)
        finally:
            del self._driving[run_id]

    def hand_over(self, lease: Lease) -> bool:
        """Give ``lease`` — a claim this runtime's owner made again on a run it is driving (a
        dispatcher's batch claim after the drive's lease had expired unrenewed) — to that drive,
        whose old token the claim replaced: its next write and renewal carry the new token.
        False (nothing done) when this runtime is not driving the run."""
        hold = self._driving.get(lease.run_id)
        if hold is None or lease.owner != self.owner:
            return False
        hold.lease = lease
        return True

    async def _drive_holding(self, run_id: str, hold: _Hold) -> Action | None:
        result: Action | None = None
        error: ConstructError | None = None
        outage = Outage(self.store_outage_seconds)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._renew_lease, hold, tg.cancel_scope, outage)
                try:
                    result = await self._loop(run_id, outage, hold)
                except ConstructError as exc:
                    # Raised below, outside the task group, so that the caller gets the error
                    # itself and not an ExceptionGroup around it.
                    error = exc
                tg.cancel_scope.cancel()
            if error is None and result is None and hold.lost:
                # The lease keeper found the lease taken by another claim and stopped the drive.
                error = LeaseLost(
                    f"the lease on run {run_id} was claimed by another worker while {self.owner} "
                    "held it; this drive stopped and leaves the run to the new holder"
                )
            elif error is None and result is None and outage.over:
                # The lease keeper stopped the drive: the store stayed away too long.
                error = StoreUnavailable(
                    f"the store did not answer for {outage.seconds:.0f} s (store_outage_seconds is "
                    f"{self.store_outage_seconds:g}); run {run_id} stopped and resumes from its facts"
                )
            if isinstance(error, LeaseLost):
                log.info(
                    "lease lost: another worker holds the run; this drive stops",
                    extra={"action": "lease_lost", "run_id": run_id},
                )
            if isinstance(error, CorruptRecord):
                # Retrying at every dispatcher poll would only repeat the error: leave the run
                # alone for a while (an operator may repair the file meanwhile). The same for
                # RecordTooNew: a newer version's run is left to it, never decided or written here.
                retry = self.clock.now() + timedelta(seconds=self.unreadable_retry_seconds)
                self._unreadable[run_id] = retry
            if error is not None:
                raise error
            self._unreadable.pop(run_id, None)
        finally:
            await self._release(hold.lease)
        return result

    async def _release(self, lease: Lease) -> None:
        # Shielded (a cancelled drive must still give its lease up) but bounded: with the store
        # away, waiting for it would hold up a shutdown, and the lease expires anyway. Until the
        # release is known to have happened, the lease is kept for release_unreleased.
        self._unreleased[lease.run_id] = lease
        with anyio.CancelScope(shield=True), anyio.move_on_after(_RELEASE_SECONDS):
            try:
                await self.store.release_lease(lease)
            except ConstructError as exc:
                # The store is down: the lease simply expires; the run is picked up again then.
                log.warning(
                    "cannot release lease: %s",
                    exc,
                    extra={"action": "lease_release_failed", "run_id": lease.run_id},
                )
            else:
                if self._unreleased.get(lease.run_id) is lease:
                    del self._unreleased[lease.run_id]

    async def release_unreleased(self, run_id: str) -> None:
        """Release the lease a drive of ``run_id`` could not release (the store was away), if any,
        so that the run can be claimed at once rather than when the lease expires. Raises the
        store's error while it is still away. A lease claimed again since is not touched (the
        release matches the token)."""
        lease = self._unreleased.get(run_id)
        if lease is None:
            return
        await self.store.release_lease(lease)
        if self._unreleased.get(run_id) is lease:
            del self._unreleased[run_id]

    async def _renew_lease(self, hold: _Hold, scope: anyio.CancelScope, outage: Outage) -> None:
        """Keep the drive's lease (``hold.lease``: same token, later expiry) while the drive runs.
        Stops the drive (cancels ``scope``, sets ``hold.lost``) when another claim replaced the
        lease, or when the store has been failing past the outage limit."""
        interval = self.lease_ttl_seconds / 3
        backoff = Backoff(base=min(0.1, interval), cap=interval)
        delay = interval
        while True:
            await anyio.sleep(delay)
            lease = hold.lease
            try:
                renewed = await self.store.renew_lease(lease, self.lease_ttl_seconds, self.clock.now())
            except LeaseLost:
                if hold.lease is not lease:
                    # A new claim was handed over meanwhile: renew that one at once.
                    delay = 0
                    continue
                hold.lost = True
                scope.cancel()
                return
            except CorruptRecord:
                continue
            except StoreError as exc:
                if self._outage_over(outage, lease.run_id, exc):
                    scope.cancel()
                    return
                # Retry sooner than the renewal interval: the lease may run out meanwhile.
                delay = backoff.next_delay()
                continue
            if hold.lease is lease:
                hold.lease = renewed
            outage.recovered()
            backoff.reset()
            delay = interval

    def _outage_over(self, outage: Outage, run_id: str, exc: StoreError) -> bool:
        """Count a store failure against the drive's outage; True (and logged) once it is too long,
        or at once when the runtime is stopping (a shutdown does not wait for the store)."""
        if self._stopping:
            return True
        if not outage.ongoing:
            log.warning(
                "store error during a drive; waiting up to %g s for the store: %s",
                outage.limit_seconds,
                exc,
                extra={"action": "drive_store_error", "run_id": run_id, "code": exc.code},
            )
        outage.failed()
        if outage.over:
            log.warning(
                "store unavailable for %.1f s: stopping the drive",
                outage.seconds,
                extra={"action": "drive_store_outage", "run_id": run_id},
            )
            return True
        return False

    async def _load_through_outage(self, run_id: str, outage: Outage) -> RunHead:
        backoff = Backoff(cap=2.0)
        while True:
            try:
                head = await self.store.load(run_id)
            except CorruptRecord:
                # Unreadable is not unavailable: waiting would not help.
                raise
            except StoreError as exc:
                if self._outage_over(outage, run_id, exc):
                    raise
                await anyio.sleep(backoff.next_delay())
                continue
            outage.recovered()
            return head

    async def _fenced_append(
        self, head: RunHead, facts: Sequence[Fact], new_head: RunHead, hold: _Hold
    ) -> RunHead:
        """``store.append`` fenced by the drive's lease. ``LeaseLost`` ends the drive, unless a
        claim of this runtime was handed over during the write: then it is made with that one."""
        while True:
            lease = hold.lease
            try:
                return await self.store.append(head.run_id, head.version, facts, new_head, lease=lease)
            except LeaseLost:
                if hold.lease is lease:
                    raise

    async def _append_through_outage(
        self, head: RunHead, facts: Sequence[Fact], new_head: RunHead, outage: Outage, hold: _Hold
    ) -> RunHead:
        """``store.append`` fenced by the drive's lease, riding out a store outage up to its limit.

        After a failed append nobody knows whether it committed (the connection may have died
        during COMMIT), so it is never simply sent again: the run is re-read first. Still at the
        version we wrote on: nothing was written, append again (fenced again). Our facts at their
        sequence numbers: it committed, and that is the result. Anything else: another writer
        moved the run (``VersionConflict``; the drive decides again from the record). The
        compare-and-swap makes every path safe: a fact is never lost and never written twice.

        ``LeaseLost`` is not an outage: the store answered, and the answer is that another worker
        holds the run. It is raised at once, whichever append gets it, and nothing is retried."""
        run_id = head.run_id
        backoff = Backoff(cap=2.0)
        try:
            stored = await self._fenced_append(head, facts, new_head, hold)
        except CorruptRecord:
            raise
        except StoreError as exc:
            if self._outage_over(outage, run_id, exc):
                raise
        else:
            outage.recovered()
            return stored
        while True:
            await anyio.sleep(backoff.next_delay())
            try:
                current = await self.store.load(run_id)
                if current.version == head.version:
                    stored = await self._fenced_append(head, facts, new_head, hold)
                    outage.recovered()
                    return stored
                outage.recovered()
                if current.version >= new_head.version and await self._has_facts(run_id, facts):
                    log.info(
                        "an append interrupted by a store error had committed",
                        extra={"action": "append_reconciled", "run_id": run_id, "version": new_head.version},
                    )
                    return new_head
                raise VersionConflict(run_id, head.version, current.version)
            except CorruptRecord:
                raise
            except StoreError as exc:
                if self._outage_over(outage, run_id, exc):
                    raise

    async def _has_facts(self, run_id: str, facts: Sequence[Fact]) -> bool:
        stored = await self.store.read_facts(run_id, facts[0].seq - 1, len(facts))
        return [f.model_dump(mode="json") for f in stored] == [f.model_dump(mode="json") for f in facts]

    async def _loop(self, run_id: str, outage: Outage, hold: _Hold) -> Action | None:
        while not self._stopping:
            head = await self._load_through_outage(run_id, outage)
            action = next_action(head, self.clock.now())
            if isinstance(action, WaitUntil):
                delay = (action.not_before - self.clock.now()).total_seconds()
                if delay <= self.in_memory_wait_cap_seconds:
                    await anyio.sleep(max(0.0, delay))
                    continue
                return action
            if isinstance(action, PAUSING_ACTIONS):
                return action
            try:
                await self._act(head, action, outage, hold)
            except VersionConflict:
                # Someone else wrote (an approval, a cancel): re-read and decide again.
                continue
        return None

    async def _act(self, head: RunHead, action: Action, outage: Outage, hold: _Hold) -> None:
        now = self.clock.now()
        seq = head.last_seq + 1
        if isinstance(action, RequestApproval):
            requested = ApprovalRequested(seq=seq, at=now, gate_id=action.gate_id)
            await self._append(head, [requested], outage, hold)
        elif isinstance(action, PrepareHostTask):
            prompt = await self.prompt_for(head, action.task_id)
            await self._append(head, [host_task_prepared(head, prompt, action.attempt, now)], outage, hold)
        elif isinstance(action, FinishRun):
            finished = RunFinished(seq=seq, at=now, status=action.status, error=action.error)
            await self._append(head, [finished], outage, hold)
        elif isinstance(action, FailTask):
            failed = TaskFailed(seq=seq, at=now, task_id=action.task_id, error=action.error)
            await self._append(head, [failed], outage, hold)
        elif isinstance(action, StartAttempt):
            await self._attempt(head, action, outage, hold)
        else:  # pragma: no cover - pausing actions never reach here
            raise AssertionError(action)

    async def _watch_for_cancel(
        self, run_id: str, version: int, scope: anyio.CancelScope, outage: Outage
    ) -> None:
        """While a provider call is in flight, abort it as soon as the run is written to by anyone
        else (in practice: cancelled from another process or another client), or once the store
        has been away past the outage limit (its outcome could not be recorded)."""
        while True:
            await anyio.sleep(self.cancel_poll_seconds)
            try:
                head = await self.store.load(run_id)
            except CorruptRecord:
                continue
            except StoreError as exc:
                if self._outage_over(outage, run_id, exc):
                    scope.cancel()
                    return
                continue
            except ConstructError:
                continue
            outage.recovered()
            if head.version != version:
                log.info("run changed during a call", extra={"action": "call_aborted", "run_id": run_id})
                scope.cancel()
                return

    async def _attempt(self, head: RunHead, action: StartAttempt, outage: Outage, hold: _Hold) -> None:
        """One provider attempt: record ``attempt_started`` *before* the call, call, record the
        outcome. A crash in between leaves a ``running`` task: an orphan the next worker retries.
        Both writes are fenced by the drive's lease: a drive that lost it meanwhile records no
        outcome (``LeaseLost``), and the worker that holds the run decides about the task."""
        if self.worker is None:
            raise InvalidState(
                f"run {head.run_id} uses the provider backend, which this server has not configured"
            )
        step = head.chain.step(action.task_id)
        executor = head.contract.executor_for(step)
        prompt = await self.prompt_for(head, action.task_id)
        started = AttemptStarted(
            seq=head.last_seq + 1,
            at=self.clock.now(),
            task_id=action.task_id,
            attempt=action.attempt,
            executor=executor,
            possible_duplicate_call=action.possible_duplicate_call,
        )
        head = await self._append(head, [started], outage, hold)
        previous = tuple(a.error for a in head.task(action.task_id).attempts if a.error is not None)
        scope = anyio.CancelScope()
        self._cancel_scopes[head.run_id] = scope
        outcome = None
        # The call may not outlive the run's or the task's deadline.
        limit = head.wake_at
        if limit is not None:
            scope.deadline = anyio.current_time() + max(0.0, (limit - self.clock.now()).total_seconds())
        run_id = head.run_id
        version = head.version

        async def call() -> None:
            nonlocal outcome
            outcome = await self.worker.execute(head.contract, step, prompt, action.attempt, previous)  # type: ignore[union-attr]
            watch.cancel()

        try:
            with scope:
                async with anyio.create_task_group() as tg:
                    watch = tg.cancel_scope
                    tg.start_soon(self._watch_for_cancel, run_id, version, scope, outage)
                    await call()
        finally:
            self._cancel_scopes.pop(run_id, None)
        if outcome is None:
            if outage.over:
                # Stopped by the store outage: the attempt is left as an orphan, retried later.
                raise StoreUnavailable(
                    f"the store did not answer for {outage.seconds:.0f} s; the call for task "
                    f"{action.task_id} of run {run_id} was cancelled and will be retried"
                )
            # Cancelled by orchestrate_cancel (the cancel fact is already recorded) or out of time.
            # In the second case, let the injected clock reach the deadline too, so that the next
            # decision records deadline_exceeded instead of seeing an orphaned attempt.
            if limit is not None and anyio.current_time() >= scope.deadline:
                await anyio.sleep(max(0.0, (limit - self.clock.now()).total_seconds()))
            return
        # The outcome is recorded against the head our attempt_started write produced: if anything
        # was written since (a cancel), the compare-and-swap fails and the loop decides again.
        now = self.clock.now()
        fact: Fact
        if isinstance(outcome, AttemptSucceeded):
            fact = TaskCompleted(
                seq=head.last_seq + 1,
                at=now,
                task_id=action.task_id,
                attempt=action.attempt,
                executor=executor,
                output=outcome.output,
                output_sha256=text_hash(outcome.output),
                telemetry=outcome.telemetry.model_copy(
                    update={
                        "possible_duplicate_call": outcome.telemetry.possible_duplicate_call
                        or action.possible_duplicate_call
                    }
                ),
            )
        else:
            fact = AttemptFailed(
                seq=head.last_seq + 1,
                at=now,
                task_id=action.task_id,
                attempt=action.attempt,
                error=outcome.error,
                telemetry=outcome.telemetry.model_copy(
                    update={
                        "possible_duplicate_call": outcome.telemetry.possible_duplicate_call
                        or action.possible_duplicate_call
                    }
                ),
                not_before=outcome.not_before,
            )
        await self._append(head, [fact], outage, hold)


def _awaiting_host_task(head: RunHead) -> str | None:
    for task in head.tasks:
        if task.status == TaskStatus.AWAITING_HOST:
            return task.task_id
    return None


def _gate_to_decide(head: RunHead, gate_id: str) -> GateState:
    gate = head.gate(gate_id)
    if gate is None:
        known = ", ".join(g.gate_id for g in head.gates) or "none"
        raise InvalidArgument(f"run {head.run_id} has no gate {quoted(gate_id)}; its gates are: {known}")
    return gate


__all__ = [
    "ContractResolver",
    "Limits",
    "RunSnapshot",
    "Runtime",
    "StartRequest",
    "inline_contract",
    "is_settled",
]

"""The runtime: the use cases (start, hand in a host's output, decide a gate, cancel, status, list)
and ``drive``, which advances a run under its lease (:mod:`orchestration.engine.drive`).

A caller's event is recorded with a compare-and-swap on the run's version, together with what
follows from it at once (:mod:`orchestration.engine.host_writes`): of two racing callers one makes
each transition, and a repeat records nothing. Decisions that execute are made only by a drive.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Literal, NoReturn, Protocol

from orchestration.chains.catalog import Catalog
from orchestration.chains.prompts import TaskPrompt
from orchestration.core.approvals import (
    Decision,
    check_answer,
    check_approver,
    check_budget_raise,
    check_decision,
    check_repeat,
    check_repeated_raise,
)
from orchestration.core.clock import Clock, SystemClock
from orchestration.core.costs import BudgetLimits, HostUsage
from orchestration.core.decide import Action
from orchestration.core.facts import (
    ApprovalDecided,
    Fact,
    RunCancelled,
    RunCreated,
    gate_expired,
)
from orchestration.core.fold import apply
from orchestration.core.hops import check_start as check_delegation
from orchestration.core.hops import new_server_id
from orchestration.core.ids import IdGenerator, new_run_id, validate_run_id
from orchestration.core.inputs import (
    ContractResolver,
    Limits,
    StartRequest,
    check_start,
    inline_contract,
    with_task_timeout,
)
from orchestration.core.models import (
    ChainSnapshot,
    DecisionChannel,
    ExecutionContract,
    GateState,
    RunHead,
)
from orchestration.core.routing import RevisePlan, chain_format, revise_plan
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.agent_waits import AgentWaits
from orchestration.engine.chain_versions import ChainVersions
from orchestration.engine.changes import ChangeFeed, ChangeListener, is_settled, wait_until
from orchestration.engine.children import ChildRuns
from orchestration.engine.deltas import OutputDeltas
from orchestration.engine.drive import Drive
from orchestration.engine.host_writes import (
    Forgetful,
    RunMemory,
    create_with_follow_up,
    hand_in,
    held_at,
    record,
    start_with_follow_up,
    write_with_follow_up,
)
from orchestration.engine.leased_run import (
    CallControl,
    LeasedRun,
    LeaseReleases,
    LeaseRenewer,
    RuntimeSettings,
)
from orchestration.engine.reading import (
    RunSnapshot,
    awaited_calls,
    gate_to_decide,
    missing_gate_id_error,
    missing_task_id_error,
    read_log,
    read_outputs,
    read_prompt,
    read_snapshot,
    refuse_if_out_of_time,
    require_resumable,
)
from orchestration.engine.start_window import keyed_before_namespaces, repeated, start_once
from orchestration.engine.upgrading import Upgrade, chain_asked, move_if_due, policy_allows, upgrade_run
from orchestration.errors import (
    ConstructError,
    CorruptRecord,
    InvalidArgument,
    InvalidState,
    TooLarge,
    VersionConflict,
    quoted,
)
from orchestration.store import (
    CreatesClaimed,
    Lease,
    RunPage,
    RunStore,
    Tombstone,
)
from orchestration.tracing import traced_write
from orchestration.workers.port import TaskWorker

log = logging.getLogger("construct.runtime")

ProgressCallback = Callable[[RunHead], Awaitable[None]]

_DEFAULT_LIMITS = Limits()
_DEFAULT_SETTINGS = RuntimeSettings()


class DrivesNewRuns(Protocol):
    """Who drives the runs a runtime creates leased to its own process (the dispatcher)."""

    def has_room(self) -> bool:
        """Whether a run created now would be driven at once (a slot is free)."""
        ...

    async def drive_claimed(self, lease: Lease, head: RunHead) -> None:
        """Drive the run just created under ``lease`` from ``head`` (or give the lease back)."""
        ...


class Runtime:
    """The orchestration use cases over one :class:`RunStore`. All I/O seams are injected."""

    def __init__(
        self,
        store: RunStore,
        catalog: Catalog,
        *,
        clock: Clock | None = None,
        new_id: IdGenerator = new_run_id,
        limits: Limits = _DEFAULT_LIMITS,
        settings: RuntimeSettings = _DEFAULT_SETTINGS,
        resolve_contract: ContractResolver = inline_contract,
        worker: TaskWorker | None = None,
        warnings: Sequence[str] = (),
        server_id: str | None = None,
        memory: RunMemory | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        #: what this process keeps of the runs its host's calls wrote and showed
        self.memory: RunMemory = memory or Forgetful()
        self.catalog = catalog
        self.clock = clock or SystemClock()
        self.new_id = new_id
        self.limits = limits
        self.resolve_contract = resolve_contract
        self.worker = worker
        self.warnings = tuple(warnings)
        #: this server's identity in agent delegations (a loop lists it: orchestration.core.hops)
        self.server_id = server_id or new_server_id()
        #: the listeners and waiters told of every write this runtime (or one of its drives) makes
        self.changes = ChangeFeed()
        #: the cancel scopes of the calls in flight in its drives, and whether it is stopping
        self.calls = CallControl()
        #: the output of the calls in flight, as it is written (memory only, bounded)
        self.deltas = OutputDeltas()
        #: how long :meth:`drive` leaves a run alone after its record could not be read
        self.unreadable_retry_seconds = 60.0
        self._unreadable: dict[str, datetime] = {}
        #: the runs this runtime is driving now (None while the drive is claiming): one drive per run
        self._driving: dict[str, Drive | None] = {}
        #: gives drives' leases back; keeps those it could not (the store was away)
        self._releases = LeaseReleases(store)
        #: renews all its drives' leases, in one store call per renewal interval
        self.renewer = LeaseRenewer(store, self.clock, settings.lease_ttl_seconds)
        self.children = ChildRuns(self)  # a step that runs a chain, a host's sub-chains
        #: follows agent steps' remote runs while their runs are awaiting_agent (no lease, no slot)
        self.agent_waits = AgentWaits(self)
        #: who drives a run this process creates leased to itself (see :meth:`drive_new_runs_with`)
        self._drives_new: DrivesNewRuns | None = None
        self._claimed = store if isinstance(store, CreatesClaimed) else None
        #: the chain versions the store keeps (each configured snapshot a run starts on, numbered)
        self.versions = ChainVersions(store, lambda: self.catalog, self.clock)

    def drive_new_runs_with(self, drives: DrivesNewRuns) -> None:
        """From now on, a run this runtime creates while ``drives`` has room is created leased to
        this process (on a store that :class:`~orchestration.store.CreatesClaimed`) and handed to
        ``drives`` at once: no claim is sent for it. The dispatcher registers itself here."""
        self._drives_new = drives

    def _claims_here(self) -> bool:
        """Whether a run created now would be created leased to this process."""
        return self._claimed is not None and self._drives_new is not None and self._drives_new.has_room()

    def stop(self) -> None:
        """Graceful shutdown: every ``drive`` returns at its next step boundary (after the write in
        progress), so nothing new is started; what is left is picked up from the record later."""
        self.calls.stop()
        self.agent_waits.stop()

    @property
    def stopping(self) -> bool:
        return self.calls.stopping

    # -- change notification ---------------------------------------------------------------

    def add_listener(self, listener: ChangeListener) -> None:
        """``listener(head)`` is awaited after every write this runtime makes (errors are logged)."""
        self.changes.add_listener(listener)

    def remove_listener(self, listener: ChangeListener) -> None:
        """Stop calling ``listener``, which :meth:`add_listener` added."""
        self.changes.remove_listener(listener)

    async def _append(self, head: RunHead, facts: Sequence[Fact]) -> RunHead:
        """Record an external event's ``facts`` on top of ``head`` (compare-and-swap): see
        :func:`~orchestration.engine.host_writes.record`. A drive's writes are its
        :class:`~orchestration.engine.leased_run.LeasedRun`'s (fenced by its lease)."""
        stored, _ = await record(self, head, facts)
        return stored

    # -- queries ---------------------------------------------------------------------------

    async def status(self, run_id: str) -> RunHead:
        return await self.store.load(validate_run_id(run_id))

    @property
    def store_name(self) -> str:
        """The name of the store this runtime records in (what an export names as its source)."""
        return self.store.name

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        """The run's facts with ``seq > after_seq`` in order, at most ``limit`` (the store's
        :meth:`~orchestration.store.RunStore.read_facts`)."""
        return await self.store.read_facts(validate_run_id(run_id), after_seq, limit)

    async def read_log(self, run_id: str) -> tuple[RunHead, tuple[Fact, ...]]:
        """The run's head and every fact up to it, as one consistent snapshot (see
        :func:`~orchestration.engine.reading.read_log`)."""
        return await read_log(self.store, validate_run_id(run_id))

    async def tombstone(self, run_id: str) -> Tombstone | None:
        """What the store keeps of ``run_id`` if it was deleted (pruned, moved), else None."""
        return await self.store.tombstone(run_id)

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
        return await read_outputs(self.store, head, task_ids)

    async def prompt_for(self, head: RunHead, task_id: str) -> TaskPrompt:
        """Materialize ``task_id``'s prompts from the persisted record only."""
        return await read_prompt(self.store, head, task_id)

    async def snapshot(self, run_id: str, head: RunHead | None = None) -> RunSnapshot:
        """The run as a view shows it, read in one pass over its log (up to ``head``)."""
        return await read_snapshot(self.store, head or await self.status(run_id), self.warnings)

    # -- external events -------------------------------------------------------------------

    async def start(self, request: StartRequest) -> tuple[RunHead, bool]:
        """Create a run. Returns ``(head, created)``; ``created`` is False when an earlier start with
        the same idempotency key and the same request made the run. The same key with a different
        request is a ``Conflict``.

        Without a key, a start with a :class:`~orchestration.core.inputs.RetryWindow` (``request.retry``,
        what ``orchestrate_start`` passes) returns the run an identical start by the same identity
        made within the window, ``created`` False, unless it asks for a ``new_run``: see
        :mod:`orchestration.engine.start_window`, which says why that is a look-up by key in the
        store (durable) rather than anything this process remembers.

        An explicit key is the caller's own: stored in the namespace of ``request.started_by``
        (:func:`~orchestration.core.inputs.stored_key`), so the same key sent by another identity
        is another key; a run the same identity started with the key before keys were namespaced
        still answers its repeats (:meth:`keyed_before_namespaces`).

        A start that came through agent delegation (``request.delegation``) and would loop or go
        deeper than the chain's ``max_depth`` is refused before anything is looked up or recorded
        (``delegation_loop``, ``delegation_depth_exceeded``: :mod:`orchestration.core.hops`).

        A new run is created with what follows at once (an inline chain's first host task
        prepared, a first gate requested) in its one first write, kept in :attr:`memory`."""
        check_start(request, self.limits)
        chain = with_task_timeout(
            self.catalog.resolve(request.chain, request.approve_before), request.task_timeout_seconds
        )
        check_delegation(request.delegation, chain, self.server_id)
        contract = self.resolve_contract(request, chain)
        await self.versions.seen_at_start(request.chain)

        async def create(key: str | None) -> tuple[RunHead, bool]:
            return await self._create_run(request, chain, contract, key)

        return await start_once(self.store, request, self.clock, create)

    async def _create_run(
        self,
        request: StartRequest,
        chain: ChainSnapshot,
        contract: ExecutionContract,
        key: str | None,
    ) -> tuple[RunHead, bool]:
        """Create the run ``request`` asks for, under idempotency key ``key`` (the caller's, or
        the retry window's): ``(head, created)`` as :meth:`start` says."""
        run_id = validate_run_id(self.new_id())
        fact = RunCreated(
            seq=1,
            at=(now := self.clock.now()),
            deadline_at=request.deadline(now),
            parent=request.parent,
            run_id=run_id,
            request=request.request,
            chain=chain,
            chain_hash=chain.content_hash(),
            contract=contract,
            idempotency_key=key,
            request_hash=request.request_hash(),
            format=max(chain_format(chain), contract.record_format()),
            started_by=request.started_by,
            traceparent=request.traceparent,
            delegation=request.delegation,
        )
        # What follows at once (an inline chain's first host task, a first gate) is created with
        # the run: one write (orchestration.engine.host_writes).
        first = start_with_follow_up(self, apply(None, fact), [fact])
        lease: Lease | None = None
        if len(first.facts) == 1:  # nothing decided but the run: its first drive traces it
            if self._claimed is not None and self._claims_here():
                # Leased to this process, whose dispatcher drives it at once: no claim, and the
                # other processes' dispatchers need not hear of it (CreatesClaimed).
                result, lease = await self._claimed.create_claimed(
                    first.head, first.facts, self.settings.owner, self.settings.lease_ttl_seconds, now
                )
            else:
                result = await self.store.create(first.head, first.facts)
        else:
            with traced_write(first.head) as traced:
                result = await create_with_follow_up(self, first)
                traced.recorded(first.facts if result.created else (), result.head)
        if not result.created:
            shown = request.idempotency_key if request.idempotency_key is not None else key
            return repeated(result.head, first.head.request_hash, shown, "request"), False
        log.info("run created", extra={"action": "run_created", "run_id": run_id})
        if lease is not None and self._drives_new is not None:
            # Before the change is told: the run is then being driven here, and the change wakes
            # no dispatcher pass for it.
            await self._drives_new.drive_claimed(lease, result.head)
        await self.changes.changed(result.head)
        return result.head, True

    async def keyed_before_namespaces(self, key: str, started_by: str | None) -> RunHead | None:
        """See :func:`orchestration.engine.start_window.keyed_before_namespaces`."""
        return await keyed_before_namespaces(self.store, key, started_by)

    async def create(self, head: RunHead, facts: Sequence[Fact]) -> tuple[RunHead, bool]:
        """Create a run made elsewhere (``head`` folded from ``facts``, ``run_created`` first: a fork,
        :func:`orchestration.ops.forking.fork_run`) in one atomic write, and tell the listeners.
        Returns ``(head, created)``: the stored head, and False when a run with the same
        idempotency key exists already (that run's head; nothing is written or told)."""
        result = await self.store.create(head, facts)
        if result.created:
            await self.changes.changed(result.head)
        return result.head, result.created

    async def submit_host_output(
        self,
        run_id: str,
        task_id: str,
        output: str,
        usage: HostUsage | None = None,
        detach_children: bool = False,
        *,
        by: str | None = None,
        channel: DecisionChannel | None = None,
        verified: bool = False,
    ) -> RunHead:
        """Record the host's output for ``task_id``, the task awaiting it, with the ``usage`` the
        host reports, if any, and what follows from it (the task's completion, the next host task
        prepared, a gate requested, a route, the run's end) in one compare-and-swap without a
        lease, decided by the drive's own pure decision (:mod:`orchestration.engine.host_writes`).
        Returns the run's head after it.

        The caller always names the task its output answers (no "the awaiting one" default): a
        call retried after the run moved on must not land on the next task. The same output again
        for a done task returns the current state and appends nothing; a different output for a
        done task, or output for a task not awaiting it, is a ``Conflict``. A step with an
        ``output_schema`` takes JSON matching it, else ``InvalidOutput`` and nothing is recorded;
        the validated value is in ``task_completed``. A task with live host-started children is
        not complete unless ``detach_children``.

        ``by`` (who handed the output in), ``channel`` (how it came in) and ``verified`` (whether
        ``by`` is an identity the edge verified, or only claimed) are recorded with the submission,
        as :meth:`approve` records its approver; a repeat records nothing, whoever sends it."""
        run_id = validate_run_id(run_id)
        head = await hand_in(
            self, run_id, task_id, output, usage, detach_children, by=by, channel=channel, verified=verified
        )
        return await self.upgrade_if_due(run_id, head) or head

    async def approve(
        self,
        run_id: str,
        decision: Literal["approve", "reject", "revise"],
        gate_id: str,
        comment: str | None = None,
        approver: str | None = None,
        *,
        channel: DecisionChannel | None = None,
        verified: bool = False,
        budget_raise: BudgetLimits | None = None,
    ) -> RunHead:
        """Decide the gate ``gate_id``, which the run must be waiting at, and record what follows
        from the decision with it, in one write (as :meth:`submit_host_output`). The caller always
        names the gate: an approval retried after the run moved on must not approve the next gate.
        The decision record is immutable: the same decision, comment and approver (and, on a budget
        gate, ``budget_raise``) on a decided gate returns the current state and appends nothing,
        whatever ``channel`` and ``verified`` the repeat came with; else ``Conflict``. Approving a
        run not awaiting approval: ``InvalidState``.

        ``revise`` re-runs the step whose output the gate shows, with the comment in its prompt
        (:func:`~orchestration.core.routing.revise_plan`): ``InvalidArgument`` when the gate has no such
        step, ``InvalidState`` when its bound (``max_visits``) is reached; the gate stays open.
        A gate whose step names ``approvers`` takes decisions only from them (``Forbidden``). A
        gate past its ``expires_at`` is decided by expiry, not by a late caller: the expiry is
        recorded then (if no drive did yet) and the call is ``InvalidState``. ``budget_raise``:
        what approving a ``budget`` gate adds (:func:`~orchestration.core.approvals.check_budget_raise`).
        ``channel`` (how the decision came in) and ``verified`` (whether ``approver`` is an
        identity the edge verified, or only claimed) are recorded with the decision."""
        validate_run_id(run_id)
        asked = Decision(decision, gate_id, comment, approver, channel, verified, budget_raise)
        check_decision(asked, self.limits)
        shown = self.memory.last(run_id)
        while True:
            head = await self.store.load(run_id)
            gate = gate_to_decide(head, asked.gate_id)
            check_approver(head, gate, asked.approver, asked.verified)
            if gate.status not in ("pending", "requested"):
                await self._check_repeat(head, gate, asked)
                return head
            try:
                fact = await self._decided(head, gate, asked)
            except VersionConflict:  # an expiry recorded meanwhile: decide again
                continue
            held = await held_at(self, head, shown)
            try:
                written = await write_with_follow_up(self, head, [fact], held)
            except VersionConflict:
                shown = held
                continue
            return await self.upgrade_if_due(run_id, written.head) or written.head

    async def upgrade(
        self,
        run_id: str,
        to: ChainSnapshot | int | None = None,
        *,
        dry_run: bool = True,
        by: str | None = None,
        verified: bool = False,
        reason: str | None = None,
    ) -> Upgrade:
        """Move the run to the chain ``to`` (None: its chain as the configuration has it now; a
        number: that kept version of its chain; either with the options the run was started with)
        where nothing recorded would be reinterpreted (:mod:`orchestration.core.upgrades`) and its
        chain's policy allows it (not ``pinned``), in one write with what follows at once;
        ``dry_run``: only the verdict. ``by``, ``verified`` and ``reason`` are recorded with the
        move. A run on that chain already is left as it is."""
        run_id = validate_run_id(run_id)
        if reason is not None and len(reason) > self.limits.max_comment_chars:
            raise TooLarge(
                f"reason is {len(reason)} characters; the limit is {self.limits.max_comment_chars}"
            )
        chain_of = await chain_asked(self, run_id, to)
        return await upgrade_run(
            self,
            run_id,
            chain_of,
            policy_allows(self.catalog),
            dry_run=dry_run,
            by=by,
            verified=verified,
            reason=reason,
        )

    async def upgrade_if_due(self, run_id: str, head: RunHead | None = None) -> RunHead | None:
        """A run of an ``at_boundary`` chain that is not running and is behind its chain as the
        configuration has it now, moved to it where the move is compatible (recorded ``by``
        ``policy``); the run's head as it is then (None: not read, no chain moves by itself).
        Never raises: a move that fails is logged, and tried again at the run's next pause."""
        if not self.catalog.moves_at_boundary:
            return head
        return await move_if_due(self, self.catalog, run_id, head)

    async def _check_repeat(self, head: RunHead, gate: GateState, asked: Decision) -> None:
        """``asked`` on ``gate``, decided already: nothing to record when it repeats the decision
        exactly (:func:`~orchestration.core.approvals.check_repeat`; for an approved budget gate
        also the raise, read from its ``approval_decided`` fact: the head keeps only its sum),
        else ``Conflict`` (``InvalidArgument`` for a raise with anything but a budget gate's
        approval, as on an open gate)."""
        check_repeat(head, gate, asked.decision, asked.comment, asked.approver)
        check_budget_raise(gate, asked.decision, asked.budget_raise)
        if gate.position != "budget" or gate.status != "approved":
            return
        facts = await self.store.read_facts(head.run_id, 0, head.last_seq)
        decided = (f for f in reversed(facts) if isinstance(f, ApprovalDecided) and f.gate_id == gate.gate_id)
        fact = next(decided, None)
        check_repeated_raise(head, gate, None if fact is None else fact.budget_raise, asked.budget_raise)

    async def _decided(self, head: RunHead, gate: GateState, asked: Decision) -> Fact:
        """The fact that records ``asked`` on ``gate``, not yet decided on ``head``, or the refusal:
        the run must be in time and waiting at the gate, the gate not expired (an expired gate's
        expiry is recorded first: :meth:`_refuse_expired`), the decision one it can take."""
        refuse_if_out_of_time(head, self.clock.now())
        # A requested gate is what waits (a parallel run may wait for a host task too).
        if head.status.is_terminal or gate.status != "requested":
            raise InvalidState(
                f"run {head.run_id} is {head.status.value}, not awaiting approval of gate {gate.gate_id}"
                + awaited_calls(head)
            )
        now = self.clock.now()
        if gate.expires_at is not None and now >= gate.expires_at:
            await self._refuse_expired(head, gate, gate.expires_at, now)
        check_budget_raise(gate, asked.decision, asked.budget_raise)
        check_answer(head, gate, asked)
        if asked.decision == "revise":
            plan = revise_plan(head, gate)
            if not isinstance(plan, RevisePlan):
                refused = f"gate {gate.gate_id} of run {head.run_id} cannot be revised: {plan.reason}"
                raise InvalidState(refused) if plan.bound else InvalidArgument(refused)
        return asked.fact(head.last_seq + 1, now)

    async def _refuse_expired(
        self, head: RunHead, gate: GateState, expires_at: datetime, now: datetime
    ) -> NoReturn:
        """Too late: the gate is decided by expiry. Record it now (as a drive would: it follows
        from the facts), so that it holds without a server, and refuse the decision: it expired
        at ``expires_at`` (``InvalidState``; ``VersionConflict`` when ``head`` is stale)."""
        on_expiry = head.step_of(gate.task_id).on_expiry
        await self._append(head, [gate_expired(head, gate.gate_id, on_expiry, head.last_seq + 1, now)])
        raise InvalidState(
            f"gate {gate.gate_id} of run {head.run_id} expired at {expires_at.isoformat()} and "
            f"was decided by expiry ({on_expiry}); this decision was not recorded"
        )

    async def missing_task_id(self, run_id: str, name: str = "task_id") -> ConstructError:
        """The error for host output given without the task it answers (argument ``name``): see
        :func:`~orchestration.engine.reading.missing_task_id_error`."""
        return missing_task_id_error(await self.status(run_id), name)

    async def missing_gate_id(self, run_id: str, name: str = "gate_id") -> ConstructError:
        """The error for a decision given without the gate it decides (argument ``name``): see
        :func:`~orchestration.engine.reading.missing_gate_id_error`."""
        return missing_gate_id_error(await self.status(run_id), name)

    async def cancel(
        self,
        run_id: str,
        reason: str | None = None,
        by: str | None = None,
        *,
        channel: DecisionChannel | None = None,
        verified: bool = False,
    ) -> RunHead:
        """Cancel the run. Cancelling a cancelled run returns it unchanged; cancelling a run that
        ended otherwise is ``InvalidState``. A provider call in flight in this process is aborted.
        The remote runs of agent steps the run awaits are cancelled first, and the results
        recorded with the cancel (:mod:`orchestration.engine.agent_waits`). ``by``, ``channel``
        and ``verified`` (who asked, how, and whether ``by`` was verified) are recorded with it."""
        validate_run_id(run_id)
        if reason is not None and len(reason) > self.limits.max_comment_chars:
            raise TooLarge(f"reason is over {self.limits.max_comment_chars} characters")
        while True:
            head = await self.store.load(run_id)
            if head.status == RunStatus.CANCELLED:
                return head
            if head.status.is_terminal:
                raise InvalidState(f"run {run_id} is already {head.status.value}; it cannot be cancelled")
            fact = RunCancelled(
                seq=head.last_seq + 1,
                at=self.clock.now(),
                reason=reason,
                cancelled_by=by,
                channel=channel,
                verified=verified,
            )
            try:
                stored = await self._append(head, [fact])
            except VersionConflict:
                continue
            self.calls.cancel(run_id)
            return stored

    async def check_resumable(self, run_id: str) -> RunHead:
        """For a resume without output: the run if it can be advanced by the server now, else the
        error that tells the caller what the run needs instead (see
        :func:`~orchestration.engine.reading.require_resumable`)."""
        return require_resumable(await self.status(run_id))

    # -- waiting ---------------------------------------------------------------------------

    async def wait_settled(
        self,
        run_id: str,
        timeout_seconds: float,
        on_progress: ProgressCallback | None = None,
        poll_seconds: float = 0.25,
    ) -> RunHead:
        """Block (at most ``timeout_seconds``) until the run is settled (see :func:`is_settled`),
        calling ``on_progress`` with each new version seen meanwhile."""
        return await self._wait_until(
            run_id,
            lambda head: is_settled(head, self.clock.now()),
            timeout_seconds,
            on_progress,
            poll_seconds,
        )

    async def wait_for_facts(
        self, run_id: str, after_seq: int, timeout_seconds: float, poll_seconds: float = 0.25
    ) -> RunHead:
        """Block (at most ``timeout_seconds``) until the run has a fact after ``after_seq`` or has
        ended; returns its head then. The cost of a wait is one head read per poll, whatever the
        size of the run."""
        return await self._wait_until(
            run_id,
            lambda head: head.last_seq > after_seq or head.status.is_terminal,
            timeout_seconds,
            None,
            poll_seconds,
        )

    async def _wait_until(
        self,
        run_id: str,
        done: Callable[[RunHead], bool],
        timeout_seconds: float,
        on_progress: ProgressCallback | None,
        poll_seconds: float,
    ) -> RunHead:
        """The run's head once ``done(head)``, or at the timeout (see :func:`wait_until`)."""
        stopping = lambda: self.calls.stopping  # noqa: E731 - read at each poll
        return await wait_until(
            self.status,
            self.changes.waiters,
            stopping,
            run_id,
            done,
            timeout_seconds,
            on_progress,
            poll_seconds,
        )

    # -- driving (the loop itself is orchestration.engine.drive) -------------------------------------

    async def drive(
        self, run_id: str, lease: Lease | None = None, head: RunHead | None = None
    ) -> Action | None:
        """Advance the run until it pauses or ends, holding its lease. Returns the pausing action,
        or None when another worker holds the lease, this runtime is already driving the run, or
        the runtime is stopping. May be called at any time from any process: the lease and the
        compare-and-swap decide who advances the run. A drive that meets an unreadable record
        raises ``CorruptRecord``; later drives of that run return None at once for
        :attr:`unreadable_retry_seconds` after the error.

        ``lease``: a lease on the run that this runtime's owner already holds (a dispatcher's
        batch claim); the drive then does not claim again, and renews and releases that lease as
        its own. If this runtime is driving the run already, that drive takes the lease over
        (:meth:`hand_over`) and this call returns None. ``head``: with ``lease``, the run as this
        runtime recorded it under that lease (a run it created claimed): the drive starts from
        it, without reading the run first (the first write's compare-and-swap checks it).

        **One drive per run per runtime.** A second drive of a run this runtime is driving (or
        claiming) returns None at once, without claiming: a same-owner claim would replace the
        first drive's lease token and two drives would call the provider twice.

        The lease is a fence, and a drive rides out a short store outage: see
        :mod:`orchestration.engine.drive` (``LeaseLost``, ``StoreUnavailable``)."""
        if lease is not None and lease.owner != self.settings.owner:
            raise InvalidArgument(
                f"the lease on run {run_id} belongs to {lease.owner}, not to {self.settings.owner}"
            )
        if run_id in self._driving:
            if lease is not None and not self.hand_over(lease):
                await self._releases.release(lease)
            return None
        if self._left_alone(run_id):
            if lease is not None:
                await self._releases.release(lease)
            return None
        # Taken before the first await, so that a concurrent drive of the run sees it.
        self._driving[run_id] = None
        try:
            return await self._drive_leased(run_id, lease, head if lease is not None else None)
        finally:
            del self._driving[run_id]

    def _left_alone(self, run_id: str) -> bool:
        """Whether the run is not to be driven now: the runtime is stopping, or the run's record
        was unreadable less than :attr:`unreadable_retry_seconds` ago."""
        set_aside = self._unreadable.get(run_id)
        return self.calls.stopping or (set_aside is not None and self.clock.now() < set_aside)

    async def _drive_leased(self, run_id: str, lease: Lease | None, head: RunHead | None) -> Action | None:
        """Run a :class:`Drive` of the run with ``lease``, or with a lease claimed now (None when
        another worker holds it), and release the lease after. A ``CorruptRecord`` sets the run
        aside for :attr:`unreadable_retry_seconds`; a drive that returns clears that."""
        if lease is None:
            lease = await self.store.claim_lease(
                run_id, self.settings.owner, self.settings.lease_ttl_seconds, self.clock.now()
            )
            if lease is None:
                return None
        drive = self._driving[run_id] = self._new_drive(lease, head)
        try:
            result = await drive.run()
        except CorruptRecord:
            # Retrying at every dispatcher poll would only repeat the error: leave the run
            # alone for a while (an operator may repair the file meanwhile). The same for
            # RecordTooNew: a newer version's run is left to it, never decided or written here.
            retry = self.clock.now() + timedelta(seconds=self.unreadable_retry_seconds)
            self._unreadable[run_id] = retry
            raise
        else:
            self._unreadable.pop(run_id, None)
        finally:
            await self._releases.release(drive.lease)
        if result is not None and not self.stopping:
            await self.upgrade_if_due(run_id)  # it paused: where a run of an at_boundary chain moves
        return result

    def _new_drive(self, lease: Lease, head: RunHead | None = None) -> Drive:
        leased = LeasedRun(
            lease,
            store=self.store,
            clock=self.clock,
            settings=self.settings,
            recorded=self.changes.recorded,
            calls=self.calls,
            renewer=self.renewer,
        )
        sink = self.deltas.sink(lease.run_id)
        return Drive(leased, worker=self.worker, children=self.children, head=head, sink=sink)

    def hand_over(self, lease: Lease) -> bool:
        """Give ``lease`` — a claim this runtime's owner made again on a run it is driving (a
        dispatcher's batch claim after the drive's lease had expired unrenewed) — to that drive,
        whose old token the claim replaced: its next write and renewal carry the new token.
        False (nothing done) when this runtime is not driving the run."""
        drive = self._driving.get(lease.run_id)
        if drive is None or lease.owner != self.settings.owner:
            return False
        drive.hand_over(lease)
        return True

    async def release_unreleased(self, run_id: str) -> None:
        """Release the lease a drive of ``run_id`` could not release (the store was away), if any,
        so that the run can be claimed at once rather than when the lease expires. Raises the
        store's error while it is still away. A lease claimed again since is not touched (the
        release matches the token)."""
        await self._releases.release_unreleased(run_id)


__all__ = ["Runtime"]

"""The ``RunStore`` port (DESIGN §6). Its docstrings are the contract every adapter honours; one
conformance suite (``tests/stores``) checks every adapter against them.

A run is an append-only log of facts plus its head. Stores never fold: the writer passes the facts
and the head they produce, and the store persists both atomically, compare-and-swapped on the
head's version. A lease is a fence, not a hint (DESIGN §9): each claim gets a new token, and a
renewal, a release or an append that passes a lease goes through only while the stored lease
carries it, checked in the same atomic step; expiry is judged with the caller's ``now``. A run
leaves a store only through :meth:`RunStore.delete_run`, behind a :class:`Tombstone` that answers
every later use of its id. Optional abilities are protocols of their own, checked where the store
is handed to the engine, never probed at the call.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from orchestration.core.facts import Fact
from orchestration.core.models import ChainSnapshot, RunHead
from orchestration.core.vocabulary import RunStatus
from orchestration.errors import RunMoved, RunNotFound, RunPruned

__all__ = [
    "ChainSource",
    "ChainVersion",
    "ClaimsRunnable",
    "CreateResult",
    "CreatesClaimed",
    "KeepsChainVersions",
    "Lease",
    "NotifiesRunnable",
    "ReadsLeases",
    "RunPage",
    "RunStore",
    "Tombstone",
    "TombstoneReason",
    "new_lease_token",
]


@dataclass(frozen=True, slots=True)
class Lease:
    """A claim on a run: ``owner`` may execute it until ``expires_at`` (renewable). ``token`` is
    unique to the claim that made it (a renewal keeps it): it is what fences the holder's writes."""

    run_id: str
    owner: str
    expires_at: datetime
    token: str


def new_lease_token() -> str:
    """A fresh lease token: 128 random bits, hex. Stores call it at every successful claim."""
    return secrets.token_hex(16)


@dataclass(frozen=True, slots=True)
class RunPage:
    runs: list[RunHead]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class CreateResult:
    head: RunHead
    created: bool


TombstoneReason = Literal["pruned", "moved"]

#: Where a chain version was first seen: the configuration file (or the built-in chains), or a
#: tool call's list of specialists.
ChainSource = Literal["config", "call"]


@dataclass(frozen=True, slots=True)
class ChainVersion:
    """One distinct snapshot of a chain name the server has seen (:class:`KeepsChainVersions`):
    ``ordinal`` counts the name's versions from 1 in the order they were first seen; ``label`` is
    the configuration's ``version`` for the chain when it was first seen (None: none given)."""

    name: str
    ordinal: int
    chain_hash: str
    first_seen: datetime
    source: ChainSource
    label: str | None
    chain: ChainSnapshot


class Tombstone(BaseModel):
    """What a store keeps of a run it deleted (``runs prune``, ``runs import --move``): enough to
    say what became of it (``RunPruned`` / ``RunMoved`` for every later use of the id), and the
    idempotency key it keeps reserved. Like a lease, not a fact; every adapter keeps tombstones.
    Stored as JSON and read back leniently (fields this code does not know are ignored), like heads
    and facts."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    run_id: str
    #: ``pruned``: deleted by retention (it had ended); ``moved``: moved to another store
    reason: TombstoneReason
    #: the run's status and version when it was deleted (``version``: the head the deletion checked)
    status: str
    version: int
    last_seq: int
    idempotency_key: str | None = None
    created_at: datetime
    finished_at: datetime | None = None
    removed_at: datetime
    #: ``moved``: the store it moved to (any password redacted)
    moved_to: str | None = None
    #: the export file written before the deletion, when there was one
    archive: str | None = None
    format: int = Field(default=1, ge=1)

    @classmethod
    def of(
        cls,
        head: RunHead,
        reason: TombstoneReason,
        at: datetime,
        *,
        moved_to: str | None = None,
        archive: str | None = None,
    ) -> Tombstone:
        """The tombstone that deleting ``head``'s run at ``at`` for ``reason`` leaves."""
        return cls(
            run_id=head.run_id,
            reason=reason,
            status=head.status.value,
            version=head.version,
            last_seq=head.last_seq,
            idempotency_key=head.idempotency_key,
            created_at=head.created_at,
            finished_at=head.finished_at,
            removed_at=at,
            moved_to=moved_to,
            archive=archive,
        )

    def error(self, *, by_key: bool = False) -> RunNotFound:
        """The error a use of the deleted run answers with: ``RunPruned`` or ``RunMoved``.
        ``by_key``: for a start whose idempotency key was this run's."""
        when = f"{self.removed_at:%Y-%m-%dT%H:%M:%SZ}"
        subject = (
            f"the run started with this idempotency key ({self.run_id})" if by_key else f"run {self.run_id}"
        )
        if self.reason == "moved":
            return RunMoved(
                self.run_id,
                f"{subject} was moved to another store ({self.moved_to or 'unnamed'}) at {when}; "
                "it continues there: use that store",
            )
        archive = f"; its export is {self.archive}" if self.archive else ""
        retry = "; start with a new idempotency key to run it again" if by_key else ""
        return RunPruned(
            self.run_id,
            f"{subject} was pruned at {when}, after it ended ({self.status}){archive}{retry}",
        )


@runtime_checkable
class RunStore(Protocol):
    """Durable storage for runs. Every method is async and safe to call concurrently, from several
    tasks and (for every adapter but ``memory``) from several processes."""

    name: str

    async def create(
        self, head: RunHead, facts: Sequence[Fact], *, flushing: Callable[[], None] | None = None
    ) -> CreateResult:
        """Create a run from its first write (``head.version == 1``).

        Atomic: either the run with its facts and head exists afterwards, or nothing was written.
        Idempotent by ``head.idempotency_key``: when a run with the same key already exists, nothing
        is written and ``CreateResult(existing_head, created=False)`` is returned (the caller
        compares request hashes). When the key was a deleted run's, nothing is written and that
        run's tombstone error is raised (``RunPruned`` / ``RunMoved``: the key stays reserved, see
        :meth:`delete_run`). Raises ``Conflict`` if a run with the same ``run_id`` exists,
        ``InvalidArgument`` for a malformed run id. ``flushing``: see :meth:`append` (it may be
        called for a create that then creates nothing: its key was taken).
        """
        ...

    async def find_by_idempotency_key(self, key: str) -> RunHead | None:
        """The current head of the run created with idempotency key ``key``, or None when no run
        holds it. A read, never a write: it takes no lock a create waits for, so a create with
        ``key`` running concurrently may or may not be seen (``create`` stays the one atomic
        create-or-return). When the key was a deleted run's, raises that run's tombstone error
        (``RunPruned`` / ``RunMoved``, ``by_key``), as :meth:`create` with the key does: the key
        stays reserved. Also ``CorruptRecord`` / ``RecordTooNew`` as :meth:`load`.

        It lets a caller look a key up before it decides to create under it: the server's retry
        window for ``orchestrate_start`` (:mod:`orchestration.engine.start_window`) reads the keys
        of its recent windows, which it would otherwise have to create a run to probe."""
        ...

    async def load(self, run_id: str) -> RunHead:
        """The current head. Raises ``RunNotFound`` (``RunPruned`` / ``RunMoved``, the tombstone's
        error, for a deleted run), ``InvalidArgument`` (malformed id),
        ``CorruptRecord`` (the stored head cannot be read back), ``RecordTooNew`` (a newer
        version wrote it)."""
        ...

    async def append(
        self,
        run_id: str,
        expected_version: int,
        facts: Sequence[Fact],
        head: RunHead,
        lease: Lease | None = None,
        *,
        flushing: Callable[[], None] | None = None,
    ) -> RunHead:
        """Append ``facts`` and replace the head with ``head``, atomically, if and only if the
        stored head's version is ``expected_version`` (compare-and-swap) and, when ``lease`` is
        given, the run's stored lease still carries ``lease.token`` (the fence). ``head.version``
        must be ``expected_version + 1``. Returns the stored head.

        Both conditions are checked in one atomic step with the write (one transaction, or under
        the run's lock): no claim can slip in between the check and the write. The lease's expiry
        is not judged: an expired lease nobody claimed again still carries its token. A writer that
        lost its lease writes nothing and gets ``LeaseLost`` (also when the version moved too); a
        writer that lost the version race writes nothing and gets ``VersionConflict``. Without
        ``lease`` (external events: a host's output, an approval, a cancel) no lease is needed.

        Durable on return (fsync'd / committed). The cost does not grow with the number or size of
        earlier facts. Raises ``RunNotFound``, ``InvalidArgument`` (also for a lease on another run).

        ``flushing``: called on the event loop, at most once, when the write is under way and what
        this process computes meanwhile costs the write nothing: once the statement is sent, where
        another process writes (postgres: the database server); once the flush begins, where this
        process's own threads write (sqlite's ``COMMIT``, the files' ``fsync``: the thread waits on
        the disk, not on the interpreter's lock). A host's answer is built then
        (:func:`orchestration.engine.host_writes.while_writing`), and dropped when the write is
        refused. A write refused before its flush is never told (sqlite, filesystem); one sent is
        told whatever its answer (postgres); a store that cannot tell (memory) never calls it.
        """
        ...

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        """Facts with ``seq > after_seq`` in order, at most ``limit``. Raises ``RunNotFound``,
        ``CorruptRecord`` or ``RecordTooNew`` (as :meth:`load`) for a fact it cannot read."""
        ...

    async def read_fact(self, run_id: str, seq: int) -> Fact:
        """The fact with sequence number ``seq``. Raises ``RunNotFound``, or ``FactNotFound``
        when the run has no such fact (committed)."""
        ...

    async def list_runs(
        self,
        statuses: frozenset[RunStatus] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        """Runs, newest first (by ``created_at``, then ``run_id``), filtered by status. ``cursor`` is
        the opaque ``next_cursor`` of the previous page; an unreadable cursor raises
        ``InvalidArgument``. A run that cannot be read is skipped (and logged), never fatal."""
        ...

    async def runnable(self, now: datetime, limit: int = 100) -> list[str]:
        """Ids of runs a dispatcher should look at, oldest first: ``queued`` with ``not_before``
        unset or ``<= now``; ``running`` (possibly orphaned: the caller checks the lease by
        claiming); and any non-terminal run whose ``wake_at`` is ``<= now`` (a deadline passed)."""
        ...

    async def claim_lease(self, run_id: str, owner: str, ttl_seconds: float, now: datetime) -> Lease | None:
        """Take the run's lease for ``owner`` until ``now + ttl_seconds`` if it is free, expired, or
        already ``owner``'s. Every successful claim gets a new token (:func:`new_lease_token`),
        which replaces the previous holder's — also when that holder is ``owner`` itself — so the
        lease returned earlier no longer fences anything. Returns ``None`` when another owner holds
        an unexpired lease. Atomic across processes: of two concurrent claimers exactly one gets the
        lease. Raises ``RunNotFound``."""
        ...

    async def renew_lease(self, lease: Lease, ttl_seconds: float, now: datetime) -> Lease:
        """Extend the lease to ``now + ttl_seconds`` if the stored lease still carries
        ``lease.token`` (also after it expired, if nobody claimed it since); the renewed lease keeps
        the token. Raises ``LeaseLost`` if a later claim replaced it or it was released."""
        ...

    async def renew_leases(
        self, leases: Sequence[Lease], ttl_seconds: float, now: datetime
    ) -> dict[str, Lease | None]:
        """:meth:`renew_lease` for many leases in one step (one statement in the SQL adapters):
        what a runtime's renewer sends once per renewal interval for every lease it holds. Each
        lease is judged on its own, with the rules of :meth:`renew_lease`. The answer maps every
        given ``run_id`` to its renewed lease (same token, expiry ``now + ttl_seconds``), or to
        None where ``renew_lease`` would raise ``LeaseLost`` (a later claim replaced the lease, it
        was released, or the run is gone). An empty ``leases`` answers ``{}`` without touching the
        store. Raises ``StoreError`` / ``StoreUnavailable`` as any write (then nothing is known
        of any lease)."""
        ...

    async def versions(self, run_ids: Sequence[str]) -> dict[str, int]:
        """The stored version of each of ``run_ids``, in one read (one statement in the SQL
        adapters): what a runtime's watcher reads once per interval for every run whose drive has
        a call in flight, to learn which of them someone else wrote to (a cancel) without reading
        any record. A run that does not exist (never did, or was deleted) is left out of the
        answer. An empty ``run_ids`` answers ``{}`` without touching the store. Raises
        ``InvalidArgument`` for a malformed run id, ``StoreError`` / ``StoreUnavailable`` as any
        read."""
        ...

    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up if the stored lease still carries ``lease.token``; otherwise (a later
        claim replaced it, or it is already released) do nothing."""
        ...

    async def import_run(self, head: RunHead, facts: Sequence[Fact]) -> RunHead:
        """Store a whole run as another store held it (``runs import``): ``facts`` is its complete
        log (seq 1, 2, ... ``head.last_seq``) and ``head`` its head, at whatever version. Returns
        the stored head; afterwards the run reads back exactly as given (``load``, ``read_facts``).

        Atomic: the whole run is stored, or nothing. No lease comes with it: a live run imported is
        picked up by a dispatcher of this store like any orphan. A tombstone of the same run id is
        replaced (the archive of a pruned run restores it; a run moved away comes back). Raises
        ``Conflict`` when this store holds a run with this id, or when the run's idempotency key is
        another run's (or another run's tombstone's); ``InvalidArgument`` for a malformed run id or
        a log that is not complete and consecutive.
        """
        ...

    async def delete_run(self, tombstone: Tombstone) -> None:
        """Delete run ``tombstone.run_id`` (head, facts, lease) and store ``tombstone`` in its
        place, in one atomic step, if and only if the stored head's version is
        ``tombstone.version`` (compare-and-swap: a run a writer moved on since it was read is left
        alone) and, for ``reason == "pruned"``, the run has ended. The check and the deletion
        happen under the run's lock or in one transaction, so no write slips in between.

        Afterwards every method given the run id raises ``tombstone.error()`` (``RunPruned`` or
        ``RunMoved``, both ``RunNotFound``), and ``create`` with the run's idempotency key raises
        it too (the key stays reserved). A concurrent reader sees the whole run or that error,
        never part of the run. Idempotent: when the run is already deleted with a tombstone of the
        same reason and version, nothing happens.

        Raises ``VersionConflict``, ``InvalidState`` (pruning a run that has not ended),
        ``RunNotFound`` (the stored tombstone's error when the run was deleted differently).
        """
        ...

    async def tombstone(self, run_id: str) -> Tombstone | None:
        """The tombstone of a deleted run, or None (the run exists, or never did). Raises
        ``InvalidArgument`` for a malformed run id."""
        ...

    async def close(self) -> None:
        """Release connections and files. Idempotent."""
        ...


@runtime_checkable
class ReadsLeases(Protocol):
    """Optional ability (memory, filesystem, sqlite, postgres): read a run's lease without taking
    it. What tells a reader (``runs status``, the page) whether anyone drives a run: a run whose
    status is active and whose lease is absent or expired has no driver (see "Nobody driving" in
    ``docs/cli.md``)."""

    async def lease_of(self, run_id: str) -> Lease | None:
        """The run's stored lease, expired or not, as the claim or renewal that wrote it left it;
        None when nobody holds one (never claimed, released, or the run does not exist). A read:
        it claims, renews and wakes nothing. Raises ``InvalidArgument`` for a malformed run id,
        ``StoreError`` / ``StoreUnavailable`` as any read."""
        ...


@runtime_checkable
class ClaimsRunnable(Protocol):
    """Optional ability (sqlite, postgres): claim runnable runs in batches. A dispatcher whose store
    has it claims as many runs as it has free slots in one step, instead of listing them with
    :meth:`RunStore.runnable` and claiming each with :meth:`RunStore.claim_lease`."""

    async def claim_runnable(
        self, owner: str, ttl_seconds: float, now: datetime, limit: int = 10
    ) -> list[Lease]:
        """Claim for ``owner``, until ``now + ttl_seconds``, up to ``limit`` runnable runs (as
        :meth:`RunStore.runnable` defines them) whose lease is free or expired, oldest first, in one
        atomic step; runs ``owner`` already holds are not returned again. Each lease gets a new
        token, as from :meth:`RunStore.claim_lease`. Atomic across processes: two concurrent
        claimers never get the same run (postgres: ``FOR NO KEY UPDATE SKIP LOCKED``; sqlite:
        ``BEGIN IMMEDIATE``). Raises ``StoreError`` / ``StoreUnavailable`` as any write."""
        ...


@runtime_checkable
class CreatesClaimed(Protocol):
    """Optional ability (postgres, beside :class:`NotifiesRunnable`): create a run already leased
    to its creator, without telling the other processes' dispatchers that it is runnable. A runtime
    whose own dispatcher has a free slot creates its provider runs so
    (:meth:`orchestration.engine.runtime.Runtime.drive_new_runs_with`) and hands the lease to that
    dispatcher, which drives the run at once: no claim is sent for it, by this process or the
    others. Should the drive not start (the slot was taken meanwhile: its lease is released; the
    process died: its lease expires), the run is claimed at a dispatcher's next poll, as after a
    lost notification."""

    async def create_claimed(
        self, head: RunHead, facts: Sequence[Fact], owner: str, ttl_seconds: float, now: datetime
    ) -> tuple[CreateResult, Lease | None]:
        """:meth:`RunStore.create`, without the notification a queued run's creation sends, and
        with a lease on the run for ``owner`` until ``now + ttl_seconds`` (a new token, as
        :meth:`RunStore.claim_lease` gives) written in the same atomic step; the lease is None
        when nothing was created (``created=False``)."""
        ...


@runtime_checkable
class NotifiesRunnable(Protocol):
    """Optional ability (postgres): wake a subscriber when any process, this one or another, commits
    a write that leaves a run runnable with no lease on it (a new run, unless created claimed; the
    release of a lease on a run still due), or any write made without a lease (an external event: a
    cancel, an approval, a host's output; the runtime that drives the run stops a call in flight it
    made moot at once). A drive's own writes, made under its lease, wake nobody: no other process
    may take the run until the lease is released or expires. A wake-up
    hint, not a queue: notifications sent while the listening connection is down are lost, so a
    subscriber still polls :meth:`RunStore.runnable`."""

    async def listen(
        self, callback: Callable[[str], None], on_lost: Callable[[], None] | None = None
    ) -> None:
        """Call ``callback(run_id)`` on the event loop for every such write from now on
        (``callback`` must not block). ``on_lost()`` is called when the listening connection drops;
        calling ``listen`` again then reconnects, and raises ``StoreUnavailable`` while the store is
        still away. Idempotent per ``callback``: listening again with a callback already registered
        only reconnects if needed."""
        ...

    async def unlisten(self, callback: Callable[[str], None]) -> None:
        """Stop calling ``callback`` (nothing happens when it was not registered); the listening
        connection closes with the last subscriber."""
        ...


@runtime_checkable
class KeepsChainVersions(Protocol):
    """Optional ability (memory, filesystem, sqlite, postgres): keep every distinct snapshot of a
    chain name as a numbered version, so that a run can name its version and be moved to another
    (``orchestrate_upgrade``'s ``to``). A version is data beside the runs: a run keeps its own copy
    of its snapshot, so losing a version never changes what a run does."""

    async def keep_chain_version(
        self, chain: ChainSnapshot, source: ChainSource, label: str | None, now: datetime
    ) -> ChainVersion:
        """The version of ``chain`` (by name and content hash), kept now with the next ordinal of
        its name when the store has not seen it; an existing version is returned as it was first
        kept (its source, label and time). Atomic across processes: two concurrent keeps of new
        snapshots of one name get different ordinals, two of the same snapshot one version."""
        ...

    async def chain_versions(self, name: str) -> list[ChainVersion]:
        """Every kept version of chain ``name``, oldest (ordinal 1) first; empty when none."""
        ...

    async def forget_chain_versions(self, keep: Sequence[str]) -> int:
        """Remove the versions whose hash is not in ``keep`` (the configuration's current ones) and
        that no run in the store references (a run holds a snapshot with that hash); how many were
        removed. The newest version of each name is never removed, so an ordinal is never reused."""
        ...

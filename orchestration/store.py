"""The ``RunStore`` port (DESIGN §6). Its docstrings are the contract every adapter honours; one
conformance suite (``tests/stores``) checks every adapter against them.

A run is an append-only log of facts plus a head (the fold of the log, see
:mod:`orchestration.facts`). Stores never fold: the writer passes the facts *and* the head they
produce, and the store persists both atomically. The head carries no task output and keeps finished
tasks settled (see ``TaskState.settled``), so it does not grow with the run's history, and neither
does the cost of one append.

Leases are not facts: they are a small mutable record per run (owner, expiry) that says which worker
may execute the run now. Expiry is judged with the ``now`` the caller passes (its injected clock),
never with the store's own clock.

Stored heads and facts state their record format, and a store reads them back by the rules in
:mod:`orchestration.facts` ("Record formats"): fields it does not know are ignored; a record of a
newer format, or a fact of an unknown type, raises ``RecordTooNew`` (a ``CorruptRecord``) and is
never rewritten; lists skip such a run like any unreadable one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from orchestration.facts import Fact
from orchestration.models import RunHead
from orchestration.vocabulary import RunStatus


@dataclass(frozen=True, slots=True)
class Lease:
    run_id: str
    owner: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class RunPage:
    runs: list[RunHead]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class CreateResult:
    head: RunHead
    created: bool


@runtime_checkable
class RunStore(Protocol):
    """Durable storage for runs. Every method is async and safe to call concurrently, from several
    tasks and (for every adapter but ``memory``) from several processes."""

    name: str

    async def create(self, head: RunHead, facts: Sequence[Fact]) -> CreateResult:
        """Create a run from its first write (``head.version == 1``).

        Atomic: either the run with its facts and head exists afterwards, or nothing was written.
        Idempotent by ``head.idempotency_key``: when a run with the same key already exists, nothing
        is written and ``CreateResult(existing_head, created=False)`` is returned (the caller
        compares request hashes). Raises ``Conflict`` if a run with the same ``run_id`` exists,
        ``InvalidArgument`` for a malformed run id.
        """
        ...

    async def load(self, run_id: str) -> RunHead:
        """The current head. Raises ``RunNotFound``, ``InvalidArgument`` (malformed id),
        ``CorruptRecord`` (the stored head cannot be read back), ``RecordTooNew`` (a newer
        version wrote it)."""
        ...

    async def append(
        self, run_id: str, expected_version: int, facts: Sequence[Fact], head: RunHead
    ) -> RunHead:
        """Append ``facts`` and replace the head with ``head``, atomically, if and only if the
        stored head's version is ``expected_version`` (compare-and-swap). ``head.version`` must be
        ``expected_version + 1``. Returns the stored head.

        A writer that lost the race writes nothing and gets ``VersionConflict``. Durable on return
        (fsync'd / committed). The cost does not grow with the number or size of earlier facts.
        Raises ``RunNotFound``, ``InvalidArgument``.
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
        already ``owner``'s. Returns ``None`` when another owner holds an unexpired lease. Atomic
        across processes: of two concurrent claimers exactly one gets the lease."""
        ...

    async def renew_lease(self, lease: Lease, ttl_seconds: float, now: datetime) -> Lease:
        """Extend a lease still held by ``lease.owner``. Raises ``LeaseLost`` if another owner
        took it (after it expired) or it was released."""
        ...

    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up if ``lease.owner`` still holds it; otherwise do nothing."""
        ...

    async def close(self) -> None:
        """Release connections and files. Idempotent."""
        ...

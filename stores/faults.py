"""Fault injection for crash tests (``CONSTRUCT_FAULT_CRASH_AFTER_WRITES=N``): :class:`CrashAfterWrites`
SIGKILLs the process right after its N-th durable write has returned. It has exactly the optional
abilities of the store it wraps and passes a write's ``flushing`` on, so a server on it behaves as
on the store itself. Never use it outside tests.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Sequence
from datetime import datetime

from orchestration.core import Fact, RunHead, RunStatus
from orchestration.store import (
    ClaimsRunnable,
    CreateResult,
    Lease,
    NotifiesRunnable,
    RunPage,
    RunStore,
    Tombstone,
)

log = logging.getLogger("construct.faults")


class CrashAfterWrites:
    """A ``RunStore`` that delegates everything and SIGKILLs the process after write ``n``.

    ``CrashAfterWrites(inner, n)`` returns an instance of the subclass with ``inner``'s optional
    abilities (as ``pathlib.Path(...)`` returns the flavour of its system)."""

    def __new__(cls, inner: RunStore, n: int) -> CrashAfterWrites:
        if cls is CrashAfterWrites:
            cls = _WRAPPERS[isinstance(inner, ClaimsRunnable), isinstance(inner, NotifiesRunnable)]
        return super().__new__(cls)

    def __init__(self, inner: RunStore, n: int) -> None:
        if n < 1:
            raise ValueError("CONSTRUCT_FAULT_CRASH_AFTER_WRITES must be at least 1")
        self.inner = inner
        self.name = inner.name
        self.crash_after = n
        self.writes = 0

    def _count(self) -> None:
        self.writes += 1
        if self.writes >= self.crash_after:
            log.warning(
                "fault injection: SIGKILL after write %d", self.writes, extra={"action": "fault_crash"}
            )
            os.kill(os.getpid(), signal.SIGKILL)

    async def create(
        self, head: RunHead, facts: Sequence[Fact], *, flushing: Callable[[], None] | None = None
    ) -> CreateResult:
        result = await self.inner.create(head, facts, flushing=flushing)
        if result.created:
            self._count()
        return result

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
        stored = await self.inner.append(run_id, expected_version, facts, head, lease, flushing=flushing)
        self._count()
        return stored

    async def find_by_idempotency_key(self, key: str) -> RunHead | None:
        return await self.inner.find_by_idempotency_key(key)

    async def load(self, run_id: str) -> RunHead:
        return await self.inner.load(run_id)

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        return await self.inner.read_facts(run_id, after_seq, limit)

    async def read_fact(self, run_id: str, seq: int) -> Fact:
        return await self.inner.read_fact(run_id, seq)

    async def list_runs(
        self, statuses: frozenset[RunStatus] | None = None, limit: int = 50, cursor: str | None = None
    ) -> RunPage:
        return await self.inner.list_runs(statuses, limit, cursor)

    async def runnable(self, now: datetime, limit: int = 100) -> list[str]:
        return await self.inner.runnable(now, limit)

    async def claim_lease(self, run_id: str, owner: str, ttl_seconds: float, now: datetime) -> Lease | None:
        return await self.inner.claim_lease(run_id, owner, ttl_seconds, now)

    async def renew_lease(self, lease: Lease, ttl_seconds: float, now: datetime) -> Lease:
        return await self.inner.renew_lease(lease, ttl_seconds, now)

    async def renew_leases(
        self, leases: Sequence[Lease], ttl_seconds: float, now: datetime
    ) -> dict[str, Lease | None]:
        return await self.inner.renew_leases(leases, ttl_seconds, now)

    async def versions(self, run_ids: Sequence[str]) -> dict[str, int]:
        return await self.inner.versions(run_ids)

    async def release_lease(self, lease: Lease) -> None:
        await self.inner.release_lease(lease)

    async def import_run(self, head: RunHead, facts: Sequence[Fact]) -> RunHead:
        stored = await self.inner.import_run(head, facts)
        self._count()
        return stored

    async def delete_run(self, tombstone: Tombstone) -> None:
        await self.inner.delete_run(tombstone)
        self._count()

    async def tombstone(self, run_id: str) -> Tombstone | None:
        return await self.inner.tombstone(run_id)

    async def close(self) -> None:
        await self.inner.close()


class _Claims(CrashAfterWrites):
    """The wrapper of a store that ``ClaimsRunnable``. A batch claim writes leases, not facts: it is
    not a counted write."""

    async def claim_runnable(
        self, owner: str, ttl_seconds: float, now: datetime, limit: int = 10
    ) -> list[Lease]:
        assert isinstance(self.inner, ClaimsRunnable)  # chosen by CrashAfterWrites.__new__
        return await self.inner.claim_runnable(owner, ttl_seconds, now, limit)


class _Notifies(CrashAfterWrites):
    """The wrapper of a store that ``NotifiesRunnable``."""

    async def listen(
        self, callback: Callable[[str], None], on_lost: Callable[[], None] | None = None
    ) -> None:
        assert isinstance(self.inner, NotifiesRunnable)  # chosen by CrashAfterWrites.__new__
        await self.inner.listen(callback, on_lost)

    async def unlisten(self, callback: Callable[[str], None]) -> None:
        assert isinstance(self.inner, NotifiesRunnable)
        await self.inner.unlisten(callback)


class _ClaimsAndNotifies(_Claims, _Notifies):
    """The wrapper of a store that claims and notifies (postgres)."""


#: (claims, notifies) -> the wrapper with those abilities
_WRAPPERS: dict[tuple[bool, bool], type[CrashAfterWrites]] = {
    (False, False): CrashAfterWrites,
    (True, False): _Claims,
    (False, True): _Notifies,
    (True, True): _ClaimsAndNotifies,
}

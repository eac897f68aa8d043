"""The in-memory reference ``RunStore``: the simplest correct adapter, used by unit tests and as the
reference the conformance suite holds every other adapter to. Nothing survives the process."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

import anyio
from anyio.lowlevel import checkpoint

from orchestration.core import ChainSnapshot, Fact, RunHead, RunStatus, validate_run_id
from orchestration.errors import Conflict, FactNotFound, RecordTooNew, RunNotFound, VersionConflict
from orchestration.store import (
    ChainSource,
    ChainVersion,
    CreateResult,
    Lease,
    RunPage,
    Tombstone,
    new_lease_token,
)
from stores._chain_versions import forgettable, found_version, next_version
from stores._common import (
    check_append,
    check_create,
    check_format,
    decode_cursor,
    encode_cursor,
    is_runnable,
    list_order_key,
    not_continuing,
)
from stores._lease import lease_lost
from stores._retention import check_delete, check_import, deleted_already

log = logging.getLogger(__name__)


class MemoryStore:
    name = "memory"

    def __init__(self) -> None:
        self._heads: dict[str, RunHead] = {}
        self._facts: dict[str, list[Fact]] = {}
        self._keys: dict[str, str] = {}
        self._leases: dict[str, Lease] = {}
        self._tombstones: dict[str, Tombstone] = {}
        self._chain_versions: dict[str, list[ChainVersion]] = {}
        self._lock = anyio.Lock()

    async def create(
        self, head: RunHead, facts: Sequence[Fact], *, flushing: Callable[[], None] | None = None
    ) -> CreateResult:
        """See ``RunStore.create``; ``flushing`` is never called (nothing flushes)."""
        validate_run_id(head.run_id)
        check_create(head, facts)
        async with self._lock:
            if head.idempotency_key is not None and head.idempotency_key in self._keys:
                owner = self._keys[head.idempotency_key]
                if owner in self._tombstones:
                    raise self._tombstones[owner].error(by_key=True)
                return CreateResult(self._heads[owner], created=False)
            if head.run_id in self._heads or head.run_id in self._tombstones:
                raise Conflict(f"a run with id {head.run_id} already exists")
            self._heads[head.run_id] = head
            self._facts[head.run_id] = list(facts)
            if head.idempotency_key is not None:
                self._keys[head.idempotency_key] = head.run_id
            return CreateResult(head, created=True)

    async def find_by_idempotency_key(self, key: str) -> RunHead | None:
        await checkpoint()
        owner = self._keys.get(key)
        if owner is None:
            return None
        if owner in self._tombstones:
            raise self._tombstones[owner].error(by_key=True)
        return self._current(owner)

    async def load(self, run_id: str) -> RunHead:
        validate_run_id(run_id)
        return self._current(run_id)

    def _current(self, run_id: str) -> RunHead:
        try:
            head = self._heads[run_id]
        except KeyError:
            gone = self._tombstones.get(run_id)
            raise (gone.error() if gone is not None else RunNotFound(run_id)) from None
        check_format(run_id, "head", head.format)
        return head

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
        """See ``RunStore.append``; ``flushing`` is never called (nothing flushes)."""
        check_append(run_id, expected_version, facts, head, lease)
        # One checkpoint (a cancel is delivered here, other tasks run), then the compare-and-swap,
        # which awaits nothing (not even an overridden load): atomic in the event loop, as every
        # section under the lock is, so it needs no lock of its own (the lock's acquire cost a
        # shielded cancel scope per write).
        await checkpoint()
        current = self._current(run_id)
        if lease is not None and not self._holds(lease):
            raise lease_lost(lease)
        if current.version != expected_version:
            raise VersionConflict(run_id, expected_version, current.version)
        if facts[0].seq != current.last_seq + 1:
            raise not_continuing(run_id, facts[0].seq, current.last_seq)
        self._facts[run_id].extend(facts)
        self._heads[run_id] = head
        return head

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        await self.load(run_id)
        facts = [f for f in self._facts.get(run_id, []) if f.seq > after_seq]
        facts = facts if limit is None else facts[:limit]
        for fact in facts:
            check_format(run_id, f"fact {fact.seq}", fact.format)
        return facts

    async def read_fact(self, run_id: str, seq: int) -> Fact:
        await self.load(run_id)
        facts = self._facts.get(run_id, [])
        if 1 <= seq <= len(facts):
            check_format(run_id, f"fact {seq}", facts[seq - 1].format)
            return facts[seq - 1]
        raise FactNotFound(run_id, seq)

    async def list_runs(
        self,
        statuses: frozenset[RunStatus] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        after = decode_cursor(cursor)
        heads = sorted(self._heads.values(), key=list_order_key, reverse=True)
        if statuses:
            heads = [h for h in heads if h.status in statuses]
        if after is not None:
            heads = [h for h in heads if list_order_key(h) < after]
        page = heads[:limit]
        more = len(heads) > limit
        runs = []
        for head in page:
            try:
                check_format(head.run_id, "head", head.format)
            except RecordTooNew as exc:
                log.warning(
                    "unreadable run skipped in list: %s",
                    exc,
                    extra={"action": "store.list_skipped_corrupt", "run_id": head.run_id, "code": exc.code},
                )
                continue
            runs.append(head)
        return RunPage(runs, encode_cursor(page[-1]) if more and page else None)

    async def runnable(self, now: datetime, limit: int = 100) -> list[str]:
        out = []
        for head in sorted(self._heads.values(), key=list_order_key):
            if is_runnable(head, now):
                out.append(head.run_id)
        return out[:limit]

    async def claim_lease(self, run_id: str, owner: str, ttl_seconds: float, now: datetime) -> Lease | None:
        await self.load(run_id)
        async with self._lock:
            current = self._leases.get(run_id)
            if current is not None and current.owner != owner and current.expires_at > now:
                return None
            lease = Lease(run_id, owner, now + timedelta(seconds=ttl_seconds), new_lease_token())
            self._leases[run_id] = lease
            return lease

    def _holds(self, lease: Lease) -> bool:
        current = self._leases.get(lease.run_id)
        return current is not None and current.token == lease.token

    async def renew_lease(self, lease: Lease, ttl_seconds: float, now: datetime) -> Lease:
        async with self._lock:
            if not self._holds(lease):
                raise lease_lost(lease)
            renewed = Lease(lease.run_id, lease.owner, now + timedelta(seconds=ttl_seconds), lease.token)
            self._leases[lease.run_id] = renewed
            return renewed

    async def renew_leases(
        self, leases: Sequence[Lease], ttl_seconds: float, now: datetime
    ) -> dict[str, Lease | None]:
        expires_at = now + timedelta(seconds=ttl_seconds)
        renewed: dict[str, Lease | None] = {}
        async with self._lock:
            for lease in leases:
                renewed[lease.run_id] = None
                if self._holds(lease):
                    kept = Lease(lease.run_id, lease.owner, expires_at, lease.token)
                    self._leases[lease.run_id] = renewed[lease.run_id] = kept
        return renewed

    async def versions(self, run_ids: Sequence[str]) -> dict[str, int]:
        for run_id in run_ids:
            validate_run_id(run_id)
        if run_ids:
            await checkpoint()
        return {run_id: self._heads[run_id].version for run_id in run_ids if run_id in self._heads}

    async def lease_of(self, run_id: str) -> Lease | None:
        """``ReadsLeases`` (:mod:`orchestration.store`): the run's lease as stored, expired or not."""
        validate_run_id(run_id)
        await checkpoint()
        return self._leases.get(run_id)

    async def release_lease(self, lease: Lease) -> None:
        async with self._lock:
            if self._holds(lease):
                del self._leases[lease.run_id]

    async def import_run(self, head: RunHead, facts: Sequence[Fact]) -> RunHead:
        validate_run_id(head.run_id)
        check_import(head, facts)
        async with self._lock:
            if head.run_id in self._heads:
                raise Conflict(f"this store already has run {head.run_id}")
            key = head.idempotency_key
            if key is not None and self._keys.get(key, head.run_id) != head.run_id:
                raise Conflict(f"idempotency key of run {head.run_id} is run {self._keys[key]}'s here")
            self._tombstones.pop(head.run_id, None)
            self._heads[head.run_id] = head
            self._facts[head.run_id] = list(facts)
            if key is not None:
                self._keys[key] = head.run_id
            return head

    async def delete_run(self, tombstone: Tombstone) -> None:
        run_id = validate_run_id(tombstone.run_id)
        async with self._lock:
            stored = self._tombstones.get(run_id)
            if stored is not None:
                deleted_already(stored, tombstone)
                return
            check_delete(await self.load(run_id), tombstone)
            # The key (in _keys) stays: it now answers with the tombstone.
            self._tombstones[run_id] = tombstone
            del self._heads[run_id], self._facts[run_id]
            self._leases.pop(run_id, None)

    async def tombstone(self, run_id: str) -> Tombstone | None:
        validate_run_id(run_id)
        return self._tombstones.get(run_id)

    async def keep_chain_version(
        self, chain: ChainSnapshot, source: ChainSource, label: str | None, now: datetime
    ) -> ChainVersion:
        """See ``KeepsChainVersions.keep_chain_version``."""
        await checkpoint()
        kept = self._chain_versions.setdefault(chain.name, [])
        found = found_version(kept, chain.content_hash())
        if found is not None:
            return found
        version = next_version(chain, source, label, now, after=kept[-1].ordinal if kept else 0)
        kept.append(version)
        return version

    async def chain_versions(self, name: str) -> list[ChainVersion]:
        """See ``KeepsChainVersions.chain_versions``."""
        await checkpoint()
        return list(self._chain_versions.get(name, ()))

    async def forget_chain_versions(self, keep: Sequence[str]) -> int:
        """See ``KeepsChainVersions.forget_chain_versions``."""
        await checkpoint()
        referenced = {h.chain_hash for h in self._heads.values()}
        every = [v for kept in self._chain_versions.values() for v in kept]
        gone = {id(v) for v in forgettable(every, referenced, keep)}
        for name, kept in self._chain_versions.items():
            self._chain_versions[name] = [v for v in kept if id(v) not in gone]
        return len(gone)

    async def close(self) -> None:
        return None

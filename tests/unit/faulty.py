"""Test doubles for store faults and per-run counting, shared by the dispatcher and outage tests.

:class:`FaultyStore` wraps any store and fails on demand the way a database that went away does
(``StoreUnavailable`` from every call while ``down``), or fails one append *after* it committed — a
connection that died during ``COMMIT``, whose outcome the writer cannot know. :class:`CountingWorker`
is a provider worker that counts its calls per run and task (the run is named by a ``[run:NAME]``
marker in the request), with a delay per call, and notes the calls that were cancelled.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import anyio

from orchestration.chains.prompts import TaskPrompt
from orchestration.core import StartRequest
from orchestration.core.facts import Fact
from orchestration.core.models import (
    ChainSnapshot,
    ChainStep,
    ExecutionContract,
    RunHead,
    Telemetry,
    TypedError,
)
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded
from orchestration.core.vocabulary import RunStatus
from orchestration.errors import StoreUnavailable
from orchestration.store import CreateResult, Lease, RunPage, RunStore, Tombstone
from orchestration.workers.port import DeltaSink

_RUN_MARKER = re.compile(r"\[run:([A-Za-z0-9_.\-]+)\]")


class FaultyStore:
    """A ``RunStore`` that delegates to ``inner`` and fails on demand (see the module docstring).
    Optional capabilities of ``inner`` (``claim_runnable``, ``listen``) are passed through, failing
    like the rest while the store is down."""

    def __init__(self, inner: RunStore) -> None:
        self.inner = inner
        self.name = inner.name
        self.down = False
        #: appends that commit and then raise, as if the connection died during COMMIT
        self.fail_after_commit = 0
        #: appends that raise without writing anything
        self.fail_before_commit = 0
        self.failures = 0
        self.calls: Counter[str] = Counter()
        #: when set, called before every operation with its name (to take the store down mid-run)
        self.before: Callable[[str], None] | None = None

    def _check(self, op: str) -> None:
        self.calls[op] += 1
        if self.before is not None:
            self.before(op)
        if self.down:
            self.failures += 1
            raise StoreUnavailable(f"cannot use the test store: it is down ({op})")

    async def create(
        self, head: RunHead, facts: Sequence[Fact], *, flushing: Callable[[], None] | None = None
    ) -> CreateResult:
        self._check("create")
        return await self.inner.create(head, facts, flushing=flushing)

    async def find_by_idempotency_key(self, key: str) -> RunHead | None:
        self._check("find_by_idempotency_key")
        return await self.inner.find_by_idempotency_key(key)

    async def load(self, run_id: str) -> RunHead:
        self._check("load")
        return await self.inner.load(run_id)

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
        self._check("append")
        if self.fail_before_commit:
            self.fail_before_commit -= 1
            raise StoreUnavailable("connection lost before commit")
        stored = await self.inner.append(run_id, expected_version, facts, head, lease, flushing=flushing)
        if self.fail_after_commit:
            self.fail_after_commit -= 1
            raise StoreUnavailable("connection lost during COMMIT")
        return stored

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        self._check("read_facts")
        return await self.inner.read_facts(run_id, after_seq, limit)

    async def read_fact(self, run_id: str, seq: int) -> Fact:
        self._check("read_fact")
        return await self.inner.read_fact(run_id, seq)

    async def list_runs(
        self, statuses: frozenset[RunStatus] | None = None, limit: int = 50, cursor: str | None = None
    ) -> RunPage:
        self._check("list_runs")
        return await self.inner.list_runs(statuses, limit, cursor)

    async def runnable(self, now: datetime, limit: int = 100) -> list[str]:
        self._check("runnable")
        return await self.inner.runnable(now, limit)

    async def claim_lease(self, run_id: str, owner: str, ttl_seconds: float, now: datetime) -> Lease | None:
        self._check("claim_lease")
        return await self.inner.claim_lease(run_id, owner, ttl_seconds, now)

    async def renew_lease(self, lease: Lease, ttl_seconds: float, now: datetime) -> Lease:
        self._check("renew_lease")
        return await self.inner.renew_lease(lease, ttl_seconds, now)

    async def renew_leases(
        self, leases: Sequence[Lease], ttl_seconds: float, now: datetime
    ) -> dict[str, Lease | None]:
        self._check("renew_leases")
        return await self.inner.renew_leases(leases, ttl_seconds, now)

    async def versions(self, run_ids: Sequence[str]) -> dict[str, int]:
        self._check("versions")
        return await self.inner.versions(run_ids)

    async def release_lease(self, lease: Lease) -> None:
        self._check("release_lease")
        await self.inner.release_lease(lease)

    async def import_run(self, head: RunHead, facts: Sequence[Fact]) -> RunHead:
        self._check("import_run")
        return await self.inner.import_run(head, facts)

    async def delete_run(self, tombstone: Tombstone) -> None:
        self._check("delete_run")
        await self.inner.delete_run(tombstone)

    async def tombstone(self, run_id: str) -> Tombstone | None:
        self._check("tombstone")
        return await self.inner.tombstone(run_id)

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        async def guarded(*args: Any, **kwargs: Any) -> Any:
            self._check(name)
            return await target(*args, **kwargs)

        return guarded


class CountingWorker:
    """A provider worker: ``delay`` seconds per call, calls counted per (run marker, task)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: Counter[tuple[str, str]] = Counter()
        self.cancelled: Counter[tuple[str, str]] = Counter()
        self.in_flight = 0

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        match = _RUN_MARKER.search(prompt.user)
        key = (match.group(1) if match else "?", step.name)
        self.calls[key] += 1
        self.in_flight += 1
        try:
            await anyio.sleep(self.delay)
        except anyio.get_cancelled_exc_class():
            self.cancelled[key] += 1
            raise
        finally:
            self.in_flight -= 1
        return AttemptSucceeded(f"{step.name} output for {key[0]}", Telemetry(output_tokens=3))


def provider_contract(request: StartRequest, _: ChainSnapshot) -> ExecutionContract:
    return ExecutionContract(worker_backend="provider", provider="fake", model="fake-1", max_attempts=3)


def start_request(
    marker: str, chain: tuple[str, ...] = ("architect", "engineer", "reviewer")
) -> StartRequest:
    return StartRequest(f"Build it [run:{marker}]", chain=chain, worker_backend="provider")

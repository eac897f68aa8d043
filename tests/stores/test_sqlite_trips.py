"""The sqlite adapter makes one trip to a connection's thread per store call (stores._sqlite_thread):
an append is one function holding its whole transaction, and the compare-and-swap update also
checks the lease and the log, so only a refused append reads on to say why."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from orchestration.errors import InvalidArgument, LeaseLost, VersionConflict
from stores.sqlite import SqliteStore
from tests.stores.builders import BASE_TIME, complete_task, new_run, run_id, start_attempt


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = await SqliteStore.open(tmp_path / "construct.db")
    try:
        yield opened
    finally:
        await opened.close()


@contextmanager
def trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The functions that go to any aiosqlite connection's thread meanwhile."""
    seen: list[str] = []
    original: Callable[..., Awaitable[Any]] = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(getattr(fn, "__name__", repr(fn)))
        return await original(self, fn, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(aiosqlite.Connection, "_execute", counted)
        yield seen


async def test_each_call_is_one_trip(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    head, facts = new_run(run_id(1))
    with trips(monkeypatch) as seen:
        await store.create(head, facts)
        lease = await store.claim_lease(run_id(1), "worker", 30, BASE_TIME)
        assert lease is not None
        write = start_attempt(head)
        await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=lease)
        done = complete_task(write.head)
        await store.append(run_id(1), done.expected_version, done.facts, done.head)
        await store.renew_lease(lease, 30, BASE_TIME + timedelta(seconds=1))
        await store.release_lease(lease)
        assert await store.load(run_id(1)) == done.head
        assert [f.seq for f in await store.read_facts(run_id(1))] == [1, 2, 3, 4]
        assert (await store.read_fact(run_id(1), 2)).seq == 2
    assert len(seen) == 9, seen


async def test_a_refused_append_says_why_in_the_order_lease_version_log(store: SqliteStore) -> None:
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    old = await store.claim_lease(run_id(1), "worker-a", 0, BASE_TIME)
    new = await store.claim_lease(run_id(1), "worker-b", 30, BASE_TIME + timedelta(seconds=1))
    assert old is not None and new is not None
    write = start_attempt(head)
    moved = await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=new)
    gap = start_attempt(head)
    skipped = [gap.facts[0].model_copy(update={"seq": 5})]
    stale_gap = gap.head.model_copy(update={"last_seq": 5})
    # every check fails: the lost lease is what is reported
    with pytest.raises(LeaseLost):
        await store.append(run_id(1), head.version, skipped, stale_gap, lease=old)
    # the lease holds: the stale version, not the gap
    with pytest.raises(VersionConflict):
        await store.append(run_id(1), head.version, skipped, stale_gap, lease=new)
    # the version is current: the gap
    ahead = moved.model_copy(update={"version": moved.version + 1, "last_seq": 5})
    with pytest.raises(InvalidArgument, match="first fact appended"):
        await store.append(run_id(1), moved.version, skipped, ahead, lease=new)
    assert await store.load(run_id(1)) == moved
    assert [f.seq for f in await store.read_facts(run_id(1))] == [1, 2]

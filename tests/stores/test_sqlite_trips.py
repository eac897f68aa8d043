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
import anyio
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


async def test_concurrent_writes_commit_in_groups_and_a_refused_one_rolls_back_alone(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    heads = {}
    for n in range(1, 7):
        head, facts = new_run(run_id(n))
        await store.create(head, facts)
        heads[n] = head
    outcomes: dict[str, object] = {}

    async def attempt(name: str, n: int) -> None:
        write = start_attempt(heads[n], executor=f"provider:fake:{name}")
        try:
            outcomes[name] = await store.append(run_id(n), write.expected_version, write.facts, write.head)
        except VersionConflict as exc:
            outcomes[name] = exc

    # run 7 is one write ahead, and gets a write whose update succeeds but whose fact is one it
    # has: refused after its update, which its savepoint rolls back (the group's others land)
    head, facts = new_run(run_id(7))
    await store.create(head, facts)
    first = start_attempt(head)
    heads[7] = await store.append(run_id(7), first.expected_version, first.facts, first.head)
    again = start_attempt(heads[7])
    duplicate = [again.facts[0].model_copy(update={"seq": 2})]

    async def duplicated() -> None:
        try:
            await store.append(
                run_id(7), heads[7].version, duplicate, again.head.model_copy(update={"last_seq": 2})
            )
        except InvalidArgument as exc:
            outcomes["dup"] = exc

    with trips(monkeypatch) as seen:
        async with anyio.create_task_group() as tg:
            # run 1 twice on one version: the second is refused inside the group, the rest land
            for name, n in [("a", 1), ("b", 1), ("c", 2), ("d", 3)]:
                tg.start_soon(attempt, name, n)
            tg.start_soon(duplicated)
            for name, n in [("e", 4), ("f", 5), ("g", 6)]:
                tg.start_soon(attempt, name, n)
    assert len(seen) < 8, seen  # grouped: fewer trips than writes
    assert isinstance(outcomes.pop("b"), VersionConflict)
    assert isinstance(outcomes.pop("dup"), InvalidArgument)
    assert all(not isinstance(o, Exception) for o in outcomes.values())
    assert await store.load(run_id(7)) == heads[7]
    # committed when answered: another connection to the file sees every write, once each
    other = await SqliteStore.open(tmp_path / "construct.db")
    try:
        for n in range(1, 7):
            head = await other.load(run_id(n))
            assert head.version == 2
            assert [f.seq for f in await other.read_facts(run_id(n))] == [1, 2]
        assert (await other.read_fact(run_id(1), 2)).model_dump()["executor"] == "provider:fake:a"
    finally:
        await other.close()


async def test_an_append_says_its_flush_once_before_it_is_answered_and_a_refused_one_never(
    store: SqliteStore, tmp_path: Path
) -> None:
    heads = {}
    for n in (1, 2, 3):
        head, facts = new_run(run_id(n))
        await store.create(head, facts)
        heads[n] = head
    events: list[str] = []

    async def append(name: str, n: int) -> None:
        write = start_attempt(heads[n], executor=f"provider:fake:{name}")
        try:
            await store.append(
                run_id(n),
                write.expected_version,
                write.facts,
                write.head,
                flushing=lambda: events.append(f"{name} flushing"),
            )
            events.append(f"{name} answered")
        except VersionConflict:
            events.append(f"{name} refused")

    await append("a", 1)
    assert events == ["a flushing", "a answered"]
    # In one group (concurrent writes): the refused one (run 1 again, on its old version) is never
    # told; the others are, each before its answer.
    events.clear()
    async with anyio.create_task_group() as tg:
        for name, n in [("b", 1), ("c", 2), ("d", 3)]:
            tg.start_soon(append, name, n)
    assert sorted(events) == ["b refused", "c answered", "c flushing", "d answered", "d flushing"]
    for name in ("c", "d"):
        assert events.index(f"{name} flushing") < events.index(f"{name} answered")
    other = await SqliteStore.open(tmp_path / "construct.db")
    try:
        assert [(await other.load(run_id(n))).version for n in (1, 2, 3)] == [2, 2, 2]
    finally:
        await other.close()

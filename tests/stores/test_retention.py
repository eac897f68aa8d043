"""Retention on every store (issue 14, part 5): ``import_run``, ``delete_run`` and tombstones, the
contract in :class:`orchestration.store.RunStore` ("Retention"), and ``prune`` racing live runs,
writers and readers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import anyio
import anyio.lowlevel
import pytest

from orchestration.core.facts import Fact
from orchestration.core.fold import apply_write
from orchestration.core.models import RunHead
from orchestration.core.vocabulary import RunStatus
from orchestration.errors import (
    Conflict,
    InvalidArgument,
    InvalidState,
    RunMoved,
    RunNotFound,
    RunPruned,
    VersionConflict,
)
from orchestration.ops.export import snapshot
from orchestration.ops.retention import prune
from orchestration.store import RunStore, Tombstone
from tests.stores.builders import (
    BASE_TIME,
    Write,
    cancel,
    complete_task,
    fail_attempt,
    new_run,
    request_approval,
    run_id,
    start_attempt,
)

NOW = BASE_TIME + timedelta(days=60)
ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.REJECTED})


async def commit(store: RunStore, write: Write) -> RunHead:
    return await store.append(write.head.run_id, write.expected_version, write.facts, write.head)


def history(rid: str, *, key: str | None = None, ended: bool = True) -> tuple[RunHead, list[Fact]]:
    """A run with some history (a task done, an approval asked), cancelled when ``ended``."""
    head, facts = new_run(rid, key=key)
    for make in (complete_task, lambda h: complete_task(h, "engineer"), request_approval):
        write = make(head)
        head, facts = write.head, facts + write.facts
    if ended:
        write = cancel(head)
        head, facts = write.head, facts + write.facts
    return head, facts


async def stored(store: RunStore, head: RunHead, facts: list[Fact]) -> RunHead:
    """The run in ``store``, written the way the runtime writes it: a create, then appends."""
    await store.create(*new_run(head.run_id, key=head.idempotency_key))
    current = await store.load(head.run_id)
    for fact in facts[1:]:  # the history one fact at a time, through the real fold
        current = await commit(store, Write(current.version, [fact], apply_write(current, [fact])))
    assert current.last_seq == head.last_seq
    return current


def pruned(head: RunHead, **kwargs: str) -> Tombstone:
    return Tombstone.of(head, "pruned", NOW, **kwargs)


def moved(head: RunHead) -> Tombstone:
    return Tombstone.of(head, "moved", NOW, moved_to="postgresql://db/construct")


# ------------------------------------------------------------------------------- import_run


async def test_an_imported_run_reads_back_exactly_and_goes_on(store: RunStore) -> None:
    head, facts = history(run_id(1), key="k-1", ended=False)
    assert await store.import_run(head, facts) == head
    assert await store.load(head.run_id) == head
    assert await store.read_facts(head.run_id) == facts
    assert await store.read_fact(head.run_id, 3) == facts[2]
    assert [h.run_id for h in (await store.list_runs()).runs] == [head.run_id]
    # It is a run like any other: the next write continues it, and its key finds it.
    after = await commit(store, cancel(head))
    assert (await store.load(head.run_id)).status == after.status == RunStatus.CANCELLED
    again = await store.create(*new_run(run_id(99), key="k-1"))
    assert not again.created and again.head.run_id == head.run_id


async def test_every_character_of_an_imported_output_reads_back(store: RunStore) -> None:
    head, facts = new_run(run_id(1))
    write = complete_task(head, output="a NUL \x00, a private-use \ue000 and \ue0000, an emoji \U0001f600")
    await store.import_run(write.head, [*facts, *write.facts])
    assert await store.read_facts(run_id(1)) == [*facts, *write.facts]


async def test_an_import_refuses_a_run_id_the_store_has(store: RunStore) -> None:
    head, facts = history(run_id(1))
    await store.create(*new_run(run_id(1)))
    before = await store.load(run_id(1))
    with pytest.raises(Conflict):
        await store.import_run(head, facts)
    assert await store.load(run_id(1)) == before
    assert len(await store.read_facts(run_id(1))) == 1


async def test_an_import_refuses_another_runs_idempotency_key(store: RunStore) -> None:
    await store.create(*new_run(run_id(1), key="shared"))
    head, facts = history(run_id(2), key="shared")
    with pytest.raises(Conflict, match="idempotency key"):
        await store.import_run(head, facts)
    with pytest.raises(RunNotFound):
        await store.load(run_id(2))


async def test_an_import_needs_the_whole_log(store: RunStore) -> None:
    head, facts = history(run_id(1))
    for broken in (facts[:-1], facts[1:], [], [facts[0], *facts[2:]]):
        with pytest.raises(InvalidArgument):
            await store.import_run(head, broken)
    with pytest.raises(RunNotFound):
        await store.load(run_id(1))


# ------------------------------------------------------------------------------- delete_run


async def test_a_pruned_run_answers_with_its_tombstone(store: RunStore) -> None:
    head = await stored(store, *history(run_id(1), key="k-1"))
    other = await stored(store, *history(run_id(2)))
    tombstone = pruned(head, archive="/archive/run-test-000001.jsonl")
    await store.delete_run(tombstone)

    with pytest.raises(RunPruned) as info:
        await store.load(run_id(1))
    assert isinstance(info.value, RunNotFound) and info.value.code == "run_pruned"
    assert "pruned" in info.value.message and "cancelled" in info.value.message
    assert "/archive/run-test-000001.jsonl" in info.value.message
    later = head.model_copy(update={"version": head.version + 1, "last_seq": head.last_seq + 1})
    fact = cancel(history(run_id(1), ended=False)[0]).facts[0].model_copy(update={"seq": later.last_seq})
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.read_facts(run_id(1)),
        lambda: store.read_fact(run_id(1), 1),
        lambda: store.claim_lease(run_id(1), "w", 30, NOW),
        lambda: store.append(
            run_id(1), head.version, [fact.model_copy(update={"seq": later.last_seq})], later
        ),
    ]
    for call in calls:
        with pytest.raises(RunPruned):
            await call()
    assert await store.tombstone(run_id(1)) == tombstone
    assert await store.tombstone(run_id(2)) is None
    assert [h.run_id for h in (await store.list_runs()).runs] == [run_id(2)]
    assert await store.load(run_id(2)) == other


async def test_a_pruned_runs_idempotency_key_is_kept(store: RunStore) -> None:
    head = await stored(store, *history(run_id(1), key="nightly-report"))
    await store.delete_run(pruned(head))
    with pytest.raises(RunPruned) as info:
        await store.create(*new_run(run_id(2), key="nightly-report"))
    assert "idempotency key" in info.value.message and run_id(1) in info.value.message
    with pytest.raises(RunNotFound):
        await store.load(run_id(2))
    # Another key starts a run as usual.
    assert (await store.create(*new_run(run_id(3), key="nightly-report-2"))).created


async def test_a_deleted_runs_key_reads_as_its_tombstone(store: RunStore) -> None:
    """``find_by_idempotency_key`` answers a deleted run's key as ``create`` does: with the
    tombstone's error (the key stays reserved), pruned or moved."""
    head = await stored(store, *history(run_id(1), key="weekly"))
    other = await stored(store, *history(run_id(2), key="monthly"))
    await store.delete_run(pruned(head))
    await store.delete_run(moved(other))
    with pytest.raises(RunPruned) as info:
        await store.find_by_idempotency_key("weekly")
    assert "idempotency key" in info.value.message and run_id(1) in info.value.message
    with pytest.raises(RunMoved):
        await store.find_by_idempotency_key("monthly")
    assert await store.find_by_idempotency_key("weekly-2") is None


async def test_a_live_run_is_never_pruned(store: RunStore) -> None:
    head = await stored(store, *history(run_id(1), ended=False))
    with pytest.raises(InvalidState):
        await store.delete_run(pruned(head))
    assert await store.load(run_id(1)) == head
    assert await store.tombstone(run_id(1)) is None


async def test_a_delete_is_compare_and_swap_on_the_version(store: RunStore) -> None:
    head = await stored(store, *history(run_id(1), ended=False))
    after = await commit(store, cancel(head))
    with pytest.raises(VersionConflict):
        await store.delete_run(pruned(head))
    assert await store.load(run_id(1)) == after


async def test_a_repeated_delete_is_a_no_op_and_another_is_refused(store: RunStore) -> None:
    head = await stored(store, *history(run_id(1)))
    await store.delete_run(pruned(head))
    await store.delete_run(pruned(head))
    with pytest.raises(RunPruned):
        await store.delete_run(moved(head))
    with pytest.raises(RunNotFound):
        await store.delete_run(pruned(head.model_copy(update={"run_id": run_id(3)})))


async def test_a_moved_run_is_never_driven_or_changed_again(store: RunStore) -> None:
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    lease = await store.claim_lease(run_id(1), "worker", 30, NOW)
    assert lease is not None
    assert await store.runnable(NOW) == [run_id(1)]
    await store.delete_run(moved(head))

    assert await store.runnable(NOW) == []
    claim_runnable = getattr(store, "claim_runnable", None)
    if claim_runnable is not None:  # how the SQL stores' dispatchers find work
        assert await claim_runnable("other", 30, NOW + timedelta(hours=1)) == []
    with pytest.raises(RunMoved) as info:
        await store.load(run_id(1))
    assert info.value.code == "run_moved" and "postgresql://db/construct" in info.value.message
    write = start_attempt(head)
    with pytest.raises(RunMoved):
        await store.append(run_id(1), write.expected_version, write.facts, write.head, lease)
    with pytest.raises(RunMoved):
        await store.append(run_id(1), write.expected_version, write.facts, write.head)
    with pytest.raises(RunNotFound):
        await store.claim_lease(run_id(1), "other", 30, NOW)


async def test_an_import_brings_a_deleted_run_back(store: RunStore) -> None:
    head, facts = history(run_id(1), key="k-1")
    current = await stored(store, head, facts)
    await store.delete_run(pruned(current))
    await store.import_run(current, await_facts := facts)
    assert await store.load(run_id(1)) == current
    assert await store.read_facts(run_id(1)) == await_facts
    assert await store.tombstone(run_id(1)) is None
    again = await store.create(*new_run(run_id(2), key="k-1"))
    assert not again.created and again.head.run_id == run_id(1)


# ------------------------------------------------------------------------------- races


async def _race_delete_and_append(store: RunStore, head: RunHead) -> dict[str, str]:
    results: dict[str, str] = {}

    async def append() -> None:
        try:
            await commit(store, start_attempt(head))
            results["append"] = "ok"
        except RunMoved:
            results["append"] = "moved"

    async def delete() -> None:
        try:
            await store.delete_run(moved(head))
            results["delete"] = "ok"
        except VersionConflict:
            results["delete"] = "conflict"

    async with anyio.create_task_group() as tg:
        tg.start_soon(append)
        tg.start_soon(delete)
    return results


async def test_of_a_delete_and_an_append_on_one_version_exactly_one_wins(store: RunStore) -> None:
    for n in range(8):
        head, facts = new_run(run_id(n))
        await store.create(head, facts)
        results = await _race_delete_and_append(store, head)
        assert sorted(results.values()) in (["conflict", "ok"], ["moved", "ok"]), results
        if results["delete"] == "ok":
            with pytest.raises(RunMoved):
                await store.load(run_id(n))
        else:
            assert (await store.load(run_id(n))).version == 2


async def test_prune_deletes_ended_runs_and_leaves_live_ones_while_they_are_written_and_read(
    store: RunStore,
) -> None:
    ended = [await stored(store, *history(run_id(n))) for n in range(1, 6)]
    live_head, live_facts = new_run(run_id(50))
    await store.create(live_head, live_facts)
    seen: list[str] = []
    stop = anyio.Event()

    async def writer() -> None:
        head = live_head
        for _ in range(15):
            head = await commit(store, fail_attempt(head, None))
            await anyio.lowlevel.checkpoint()
        stop.set()

    async def reader() -> None:
        # Reads each ended run whole, again and again, while the prune deletes them: every read
        # is the whole run or its tombstone error, never part of it.
        while not stop.is_set():
            for head in ended:
                try:
                    facts = await store.read_facts(head.run_id)  # the store's own read: all or nothing
                    assert len(facts) == head.last_seq
                    run = await snapshot(store, head.run_id)
                except RunPruned:
                    seen.append("pruned")
                    continue
                assert run.head == head and len(run.facts) == head.last_seq
                seen.append("whole")
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer)
        tg.start_soon(reader)
        result = await prune(store, ENDED, timedelta(days=30), now=NOW)
    assert sorted(result.pruned) == [h.run_id for h in ended]
    assert result.skipped == {}
    for head in ended:
        with pytest.raises(RunPruned):
            await store.load(head.run_id)
    live = await store.load(run_id(50))
    assert live.version == 16 and not live.status.is_terminal
    assert len(await store.read_facts(run_id(50))) == live.last_seq
    assert "pruned" in seen


async def test_prune_keeps_recent_runs_and_other_statuses_and_a_dry_run_deletes_nothing(
    store: RunStore,
) -> None:
    old = await stored(store, *history(run_id(1)))
    recent_head, recent_facts = history(run_id(2))
    recent = await stored(store, recent_head, recent_facts)
    dry = await prune(store, ENDED, timedelta(days=30), now=NOW, dry_run=True)
    assert dry.dry_run and sorted(dry.pruned) == [run_id(1), run_id(2)]
    assert await store.load(run_id(1)) == old and await store.load(run_id(2)) == recent
    # Only failed runs: the cancelled ones stay.
    assert (await prune(store, frozenset({RunStatus.FAILED}), timedelta(days=30), now=NOW)).pruned == ()
    # Ended too recently: a cutoff before they ended keeps them.
    kept = await prune(store, ENDED, timedelta(days=30), now=BASE_TIME + timedelta(days=1))
    assert kept.pruned == ()
    assert await store.load(run_id(1)) == old

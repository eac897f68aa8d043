"""The retry window of a start without an idempotency key (issue 21 §1,
:mod:`orchestration.engine.start_window`): an identical start by the same identity within the window
returns the run the first one made, durably (a look-up in the store), and nothing else does."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import anyio

from orchestration.core.clock import ManualClock
from orchestration.core.costs import Budget
from orchestration.core.inputs import RetryWindow, StartRequest
from orchestration.core.models import ParentLink
from orchestration.engine.runtime import Runtime
from orchestration.engine.start_window import bucket_of, fingerprint, window_key
from orchestration.store import Tombstone
from stores.filesystem import FilesystemStore
from tests.unit.helpers import make_runtime

W = 600.0
ALICE = RetryWindow(identity="stdio:alice", seconds=W)
START = StartRequest("Build a rate limiter", chain=("architect", "engineer"), retry=ALICE)


async def test_the_same_start_twice_is_one_run() -> None:
    runtime = make_runtime()
    first, created = await runtime.start(START)
    again, created_again = await runtime.start(START)
    assert created and not created_again
    assert again.run_id == first.run_id
    assert len((await runtime.list_runs()).runs) == 1
    # The run holds the window's implicit key (the current bucket's first).
    bucket = bucket_of(runtime.clock.now(), W)
    assert first.idempotency_key == window_key(fingerprint(START, ALICE), bucket)


async def test_any_argument_that_shapes_the_run_makes_another_run() -> None:
    runtime = make_runtime()
    first, _ = await runtime.start(START)
    others = [
        replace(START, request="Build a rate limiter!"),
        replace(START, chain=("architect",)),
        replace(START, approve_before=("engineer",)),
        replace(START, worker_backend="provider"),
        replace(START, timeout_seconds=60.0),
        replace(START, task_timeout_seconds=60.0),
        replace(START, budget=Budget(max_total_tokens=1000)),
        replace(START, retry=replace(ALICE, identity="stdio:bob")),
        replace(START, retry=replace(ALICE, seconds=W + 1)),
    ]
    ids = {first.run_id}
    for other in others:
        head, created = await runtime.start(other)
        assert created, other
        ids.add(head.run_id)
    assert len(ids) == len(others) + 1
    # What does not shape the run is not part of it: a trace, who the run records as its starter.
    same, created = await runtime.start(replace(START, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"))
    assert not created and same.run_id == first.run_id


async def test_new_run_makes_another_which_a_retry_then_finds() -> None:
    runtime = make_runtime()
    first, _ = await runtime.start(START)
    forced = replace(START, retry=replace(ALICE, new_run=True))
    second, created = await runtime.start(forced)
    assert created and second.run_id != first.run_id
    # A retry (without new_run) gets the newest run of the window.
    retried, created = await runtime.start(START)
    assert not created and retried.run_id == second.run_id
    third, created = await runtime.start(forced)
    assert created and third.run_id not in (first.run_id, second.run_id)


async def test_the_window_ends_after_its_seconds_also_across_a_bucket_boundary() -> None:
    # Start 1 s before a bucket boundary: 2 s later the look-up reads the previous bucket.
    boundary = (bucket_of(datetime(2026, 3, 1, tzinfo=UTC), W) + 1) * W
    clock = ManualClock(datetime.fromtimestamp(boundary - 1, tz=UTC))
    runtime = make_runtime(clock=clock)
    first, _ = await runtime.start(START)
    clock.advance(2)
    assert (await runtime.start(START))[0].run_id == first.run_id
    clock.advance(W - 3)  # W - 1 s after the first start
    assert (await runtime.start(START))[0].run_id == first.run_id
    clock.advance(2)  # W + 1 s after: a new run
    later, created = await runtime.start(START)
    assert created and later.run_id != first.run_id
    assert (await runtime.start(START))[0].run_id == later.run_id


async def test_no_window_or_an_explicit_key_keeps_the_old_rules() -> None:
    runtime = make_runtime()
    off = replace(START, retry=replace(ALICE, seconds=0))
    a, _ = await runtime.start(off)
    b, _ = await runtime.start(off)
    assert a.run_id != b.run_id
    keyed = replace(START, idempotency_key="mine")
    k1, created = await runtime.start(keyed)
    k2, created_again = await runtime.start(keyed)
    assert created and not created_again and k1.run_id == k2.run_id and k1.idempotency_key == "mine"
    # The key decides alone: a keyless start does not find the keyed run, nor new_run a new one.
    assert (await runtime.start(START))[0].run_id != k1.run_id
    forced = replace(keyed, retry=replace(ALICE, new_run=True))
    assert (await runtime.start(forced)) == (await runtime.status(k1.run_id), False)


async def test_a_pruned_run_in_the_window_never_fails_a_start() -> None:
    runtime = make_runtime()
    first, _ = await runtime.start(START)
    cancelled = await runtime.cancel(first.run_id)
    await runtime.store.delete_run(Tombstone.of(cancelled, "pruned", runtime.clock.now()))
    again, created = await runtime.start(START)
    assert created and again.run_id != first.run_id
    print_ = fingerprint(START, ALICE)
    assert again.idempotency_key == window_key(print_, bucket_of(runtime.clock.now(), W), 1)
    assert (await runtime.start(START))[0].run_id == again.run_id


async def test_concurrent_identical_starts_make_one_run() -> None:
    runtime = make_runtime()
    seen: list[tuple[str, bool]] = []

    async def start() -> None:
        head, created = await runtime.start(START)
        seen.append((head.run_id, created))

    async with anyio.create_task_group() as group:
        for _ in range(8):
            group.start_soon(start)
    assert len({run_id for run_id, _ in seen}) == 1
    assert [created for _, created in seen].count(True) == 1


async def test_the_window_survives_a_restart_and_holds_across_runtimes_on_one_store(tmp_path: Path) -> None:
    clock = ManualClock()

    def runtime_on(store: FilesystemStore) -> Runtime:
        return Runtime(store, make_runtime().catalog, clock=clock)

    store = FilesystemStore(tmp_path / "store")
    first, _ = await runtime_on(store).start(START)
    await store.close()
    reopened = FilesystemStore(tmp_path / "store")  # a new process on the same store
    other = FilesystemStore(tmp_path / "store")  # and another server beside it
    try:
        clock.advance(30)
        assert await runtime_on(reopened).start(START) == (await reopened.load(first.run_id), False)
        assert (await runtime_on(other).start(START))[0].run_id == first.run_id
    finally:
        await reopened.close()
        await other.close()


def test_the_implicit_keys_fit_the_key_limit() -> None:
    key = window_key(fingerprint(START, ALICE), 10**9, 99)
    assert key.startswith("retry:") and len(key) <= 200


def test_a_child_runs_parent_task_is_part_of_the_fingerprint() -> None:
    child = replace(START, parent=ParentLink(run_id="run-parent", task_id="engineer"))
    other_task = replace(START, parent=ParentLink(run_id="run-parent", task_id="reviewer"))
    prints = {fingerprint(s, ALICE) for s in (START, child, other_task)}
    assert len(prints) == 3
    # How long the call waits is not an argument of the start at all: nothing to hash.
    assert fingerprint(replace(START, retry=None), ALICE) == fingerprint(START, ALICE)


async def test_a_first_start_reads_one_key_and_a_retry_still_finds_the_newest_run() -> None:
    runtime = make_runtime()
    store = runtime.store
    read: list[str] = []
    find = store.find_by_idempotency_key

    async def counted(key: str):  # type: ignore[no-untyped-def]
        read.append(key)
        return await find(key)

    store.find_by_idempotency_key = counted  # type: ignore[method-assign]
    print_ = fingerprint(START, ALICE)
    bucket = bucket_of(runtime.clock.now(), W)
    first, created = await runtime.start(START)
    # Only the previous bucket's first key is read; the create tries the current one's.
    assert created and read == [window_key(print_, bucket - 1)]
    forced = replace(START, retry=replace(ALICE, new_run=True))
    second, _ = await runtime.start(forced)
    read.clear()
    retried, created = await runtime.start(START)
    # The guess meets the first run's key: the full look-up answers with the newest run.
    assert not created and retried.run_id == second.run_id != first.run_id
    assert read[0] == window_key(print_, bucket - 1) and window_key(print_, bucket, 1) in read

"""Crash safety of child runs, in process (DESIGN §1): every prefix of a parent's log decides as
the uninterrupted run did; a kill between ``child_started`` and the child's creation (either
order) leaves exactly one child; whichever process sees a child end records it on the parent,
once; the dispatcher's sweep is the safety net when nobody did."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

import anyio
import pytest

import orchestration.engine.drive as drive_module
import orchestration.engine.fanout as fanout_module
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.decide import (
    Action,
    AwaitChild,
    StartAttempt,
    StartChild,
    child_run_id,
    next_action,
    next_actions,
)
from orchestration.core.facts import AttemptStarted, ChildEnded, ChildStarted, Fact, TaskCompleted
from orchestration.core.fold import apply_write, fold
from orchestration.core.models import RunHead
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.children import ChildRuns
from orchestration.engine.dispatcher import Dispatcher
from orchestration.store import CreateResult, Lease
from stores.memory import MemoryStore
from tests.unit.child_chains import child_catalog, child_runtime, drive_tree

START = StartRequest("Build a CLI", chain="outer", worker_backend="provider")


class Killed(Exception):
    """Stands for SIGKILL: the process stops where it is; only the store survives."""


class BoundaryStore(MemoryStore):
    """Remembers, per run, the length of its fact log after each durable write."""

    def __init__(self) -> None:
        super().__init__()
        self.boundaries: dict[str, list[int]] = {}

    async def create(
        self, head: RunHead, facts: Sequence[Fact], *, flushing: Callable[[], None] | None = None
    ) -> CreateResult:
        result = await super().create(head, facts, flushing=flushing)
        if result.created:
            self.boundaries.setdefault(head.run_id, []).append(head.last_seq)
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
        stored = await super().append(run_id, expected_version, facts, head, lease, flushing=flushing)
        self.boundaries[run_id].append(head.last_seq)
        return stored


async def until_terminal(store: MemoryStore, run_id: str) -> None:
    for _ in range(500):
        if (await store.load(run_id)).status.is_terminal:
            return
        await anyio.sleep(0.02)


async def run_ids(store: MemoryStore) -> list[str]:
    return [h.run_id for h in (await store.list_runs()).runs]


async def test_every_prefix_of_a_parent_decides_as_the_uninterrupted_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decided: dict[tuple[str, int], tuple[datetime, Action]] = {}

    def recording(head: RunHead, now: datetime) -> Action:
        action = next_action(head, now)
        previous = decided.get((head.run_id, head.last_seq))
        assert previous is None or previous[1] == action
        decided[(head.run_id, head.last_seq)] = (now, action)
        return action

    monkeypatch.setattr(drive_module, "next_action", recording)
    store = BoundaryStore()
    runtime = child_runtime(store)
    parent, _ = await runtime.start(START)
    assert (await drive_tree(runtime, parent.run_id)).status == RunStatus.COMPLETED
    facts = await store.read_facts(parent.run_id)
    kinds = set()
    for prefix_len in store.boundaries[parent.run_id]:
        folded = fold(facts[:prefix_len])
        last = facts[prefix_len - 1]
        if isinstance(last, AttemptStarted):
            assert next_action(folded, ManualClock().now()) == StartAttempt(
                last.task_id, last.attempt + 1, possible_duplicate_call=True
            )
            continue
        now, action = decided[(parent.run_id, prefix_len)]
        assert next_action(folded, now) == action, f"prefix {prefix_len}"
        kinds.add(type(action))
    # The prefix ending at child_started (the child may not exist yet) decides to wait for the
    # child the fact names: a restarted parent looks for that child, it does not start another.
    started = next(f for f in facts if isinstance(f, ChildStarted))
    assert started.child_run_id == child_run_id(parent.run_id, "build")
    assert next_action(fold(facts[: started.seq]), ManualClock().now()) == AwaitChild(
        "build", started.child_run_id
    )
    assert {StartChild, AwaitChild} <= kinds


@pytest.mark.parametrize("recovery", ["drive", "sweep"])
async def test_a_kill_after_child_started_before_the_child_exists_leaves_one_child(
    recovery: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore()
    first = child_runtime(store)
    parent, _ = await first.start(START)

    async def killed(*args: object) -> RunHead:
        raise Killed

    monkeypatch.setattr(ChildRuns, "_create", killed)
    with pytest.raises(Killed):  # as itself: a drive runs no task group of its own
        await first.drive(parent.run_id)
    monkeypatch.undo()
    head = await store.load(parent.run_id)
    assert head.status == RunStatus.AWAITING_CHILDREN
    assert await run_ids(store) == [parent.run_id]  # the child does not exist yet

    second = child_runtime(store, clock=ManualClock(first.clock.now()))
    if recovery == "drive":
        assert await second.drive(parent.run_id) == AwaitChild("build", child_run_id(parent.run_id, "build"))
    else:
        await second.children.sweep()
    assert sorted(await run_ids(store)) == sorted([parent.run_id, child_run_id(parent.run_id, "build")])
    final = await drive_tree(second, parent.run_id)
    assert final.status == RunStatus.COMPLETED
    assert len(await run_ids(store)) == 2


async def test_a_child_created_before_its_parent_recorded_it_is_the_one_the_parent_finds() -> None:
    """The reverse order: the child exists, the parent's ``child_started`` is not recorded yet."""
    store = MemoryStore()
    runtime = child_runtime(store)
    parent, _ = await runtime.start(StartRequest("Build a CLI", chain="outer"))  # inline: stops at the host
    await runtime.drive(parent.run_id)
    await runtime.submit_host_output(parent.run_id, "architect", "the design")
    head = await store.load(parent.run_id)  # queued, the child step not decided on yet
    child_id = child_run_id(parent.run_id, "build")
    started = ChildStarted(
        seq=head.last_seq + 1, at=runtime.clock.now(), task_id="build", child_run_id=child_id, chain="inner"
    )
    unrecorded = apply_write(head, [started])
    early = await runtime.children._create(unrecorded, "build", child_id)
    again = await runtime.children._create(unrecorded, "build", child_id)
    assert again == early  # a second creation returns the first (same key, same request)

    assert await runtime.drive(parent.run_id) == AwaitChild("build", child_id)
    assert sorted(await run_ids(store)) == sorted([parent.run_id, child_id])
    facts = await store.read_facts(parent.run_id)
    assert [f.child_run_id for f in facts if isinstance(f, ChildStarted)] == [child_id]


async def test_whoever_sees_the_child_end_records_it_once() -> None:
    store = MemoryStore()
    one = child_runtime(store)
    parent, _ = await one.start(START)
    await one.drive(parent.run_id)
    child_id = child_run_id(parent.run_id, "build")
    # The child is driven to its end by a process whose listener does not tell the parent (it
    # died right after the child's last write, say).
    two = child_runtime(store, clock=ManualClock(one.clock.now()))
    two.remove_listener(two.children.changed)
    while not (await store.load(child_id)).status.is_terminal:
        await two.drive(child_id)
    assert (await store.load(parent.run_id)).status == RunStatus.AWAITING_CHILDREN

    child = await store.load(child_id)
    results = []
    async with anyio.create_task_group() as tg:
        for runtime in (one, two, one):

            async def record(r: ChildRuns = runtime.children) -> None:
                results.append(await r.record_end(child))

            tg.start_soon(record)
    assert sorted(results) == [False, False, True]
    assert await one.children.sweep() == 0  # nothing left to record
    facts = await store.read_facts(parent.run_id)
    assert len([f for f in facts if isinstance(f, ChildEnded)]) == 1
    assert (await drive_tree(one, parent.run_id)).status == RunStatus.COMPLETED


async def test_the_dispatcher_sweep_records_an_end_nobody_recorded() -> None:
    store = MemoryStore()
    runtime = child_runtime(store)
    parent, _ = await runtime.start(START)
    await runtime.drive(parent.run_id)
    child_id = child_run_id(parent.run_id, "build")
    quiet = child_runtime(store, clock=ManualClock(runtime.clock.now()))
    quiet.remove_listener(quiet.children.changed)
    while not (await store.load(child_id)).status.is_terminal:
        await quiet.drive(child_id)
    assert (await store.load(parent.run_id)).status == RunStatus.AWAITING_CHILDREN

    dispatcher = Dispatcher(runtime, poll_seconds=0.01, child_poll_seconds=0.05)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(dispatcher.run)
            await until_terminal(store, parent.run_id)
            dispatcher.stop()
    assert (await store.load(parent.run_id)).status == RunStatus.COMPLETED


async def test_a_waiting_parent_is_not_claimed_by_the_dispatcher() -> None:
    """No slot and no lease while the child works: the dispatcher drives the child, never the
    waiting parent, until the child's end is recorded."""
    store = MemoryStore()
    runtime = child_runtime(store)
    parent, _ = await runtime.start(StartRequest("Build", chain="outer-gated", worker_backend="provider"))
    driven: list[str] = []
    real_drive = runtime.drive

    async def counting(run_id: str, lease: Lease | None = None, head: RunHead | None = None) -> Action | None:
        driven.append(run_id)
        return await real_drive(run_id, lease, head)

    runtime.drive = counting  # type: ignore[method-assign]

    dispatcher = Dispatcher(runtime, poll_seconds=0.01, child_poll_seconds=0.01)
    child_id = child_run_id(parent.run_id, "build")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(dispatcher.run)
            for _ in range(500):
                waiting = await store.list_runs(frozenset({RunStatus.AWAITING_APPROVAL}))
                if [h.run_id for h in waiting.runs] == [child_id]:
                    break
                await anyio.sleep(0.02)
            mark = len(driven)
            await anyio.sleep(0.3)  # many polls and sweeps while the child waits at its gate
            assert parent.run_id not in driven[mark:]
            assert not dispatcher.active
            child = await store.load(child_id)
            await runtime.approve(child_id, "approve", child.gates[0].gate_id)
            await until_terminal(store, parent.run_id)
            dispatcher.stop()
    assert (await store.load(parent.run_id)).status == RunStatus.COMPLETED


async def test_a_child_created_while_its_parent_was_cancelled_is_cancelled_too() -> None:
    store = MemoryStore()
    runtime = child_runtime(store)
    parent, _ = await runtime.start(StartRequest("Build a CLI", chain="outer"))
    await runtime.drive(parent.run_id)
    await runtime.submit_host_output(parent.run_id, "architect", "the design")
    head = await store.load(parent.run_id)
    child_id = child_run_id(parent.run_id, "build")
    started = ChildStarted(
        seq=head.last_seq + 1, at=runtime.clock.now(), task_id="build", child_run_id=child_id, chain="inner"
    )
    # The drive decided on the parent as it was; the cancel lands before the child is created.
    await runtime.cancel(parent.run_id)
    child = await runtime.children._create(apply_write(head, [started]), "build", child_id)
    assert child.status == RunStatus.CANCELLED


async def test_the_sweep_looks_at_every_waiting_parent_page_by_page(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    first = child_runtime(store)
    parents = [
        (await first.start(StartRequest(f"Build {i}", chain="outer", worker_backend="provider")))[0]
        for i in range(3)
    ]

    async def killed(*args: object) -> RunHead:
        raise Killed

    monkeypatch.setattr(ChildRuns, "_create", killed)
    for parent in parents:
        with pytest.raises(Killed):
            await first.drive(parent.run_id)
    monkeypatch.undo()
    second = child_runtime(store, clock=ManualClock(first.clock.now()))
    assert await second.children.sweep(limit=1) == 0  # it created children; no parent moved yet
    expected = {child_run_id(p.run_id, "build") for p in parents}
    assert expected <= set(await run_ids(store))


async def test_every_prefix_of_a_parallel_parent_decides_as_the_uninterrupted_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same for a parallel chain whose two first steps run child chains at once."""
    decided: dict[tuple[str, int], tuple[datetime, tuple[Action, ...]]] = {}

    def recording(head: RunHead, now: datetime) -> tuple[Action, ...]:
        actions = next_actions(head, now)
        previous = decided.get((head.run_id, head.last_seq))
        assert previous is None or previous[1] == actions
        decided[(head.run_id, head.last_seq)] = (now, actions)
        return actions

    monkeypatch.setattr(fanout_module, "next_actions", recording)
    both = {
        "steps": [
            {"name": "left", "chain": "inner", "after": []},
            {"name": "right", "chain": "inner", "after": []},
            {"specialist": "writer", "after": ["left", "right"]},
        ]
    }
    store = BoundaryStore()
    runtime = child_runtime(store, catalog=child_catalog({"both": both}))
    parent, _ = await runtime.start(StartRequest("Two ways", chain="both", worker_backend="provider"))
    assert (await drive_tree(runtime, parent.run_id)).status == RunStatus.COMPLETED
    facts = await store.read_facts(parent.run_id)
    seen: set[type] = set()
    compared = 0
    for prefix_len in store.boundaries[parent.run_id]:
        if isinstance(facts[prefix_len - 1], AttemptStarted):
            continue  # a call in flight: an orphan to a restarted run (test_parallel_prefixes)
        if (parent.run_id, prefix_len) not in decided:
            # A child's end recorded while the other child still worked: nobody decided on the
            # parent before the second end was recorded (the next write).
            assert isinstance(facts[prefix_len - 1], TaskCompleted)
            continue
        now, actions = decided[(parent.run_id, prefix_len)]
        assert next_actions(fold(facts[:prefix_len]), now) == actions, f"prefix {prefix_len}"
        seen |= {type(a) for a in actions}
        compared += 1
    assert {StartChild, AwaitChild} <= seen and compared >= 5
    assert [f.task_id for f in facts if isinstance(f, ChildStarted)] == ["left", "right"]

"""The engine's public seams (issue 20 §2): the leased run a drive and its parts read and write
through, the runtime's call control (cancel scopes, stopping) and change feed, and the runtime's
public read methods that the server and :mod:`orchestration.ops` use instead of its store."""

from __future__ import annotations

import ast
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestration.core.clock import ManualClock
from orchestration.core.facts import Fact, RunCancelled
from orchestration.core.models import RunHead
from orchestration.engine.changes import ChangeFeed
from orchestration.engine.leased_run import CallControl, LeasedRun, RuntimeSettings
from orchestration.errors import LeaseLost
from orchestration.ops import ForkRequest, fork_run
from stores.memory import MemoryStore
from tests.unit.faulty import start_request
from tests.unit.helpers import make_runtime

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = RuntimeSettings(
    owner="one",
    lease_ttl_seconds=30.0,
    in_memory_wait_cap_seconds=30.0,
    cancel_poll_seconds=0.5,
    store_outage_seconds=30.0,
)


class Recorder:
    """A ``recorded`` callback that keeps what it was told."""

    def __init__(self) -> None:
        self.writes: list[tuple[list[str], int]] = []

    async def __call__(self, facts: Sequence[Fact], stored: RunHead) -> None:
        self.writes.append(([f.type for f in facts], stored.version))


def cancel_fact(head: RunHead, clock: ManualClock) -> RunCancelled:
    return RunCancelled(seq=head.last_seq + 1, at=clock.now(), reason="seam test", cancelled_by=None)


async def leased_run(
    store: MemoryStore, clock: ManualClock, owner: str = "one"
) -> tuple[LeasedRun, Recorder]:
    runtime = make_runtime(store, clock=clock)
    head, _ = await runtime.start(start_request("seam"))
    lease = await store.claim_lease(head.run_id, owner, 30.0, clock.now())
    assert lease is not None
    recorder = Recorder()
    leased = LeasedRun(
        lease, store=store, clock=clock, settings=SETTINGS, recorded=recorder, calls=CallControl()
    )
    return leased, recorder


async def test_a_leased_run_appends_under_its_lease_and_reports_the_write() -> None:
    store, clock = MemoryStore(), ManualClock()
    leased, recorder = await leased_run(store, clock)
    head = await leased.load()
    stored = await leased.append(head, [cancel_fact(head, clock)])
    assert stored.version == head.version + 1
    assert (await store.load(leased.run_id)).version == stored.version
    assert recorder.writes == [(["run_cancelled"], stored.version)]


async def test_a_leased_run_whose_lease_was_claimed_by_another_records_nothing() -> None:
    store, clock = MemoryStore(), ManualClock()
    leased, recorder = await leased_run(store, clock)
    head = await leased.load()
    clock.advance(31)  # the lease expired unrenewed, and another worker claims the run
    assert await store.claim_lease(leased.run_id, "two", 30.0, clock.now()) is not None
    with pytest.raises(LeaseLost):
        await leased.append(head, [cancel_fact(head, clock)])
    assert (await store.load(leased.run_id)).version == head.version
    assert recorder.writes == []


async def test_a_claim_handed_over_to_a_leased_run_is_the_one_its_writes_carry() -> None:
    store, clock = MemoryStore(), ManualClock()
    leased, _ = await leased_run(store, clock)
    head = await leased.load()
    clock.advance(31)
    again = await store.claim_lease(leased.run_id, "one", 30.0, clock.now())  # a new token
    assert again is not None and again.token != leased.lease.token
    leased.hand_over(again)
    assert leased.lease is again
    stored = await leased.append(head, [cancel_fact(head, clock)])
    assert stored.version == head.version + 1


class Scope:
    def __init__(self) -> None:
        self.cancelled = 0

    def cancel(self) -> None:
        self.cancelled += 1


def test_call_control_cancels_the_tracked_scope_and_keeps_a_newer_one() -> None:
    calls = CallControl()
    first, second = Scope(), Scope()
    calls.cancel("run-a")  # nothing in flight: nothing to do
    calls.track("run-a", first)
    calls.cancel("run-a")
    assert first.cancelled == 1
    calls.track("run-a", second)
    calls.untrack("run-a", first)  # an older scope's end leaves the newer one tracked
    calls.cancel("run-a")
    assert (first.cancelled, second.cancelled) == (1, 1)
    calls.untrack("run-a", second)
    calls.cancel("run-a")
    assert second.cancelled == 1
    assert not calls.stopping
    calls.stop()
    assert calls.stopping


async def test_a_leased_run_tracks_its_calls_in_the_runtimes_call_control() -> None:
    store, clock = MemoryStore(), ManualClock()
    leased, _ = await leased_run(store, clock)
    scope = Scope()
    leased.track_call(scope)
    leased.calls.cancel(leased.run_id)
    leased.untrack_call(scope)
    leased.calls.cancel(leased.run_id)
    assert scope.cancelled == 1
    assert not leased.stopping
    leased.calls.stop()
    assert leased.stopping


def test_the_runtime_stops_through_its_call_control() -> None:
    runtime = make_runtime()
    assert not runtime.stopping
    runtime.stop()
    assert runtime.stopping and runtime.calls.stopping


async def test_the_change_feed_wakes_waiters_and_calls_every_listener(
    caplog: pytest.LogCaptureFixture,
) -> None:
    feed = ChangeFeed()
    runtime = make_runtime()
    head, _ = await runtime.start(start_request("feed"))
    heard: list[int] = []

    async def failing(_: RunHead) -> None:
        raise RuntimeError("listener bug")

    async def listener(seen: RunHead) -> None:
        heard.append(seen.version)

    feed.add_listener(failing)
    feed.add_listener(listener)
    event = feed.waiters.event(head.run_id)
    with caplog.at_level(logging.INFO, logger="construct.runtime"):
        await feed.recorded([], head)
    assert event.is_set()
    assert heard == [head.version]  # a failing listener does not keep the others from hearing
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert "facts_recorded" in actions and "listener_failed" in actions
    feed.remove_listener(listener)
    await feed.changed(head)
    assert heard == [head.version]


async def test_the_runtimes_public_reads_are_its_stores() -> None:
    store = MemoryStore()
    runtime = make_runtime(store)
    head, _ = await runtime.start(start_request("reads"))
    await runtime.cancel(head.run_id)
    facts = await store.read_facts(head.run_id)
    assert await runtime.read_facts(head.run_id) == facts
    assert await runtime.read_facts(head.run_id, 1, 1) == facts[1:2]
    current, log = await runtime.read_log(head.run_id)
    assert current == await store.load(head.run_id) and log == tuple(facts)
    assert runtime.store_name == store.name
    assert await runtime.tombstone(head.run_id) is None


async def test_a_fork_tells_the_runtimes_listeners_of_the_run_it_created_once() -> None:
    runtime = make_runtime()
    source, _ = await runtime.start(start_request("fork"))
    await runtime.drive(source.run_id)
    heard: list[str] = []

    async def listener(seen: RunHead) -> None:
        heard.append(seen.run_id)

    runtime.add_listener(listener)
    fork = ForkRequest(source.run_id, "engineer", idempotency_key="seam-fork")
    head, created = await fork_run(runtime, fork)
    again, created_again = await fork_run(runtime, fork)
    assert (created, created_again) == (True, False) and again.run_id == head.run_id
    assert heard == [head.run_id]


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_engine_never_imports_ops_and_the_drives_parts_do_not_import_the_drive() -> None:
    engine = sorted((ROOT / "orchestration" / "engine").glob("*.py"))
    assert engine
    for path in engine:
        imports = imports_of(path)
        assert not {n for n in imports if n.startswith("orchestration.ops")}, path.name
        if path.stem in ("fanout", "delegation", "leased_run"):
            assert "orchestration.engine.drive" not in imports, path.name


def test_the_import_reader_sees_a_planted_import(tmp_path: Path) -> None:
    planted = tmp_path / "fanout.py"
    planted.write_text(
        "from orchestration.engine.drive import Drive\nfrom orchestration.ops import fork_run\n"
    )
    assert {"orchestration.engine.drive", "orchestration.ops"} <= imports_of(planted)

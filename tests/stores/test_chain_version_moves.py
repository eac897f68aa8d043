"""Chain versions seen by the runtime, on every store: each configured snapshot a run starts on (and
each chain of the configuration at a server's start) is kept as a numbered version with its label;
a run names its version, also when started with options of its own; a run moves to a kept version
by number (back to an earlier one too), with its start-time options carried; an unknown number is
``unknown_chain`` naming the kept ones; a prune removes the versions no run is on any more."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.upgrades import UpgradePlan
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import Runtime, RuntimeSettings
from orchestration.engine.reading import read_snapshot
from orchestration.errors import UnknownChain
from orchestration.ops import at_startup, prune
from orchestration.store import KeepsChainVersions, RunStore
from tests.unit.helpers import sequential_ids

RUN_IDS = sequential_ids()
FIRST = "You are the reviewer. Read the diff."
SECOND = "You are the reviewer. Check every change against the security checklist first."


def catalog(reviewer: str, label: str | None) -> Catalog:
    """Chain ``review`` (architect -> engineer -> reviewer, upgrade manual) with that reviewer."""
    chain: dict[str, Any] = {"steps": ["architect", "engineer", "reviewer"], "upgrade": "manual"}
    if label is not None:
        chain["version"] = label
    raw = {
        "specialists": {"reviewer": {"description": "Reviews", "persona": reviewer}},
        "chains": {"review": chain},
    }
    return Catalog.builtin().extended(raw, "versions-test", Path("."))


def runtime(store: RunStore, chains: Catalog, clock: ManualClock) -> Runtime:
    return Runtime(store, chains, clock=clock, new_id=RUN_IDS, settings=RuntimeSettings(owner="t"))


def kept(store: RunStore) -> KeepsChainVersions:
    assert isinstance(store, KeepsChainVersions)
    return store


async def test_versions_are_kept_as_runs_start_and_a_run_names_its_own(store: RunStore) -> None:
    clock = ManualClock()
    first = runtime(store, catalog(FIRST, "2026.1"), clock)
    await at_startup(first)  # the configuration's chains, kept as the server starts
    plain, _ = await first.start(StartRequest("Build it", chain="review"))
    gated, _ = await first.start(StartRequest("Build it", chain="review", approve_before=("engineer",)))
    assert plain.chain_hash != gated.chain_hash  # a run's own options make its own snapshot
    clock.advance(3600)
    second = runtime(store, catalog(SECOND, "2026.2"), clock)
    newer, _ = await second.start(StartRequest("Build it", chain="review"))
    listed = await kept(store).chain_versions("review")
    assert [(v.ordinal, v.label, v.source) for v in listed] == [
        (1, "2026.1", "config"),
        (2, "2026.2", "config"),
    ]
    assert listed[1].first_seen == listed[0].first_seen + timedelta(hours=1)
    for head, ordinal in ((plain, 1), (gated, 1), (newer, 2)):
        found = await second.versions.of_run(head.chain)
        assert found is not None and found.ordinal == ordinal, head.run_id
    # A list of specialists is a version of its own name, from a call.
    custom, _ = await second.start(StartRequest("Build it", chain=("architect", "engineer")))
    by_call = await kept(store).chain_versions(custom.chain.name)
    assert [(v.ordinal, v.source, v.label) for v in by_call] == [(1, "call", None)]


async def test_a_run_moves_to_a_version_by_number_with_its_options_carried(store: RunStore) -> None:
    clock = ManualClock()
    first = runtime(store, catalog(FIRST, None), clock)
    head, _ = await first.start(StartRequest("Build it", chain="review", approve_before=("reviewer",)))
    await first.submit_host_output(head.run_id, "architect", "the design")
    head = await first.submit_host_output(head.run_id, "engineer", "the code")
    assert head.status == RunStatus.AWAITING_APPROVAL
    second = runtime(store, catalog(SECOND, None), clock)
    await at_startup(second)
    # To the current version (v2): the gate asked at start is carried, and asked again.
    dry = await second.upgrade(head.run_id, 2)
    assert isinstance(dry.verdict, UpgradePlan) and not dry.moved
    assert await store.load(head.run_id) == dry.head  # a dry run writes nothing
    moved = await second.upgrade(head.run_id, 2, dry_run=False)
    assert moved.moved and moved.to_chain.step("reviewer").approve_before
    assert (await second.versions.of_run(moved.head.chain)).ordinal == 2  # type: ignore[union-attr]
    # And back to v1 (the change is rolled back): the reviewer the host receives is v1's.
    back = await second.upgrade(head.run_id, 1, dry_run=False, reason="roll back")
    assert back.moved and back.head.chain_hash == head.chain_hash
    approved = await second.approve(head.run_id, "approve", "before:reviewer")
    snapshot = await read_snapshot(store, approved)
    assert snapshot.host_task is not None and FIRST in snapshot.host_task.system
    assert SECOND not in snapshot.host_task.system
    # Asked for what it is on: nothing to do, nothing written.
    again = await second.upgrade(head.run_id, 1, dry_run=False)
    assert not again.moved and again.current
    with pytest.raises(UnknownChain, match=r"no version 7; its versions: v1, v2"):
        await second.upgrade(head.run_id, 7)


async def test_a_prune_removes_the_versions_no_run_is_on(store: RunStore) -> None:
    clock = ManualClock()
    personas = [f"You are the reviewer, take {n}." for n in range(4)]
    runs = []
    for n, persona in enumerate(personas):
        rt = runtime(store, catalog(persona, None), clock)
        head, _ = await rt.start(StartRequest("Build it", chain="review", approve_before=("engineer",)))
        runs.append(head.run_id)
        if n in (0, 1):
            await rt.cancel(head.run_id, "not needed")
    assert [v.ordinal for v in await kept(store).chain_versions("review")] == [1, 2, 3, 4]
    clock.advance(40 * 86400)
    current = [catalog(personas[2], None).resolve("review").content_hash()]
    result = await prune(
        store, frozenset({RunStatus.CANCELLED}), timedelta(days=30), now=clock.now(), current=current
    )
    assert sorted(result.pruned) == sorted(runs[:2])
    # v1 and v2's runs are gone; v3 is current (and its run lives), v4 its run's and the newest.
    assert result.versions_removed == 2
    assert [v.ordinal for v in await kept(store).chain_versions("review")] == [3, 4]

"""Runs moved to another version of their chain, on every store: a run parked at a gate or waiting
for the host moves when nothing it recorded would be reinterpreted, and what it waits for is
decided anew on the new chain (the gate asked again, the changed step's prompt handed out); a run
whose finished step changed is refused (``upgrade_blocked``, naming it) and goes on as it was; a
dry run changes nothing; a server that reads the run afterwards, whatever its configuration, folds
and decides against the chain the run moved to."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.decide import Action, AwaitApproval, PrepareHostTask, next_action
from orchestration.core.facts import ChainUpgraded
from orchestration.core.fold import fold
from orchestration.core.models import RunHead
from orchestration.core.upgrades import CannotMove, UpgradePlan
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine import Runtime, RuntimeSettings
from orchestration.engine.reading import read_snapshot
from orchestration.errors import Conflict
from orchestration.ops import at_startup, roll_out
from orchestration.store import RunStore
from tests.unit.engine.test_crash_prefixes import record_decisions
from tests.unit.fold_reference import fold as reference_fold
from tests.unit.helpers import sequential_ids

NEW_REVIEWER = "You are the reviewer. Check every change against the security checklist first."


def catalog(
    *, reviewer: str | None = None, architect: str | None = None, extra: bool = False, policy: str = "manual"
) -> Catalog:
    """Chain ``review``: architect -> engineer -> reviewer (gated before), with the personas given
    (None: the built-in ones) and, with ``extra``, a ``security`` step before the reviewer."""
    specialists: dict[str, Any] = {}
    if reviewer is not None:
        specialists["reviewer"] = {"description": "Reviews", "persona": reviewer}
    if architect is not None:
        specialists["architect"] = {"description": "Designs", "persona": architect}
    if extra:
        specialists["security"] = {"description": "Audits", "persona": "You audit for security."}
    steps: list[Any] = ["architect", "engineer", *(["security"] if extra else []), "reviewer"]
    raw = {"specialists": specialists, "chains": {"review": {"steps": steps, "upgrade": policy}}}
    return Catalog.builtin().extended(raw, "upgrade-test", Path("."))


#: one sequence of run ids for every runtime here: they share their stores
RUN_IDS = sequential_ids()


def runtime(store: RunStore, chains: Catalog, clock: ManualClock) -> Runtime:
    return Runtime(store, chains, clock=clock, new_id=RUN_IDS, settings=RuntimeSettings(owner="t"))


async def parked_at_the_reviewers_gate(store: RunStore, clock: ManualClock) -> str:
    old = runtime(store, catalog(), clock)
    head, _ = await old.start(StartRequest("Build it", chain="review", approve_before=("reviewer",)))
    await old.submit_host_output(head.run_id, "architect", "the design")
    head = await old.submit_host_output(head.run_id, "engineer", "the code")
    assert head.status == RunStatus.AWAITING_APPROVAL
    return head.run_id


async def test_a_run_at_a_gate_moves_and_the_changed_reviewer_is_what_the_host_receives(
    store: RunStore,
) -> None:
    clock = ManualClock()
    run_id = await parked_at_the_reviewers_gate(store, clock)
    new = runtime(store, catalog(reviewer=NEW_REVIEWER), clock)  # the configuration changed
    before = await store.load(run_id)
    dry = await new.upgrade(run_id)  # dry_run by default: the verdict, nothing written
    assert isinstance(dry.verdict, UpgradePlan) and dry.verdict.changed == ("reviewer",)
    assert not dry.moved and await store.load(run_id) == before
    moved = await new.upgrade(run_id, dry_run=False, by="ops", reason="the security checklist")
    assert moved.moved and moved.head.chain_hash == moved.to_hash != before.chain_hash
    # The gate on the changed step is asked again, in the move's own write.
    assert moved.head.status == RunStatus.AWAITING_APPROVAL and moved.head.version == before.version + 1
    facts = await store.read_facts(run_id, before.last_seq)
    assert [f.type for f in facts] == ["chain_upgraded", "approval_requested"]
    assert isinstance(facts[0], ChainUpgraded) and (facts[0].by, facts[0].reason) == (
        "ops",
        "the security checklist",
    )
    # A repeat records nothing.
    again = await new.upgrade(run_id, dry_run=False)
    assert not again.moved and again.current and again.head.version == moved.head.version
    head = await new.approve(run_id, "approve", "before:reviewer")
    snapshot = await read_snapshot(store, head)
    assert snapshot.host_task is not None and snapshot.host_task.task_id == "reviewer"
    assert NEW_REVIEWER in snapshot.host_task.system
    # A server still configured with the old chain decides against the chain the run moved to.
    old = runtime(store, catalog(), clock)
    head = await old.submit_host_output(run_id, "reviewer", "approved")
    assert head.status == RunStatus.COMPLETED and head.chain_hash == moved.to_hash
    facts = await store.read_facts(run_id)
    folded = fold(facts)
    assert folded == reference_fold(facts)  # the frozen reference fold agrees
    assert folded.model_dump(exclude={"version"}) == (await store.load(run_id)).model_dump(
        exclude={"version"}
    )


async def test_a_run_whose_finished_step_changed_is_blocked_and_goes_on(store: RunStore) -> None:
    clock = ManualClock()
    run_id = await parked_at_the_reviewers_gate(store, clock)
    new = runtime(store, catalog(architect="You design, tersely."), clock)
    before = await store.load(run_id)
    for dry_run in (True, False):
        blocked = await new.upgrade(run_id, dry_run=dry_run)
        assert isinstance(blocked.verdict, CannotMove) and not blocked.moved
        assert blocked.verdict.code == "upgrade_blocked" and blocked.verdict.step == "architect"
        assert "persona" not in blocked.verdict.reason and "specialist 'architect'" in blocked.verdict.reason
    assert await store.load(run_id) == before
    head = await new.approve(run_id, "approve", "before:reviewer")
    head = await new.submit_host_output(run_id, "reviewer", "fine")
    assert head.status == RunStatus.COMPLETED and head.chain_hash == before.chain_hash


async def test_a_handed_out_task_whose_step_changed_is_replaced_and_its_old_output_refused(
    store: RunStore,
) -> None:
    clock = ManualClock()
    old = runtime(store, catalog(), clock)
    head, _ = await old.start(StartRequest("Build it", chain="review"))
    await old.submit_host_output(head.run_id, "architect", "the design")
    head = await old.submit_host_output(head.run_id, "engineer", "the code")
    assert head.task("reviewer").status == TaskStatus.AWAITING_HOST
    new = runtime(store, catalog(reviewer=NEW_REVIEWER), clock)
    moved = await new.upgrade(head.run_id, dry_run=False)
    assert isinstance(moved.verdict, UpgradePlan) and moved.verdict.replaced == ("reviewer",)
    assert moved.head.task("reviewer").status == TaskStatus.SKIPPED
    replacement = moved.head.task("reviewer~2")
    assert replacement.status == TaskStatus.AWAITING_HOST and replacement.upgraded_from == "reviewer"
    snapshot = await read_snapshot(store, moved.head)
    assert snapshot.host_task is not None and NEW_REVIEWER in snapshot.host_task.system
    # The output written for the old prompt lands nowhere: the error names the task that awaits.
    with pytest.raises(Conflict, match="reviewer~2"):
        await old.submit_host_output(head.run_id, "reviewer", "reviewed against the old persona")
    head = await old.submit_host_output(head.run_id, "reviewer~2", "reviewed")
    assert head.status == RunStatus.COMPLETED


async def test_a_step_added_before_the_run_gets_there_runs(store: RunStore) -> None:
    clock = ManualClock()
    old = runtime(store, catalog(), clock)
    head, _ = await old.start(StartRequest("Build it", chain="review"))
    new = runtime(store, catalog(extra=True), clock)
    moved = await new.upgrade(head.run_id, dry_run=False)
    assert isinstance(moved.verdict, UpgradePlan) and moved.verdict.added == ("security",)
    assert [t.task_id for t in moved.head.tasks] == ["architect", "engineer", "security", "reviewer"]
    for task in ("architect", "engineer", "security", "reviewer"):
        head = await old.submit_host_output(head.run_id, task, f"the {task}'s work")
    assert head.status == RunStatus.COMPLETED


async def test_a_pinned_chains_runs_stay_where_they_are(store: RunStore) -> None:
    clock = ManualClock()
    run_id = await parked_at_the_reviewers_gate(store, clock)
    before = await store.load(run_id)
    pinned = runtime(store, catalog(reviewer=NEW_REVIEWER, policy="pinned"), clock)
    for dry_run in (True, False):
        refused = await pinned.upgrade(run_id, dry_run=dry_run)
        assert isinstance(refused.verdict, CannotMove) and not refused.moved
        assert "is pinned" in refused.verdict.reason and 'upgrade = "manual"' in refused.verdict.reason
    assert await store.load(run_id) == before


async def test_an_at_boundary_run_moves_by_itself_where_it_pauses(store: RunStore) -> None:
    clock = ManualClock()
    old = runtime(store, catalog(policy="at_boundary"), clock)
    head, _ = await old.start(StartRequest("Build it", chain="review", approve_before=("reviewer",)))
    await old.submit_host_output(head.run_id, "architect", "the design")
    # The configuration changes; the next pause of the run, here the engineer's answer parking it at
    # the reviewer's gate, is where it moves: the gate is asked on the new definition.
    new = runtime(store, catalog(reviewer=NEW_REVIEWER, policy="at_boundary"), clock)
    head = await new.submit_host_output(head.run_id, "engineer", "the code")
    assert head.chain_hash == catalog(reviewer=NEW_REVIEWER).resolve_again(head.chain).content_hash()
    facts = await store.read_facts(head.run_id)
    moved = [f for f in facts if isinstance(f, ChainUpgraded)]
    assert len(moved) == 1 and (moved[0].by, moved[0].reason) == ("policy", "at_boundary")
    assert head.status == RunStatus.AWAITING_APPROVAL
    head = await new.approve(head.run_id, "approve", "before:reviewer")
    snapshot = await read_snapshot(store, head)
    assert snapshot.host_task is not None and NEW_REVIEWER in snapshot.host_task.system


async def test_a_rollout_moves_what_can_move_and_says_why_the_rest_stays(store: RunStore) -> None:
    clock = ManualClock()
    old = runtime(store, catalog(), clock)
    fresh, _ = await old.start(StartRequest("Just started", chain="review"))
    parked = await parked_at_the_reviewers_gate(store, clock)
    done, _ = await old.start(StartRequest("Finished", chain="review"))
    for task in ("architect", "engineer", "reviewer"):
        await old.submit_host_output(done.run_id, task, "work")
    new = runtime(store, catalog(architect="You design, tersely."), clock)
    dry = await roll_out(new, "review", dry_run=True)
    assert dry.counts == {"would_move": 1, "blocked": 1} and list(dry.blocked) == [parked]
    assert "architect" in dry.blocked[parked]
    rolled = await roll_out(new, "review", dry_run=False, by="ops")
    assert rolled.counts == {"moved": 1, "blocked": 1}
    assert (await store.load(fresh.run_id)).chain_moved and not (await store.load(parked)).chain_moved
    assert (await roll_out(new, "review", dry_run=True)).counts == {"current": 1, "blocked": 1}
    started = await at_startup(new)
    assert started.behind == 1 and started.blocked == {parked: dry.blocked[parked]}


async def test_every_prefix_of_a_moved_run_decides_as_the_uninterrupted_run(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DESIGN §1 for a run that moves: the facts as this store gives them back, cut after any
    durable write (the move's among them) or any decision taken inside one, fold into the head the
    store held there, and decide what the uninterrupted run decided; a cut right after the move
    decides against the new chain (its reviewer's gate asked again, then its new prompt)."""
    decided: dict[int, tuple[datetime, Action]] = {}

    def recording(head: RunHead, now: datetime) -> Action:
        action = next_action(head, now)
        decided.setdefault(head.last_seq, (now, action))
        assert decided[head.last_seq][1] == action  # deciding twice on one record agrees
        return action

    record_decisions(monkeypatch, recording)
    clock = ManualClock()
    held: dict[int, RunHead] = {}
    run_id = await parked_at_the_reviewers_gate(store, clock)
    parked = await store.load(run_id)
    held[parked.last_seq] = parked
    new = runtime(store, catalog(reviewer=NEW_REVIEWER), clock)
    moved = await new.upgrade(run_id, dry_run=False, by="ops")
    assert moved.moved
    held[moved.head.last_seq] = moved.head
    moved_at = moved.head.last_seq
    head = await new.approve(run_id, "approve", "before:reviewer")
    held[head.last_seq] = head
    head = await new.submit_host_output(run_id, "reviewer", "approved")
    held[head.last_seq] = head
    assert head.status == RunStatus.COMPLETED

    facts = await store.read_facts(run_id)
    assert any(isinstance(f, ChainUpgraded) for f in facts)
    for cut in sorted({*held, *decided}):
        folded = fold(facts[:cut])
        if cut in held:
            assert folded.model_dump(exclude={"version"}) == held[cut].model_dump(exclude={"version"}), cut
        if cut in decided:
            now, action = decided[cut]
            assert next_action(folded, now) == action, f"cut after fact {cut}"
    after_move = fold(facts[:moved_at])
    assert after_move.chain_hash == moved.to_hash
    action = next_action(after_move, clock.now())
    assert isinstance(action, AwaitApproval) and action.gate_id == "before:reviewer", action
    # The decision taken once the gate is approved hands out the new reviewer's prompt.
    prepared = [n for n, (_, a) in decided.items() if n > moved_at and isinstance(a, PrepareHostTask)]
    assert prepared, decided
    assert len(decided) >= 6 and min(decided) < moved_at < max(decided), sorted(decided)

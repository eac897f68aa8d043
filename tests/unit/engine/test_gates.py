"""Gates a person may send back (revise), that expire, and that only named approvers decide
(issue 12 §2), on the runtime: what each decision records and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.facts import ApprovalDecided
from orchestration.core.fold import fold
from orchestration.core.models import RunHead
from orchestration.core.routing import revise_offered
from orchestration.engine.runtime import Runtime
from orchestration.errors import ConfigError, Conflict, Forbidden, InvalidArgument, InvalidState
from stores.memory import MemoryStore
from tests.unit.helpers import make_runtime, to_gate

CATALOG = Catalog.builtin().extended(
    {
        "chains": {
            "first-gated": {"steps": [{"specialist": "architect", "approve_before": True}, "engineer"]},
            "after-gated": {
                "steps": ["architect", {"specialist": "engineer", "approve_after": True, "max_visits": 2}]
            },
            "before-gated": {"steps": ["architect", {"specialist": "engineer", "approve_before": True}]},
            "guarded": {
                "steps": [
                    "architect",
                    {"specialist": "engineer", "approve_after": True, "approvers": ["alice", "bob"]},
                ]
            },
            "expiring": {
                "steps": [
                    "architect",
                    {"specialist": "engineer", "approve_before": True, "expires_after_seconds": 30},
                ]
            },
        }
    },
    "gates-test",
    Path("."),
)


def _requested(head: RunHead) -> str:
    return next(g.gate_id for g in head.gates if g.status == "requested")


async def test_revise_after_reruns_the_gated_step_with_the_comment_until_its_bound() -> None:
    runtime = make_runtime(catalog=CATALOG)
    head = await to_gate(runtime, "after-gated")
    gate = head.gate("after:engineer")
    assert gate is not None and revise_offered(head, gate)
    head = await runtime.approve(
        head.run_id, "revise", "after:engineer", "handle the empty list", "carol", channel="stdio"
    )
    assert [t.task_id for t in head.tasks] == ["architect", "engineer", "engineer~2"]
    assert head.task("engineer~2").revised_by == "after:engineer" and head.format == 3
    revised = head.gate("after:engineer")
    assert revised is not None and (revised.status, revised.approver, revised.channel) == (
        "revised",
        "carol",
        "stdio",
    )
    # The same revise again is a no-op; a different decision on the decided gate is a conflict.
    again = await runtime.approve(
        head.run_id, "revise", "after:engineer", "handle the empty list", "carol", channel="stdio"
    )
    assert again.version == head.version
    with pytest.raises(Conflict):
        await runtime.approve(head.run_id, "approve", "after:engineer", "handle the empty list", "carol")
    await runtime.drive(head.run_id)
    snap = await runtime.snapshot(head.run_id)
    assert snap.host_task is not None and snap.host_task.task_id == "engineer~2"
    prompt = snap.host_task.user
    assert "## Sent back by the approver (carol)" in prompt
    assert "handle the empty list" in prompt and "the work of engineer" in prompt
    await runtime.submit_host_output(head.run_id, "engineer~2", "the work of engineer~2")
    await runtime.drive(head.run_id)
    head = await runtime.status(head.run_id)
    assert _requested(head) == "after:engineer~2"
    gate = head.gate("after:engineer~2")
    assert gate is not None and not revise_offered(head, gate)
    # max_visits 2: a third visit is refused, the gate stays open for approve or reject.
    with pytest.raises(InvalidState, match=r"max_visits 2\).*exhausted"):
        await runtime.approve(head.run_id, "revise", "after:engineer~2")
    head = await runtime.approve(head.run_id, "approve", "after:engineer~2")
    await runtime.drive(head.run_id)
    assert (await runtime.status(head.run_id)).status.value == "completed"
    # A revise is a new enum value: its fact is format 3, so an older server refuses the run
    # (record_too_new) rather than reading it as something else; an approval stays format 1.
    decided = [f for f in await runtime.store.read_facts(head.run_id) if isinstance(f, ApprovalDecided)]
    assert [(f.decision, f.format) for f in decided] == [("revise", 3), ("approve", 1)]


async def test_revise_before_reruns_the_previous_step_then_asks_again() -> None:
    runtime = make_runtime(catalog=CATALOG)
    head = await to_gate(runtime, "before-gated")
    head = await runtime.approve(head.run_id, "revise", "before:engineer", "more detail")
    # The revised step's new instance is prepared for the host in the decision's write.
    assert [(t.task_id, t.status.value) for t in head.tasks] == [
        ("architect", "done"),
        ("engineer", "skipped"),
        ("architect~2", "awaiting_host"),
        ("engineer~2", "pending"),
    ]
    await runtime.drive(head.run_id)
    snap = await runtime.snapshot(head.run_id)
    assert snap.host_task is not None and snap.host_task.task_id == "architect~2"
    assert "more detail" in snap.host_task.user and "the work of architect" in snap.host_task.user
    await runtime.submit_host_output(head.run_id, "architect~2", "the work of architect~2")
    await runtime.drive(head.run_id)
    assert _requested(await runtime.status(head.run_id)) == "before:engineer~2"


async def test_revise_is_refused_where_there_is_nothing_to_send_back() -> None:
    runtime = make_runtime(catalog=CATALOG)
    head = await to_gate(runtime, "first-gated")
    gate = head.gate("before:architect")
    assert gate is not None and not revise_offered(head, gate)
    with pytest.raises(InvalidArgument, match="chain's first step"):
        await runtime.approve(head.run_id, "revise", "before:architect")
    assert (await runtime.status(head.run_id)).version == head.version


async def test_per_gate_approvers_are_the_only_ones_who_decide() -> None:
    runtime = make_runtime(catalog=CATALOG)
    head = await to_gate(runtime, "guarded")
    for who in (None, "mallory"):
        with pytest.raises(Forbidden, match="alice, bob"):
            await runtime.approve(head.run_id, "approve", "after:engineer", approver=who)
    head = await runtime.approve(head.run_id, "approve", "after:engineer", approver="bob", channel="stdio")
    gate = head.gate("after:engineer")
    assert gate is not None and (gate.status, gate.approver, gate.verified) == ("approved", "bob", False)
    assert head.format == 3  # an older server would let anyone decide: it must refuse the run


async def test_expiry_is_decided_from_facts_and_a_late_decision_is_refused() -> None:
    clock = ManualClock()
    store = MemoryStore()
    runtime = make_runtime(store, clock=clock, catalog=CATALOG)
    head = await to_gate(runtime, "expiring")
    gate = head.gate("before:engineer")
    assert gate is not None and gate.expires_at is not None
    assert head.wake_at == gate.expires_at  # the stores' wake_at index finds it
    clock.advance(30)
    assert head.run_id in await store.runnable(clock.now())
    # A decision after the expiry is refused, and the expiry is recorded (even with no server up).
    with pytest.raises(InvalidState, match=r"decided by expiry \(reject\); this decision was not recorded"):
        await runtime.approve(head.run_id, "approve", "before:engineer")
    head = await runtime.status(head.run_id)
    assert head.status.value == "rejected"  # on_expiry defaults to reject
    decided = [f for f in await store.read_facts(head.run_id) if isinstance(f, ApprovalDecided)]
    assert [(f.decision, f.channel, f.approver, f.verified) for f in decided] == [
        ("reject", "expiry", None, False)
    ]
    with pytest.raises(Conflict, match="already rejected by expiry"):
        await runtime.approve(head.run_id, "approve", "before:engineer")
    assert fold(await store.read_facts(head.run_id)).status.value == "rejected"


@pytest.mark.parametrize(
    ("step", "field", "said"),
    [
        ({"specialist": "engineer", "expires_after_seconds": 5}, "expires_after_seconds", "no gate"),
        ({"specialist": "engineer", "approvers": ["alice"]}, "approvers", "no gate"),
        ({"specialist": "engineer", "approve_after": True, "on_expiry": "fail"}, "on_expiry", "needs"),
    ],
)
def test_gate_settings_are_checked_at_load(step: dict[str, object], field: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as caught:
        Catalog.builtin().extended({"chains": {"bad": {"steps": [step]}}}, "bad-test", Path("."))
    assert field in str(caught.value)


def test_bad_on_expiry_and_empty_approvers_are_refused_at_load() -> None:
    for step in (
        {"specialist": "engineer", "approve_after": True, "expires_after_seconds": 5, "on_expiry": "maybe"},
        {"specialist": "engineer", "approve_after": True, "approvers": []},
    ):
        with pytest.raises(ConfigError):
            Catalog.builtin().extended({"chains": {"bad": {"steps": [step]}}}, "bad-test", Path("."))


PARALLEL = Catalog.builtin().extended(
    {
        "chains": {
            "fan-in": {
                "steps": [
                    {"specialist": "researcher", "name": "r1", "after": []},
                    {"specialist": "researcher", "name": "r2", "after": []},
                    {
                        "specialist": "writer",
                        "after": ["r1", "r2"],
                        "approve_before": True,
                        "approve_after": True,
                    },
                ]
            }
        }
    },
    "parallel-gates-test",
    Path("."),
)


async def _answer_all(runtime: Runtime, run_id: str) -> RunHead:
    """Answer every host task of a parallel run until it waits only at gates (or ends)."""
    while True:
        await runtime.drive(run_id)
        snap = await runtime.snapshot(run_id)
        if not snap.host_tasks:
            return snap.head
        for prompt in snap.host_tasks:
            await runtime.submit_host_output(run_id, prompt.task_id, f"the work of {prompt.task_id}")


async def test_revise_in_a_parallel_chain_reruns_the_gated_step_not_its_several_predecessors() -> None:
    runtime = make_runtime(catalog=PARALLEL)
    head, _ = await runtime.start(StartRequest("Research it", chain="fan-in"))
    head = await _answer_all(runtime, head.run_id)
    before = head.gate("before:writer")
    assert before is not None and before.status == "requested"
    with pytest.raises(InvalidArgument, match="runs after 2 steps"):
        await runtime.approve(head.run_id, "revise", "before:writer")
    await runtime.approve(head.run_id, "approve", "before:writer")
    head = await _answer_all(runtime, head.run_id)
    assert _requested(head) == "after:writer"
    head = await runtime.approve(head.run_id, "revise", "after:writer", "shorter")
    head = await _answer_all(runtime, head.run_id)
    assert [t.task_id for t in head.tasks] == ["r1", "r2", "writer", "writer~2"]
    # writer~2 asks its own gates again, and the run ends once they are approved.
    assert _requested(head) == "before:writer~2"
    await runtime.approve(head.run_id, "approve", "before:writer~2")
    head = await _answer_all(runtime, head.run_id)
    await runtime.approve(head.run_id, "approve", "after:writer~2")
    await runtime.drive(head.run_id)
    assert (await runtime.status(head.run_id)).status.value == "completed"


async def test_a_gate_of_a_parallel_branch_expires_while_the_other_branch_works() -> None:
    catalog = Catalog.builtin().extended(
        {
            "chains": {
                "two-branches": {
                    "steps": [
                        {"specialist": "researcher", "name": "r1", "after": []},
                        {
                            "specialist": "researcher",
                            "name": "r2",
                            "after": [],
                            "approve_before": True,
                            "expires_after_seconds": 10,
                            "on_expiry": "fail",
                        },
                    ]
                }
            }
        },
        "parallel-expiry-test",
        Path("."),
    )
    clock = ManualClock()
    runtime = make_runtime(clock=clock, catalog=catalog)
    head, _ = await runtime.start(StartRequest("Research it", chain="two-branches"))
    await runtime.drive(head.run_id)
    head = await runtime.status(head.run_id)
    assert head.task("r1").status.value == "awaiting_host" and _requested(head) == "before:r2"
    clock.advance(10)
    await runtime.drive(head.run_id)
    head = await runtime.status(head.run_id)
    assert head.status.value == "failed" and head.error is not None
    assert head.error.code == "approval_expired" and "before:r2" in head.error.message
    assert head.task("r1").status.value == "cancelled"
    gate = head.gate("before:r2")
    assert gate is not None and (gate.status, gate.channel) == ("failed", "expiry")

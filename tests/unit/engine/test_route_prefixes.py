"""The one rule (DESIGN §1) over routed and looping runs: for every prefix of the fact log that ends
at a durable write, ``next_action`` on the fold of the prefix equals the action the uninterrupted
run took there — so a run restarted after any write routes exactly as the crashed one would have.
(Linear runs: ``test_crash_prefixes.py``, whose store this reuses.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import pytest

from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.decide import Action, ExpireGate, FailTask, RouteTask, StartAttempt, next_action
from orchestration.core.facts import AttemptStarted
from orchestration.core.fold import fold
from orchestration.core.models import RunHead, TypedError
from tests.unit.engine.test_crash_prefixes import BoundaryStore, record_decisions
from tests.unit.helpers import Decision, make_runtime, play
from tests.unit.routed import ROUTED_CATALOG, InstanceWorker, answer_for

RATE_LIMITED = TypedError(code="rate_limited", message="slow down", retryable=True, http_status=429)
REVISE_THRICE = {"reviewer": "revise", "reviewer~2": "revise", "reviewer~3": "revise"}


@dataclass(frozen=True)
class Scenario:
    request: StartRequest
    verdicts: dict[str, str]
    decisions: Callable[[str], Decision] = lambda gate: "approve"
    errors: dict[str, list[TypedError]] = field(default_factory=dict)
    #: the run's routes, in order: (routing task, what was applied)
    routes: tuple[tuple[str, str], ...] = ()


SCENARIOS: dict[str, Scenario] = {
    "inline review-loop: revise, revise, approve": Scenario(
        StartRequest("Build it", chain="review-loop"),
        {"reviewer": "revise", "reviewer~2": "revise", "reviewer~3": "approve"},
        routes=(("reviewer", "engineer"), ("reviewer~2", "engineer"), ("reviewer~3", "end")),
    ),
    "inline review-loop: exhausted, the human accepts": Scenario(
        StartRequest("Build it", chain="review-loop"),
        REVISE_THRICE,
        routes=(("reviewer", "engineer"), ("reviewer~2", "engineer"), ("reviewer~3", "ask")),
    ),
    "inline review-loop: exhausted, the human rejects": Scenario(
        StartRequest("Build it", chain="review-loop"),
        REVISE_THRICE,
        decisions=lambda gate: "reject",
        routes=(("reviewer", "engineer"), ("reviewer~2", "engineer"), ("reviewer~3", "ask")),
    ),
    "inline exhausted with on_exhausted fail": Scenario(
        StartRequest("Build it", chain="loop-fail"),
        REVISE_THRICE,
        routes=(("reviewer", "engineer"), ("reviewer~2", "engineer"), ("reviewer~3", "fail")),
    ),
    "inline exhausted with on_exhausted end": Scenario(
        StartRequest("Build it", chain="loop-end"),
        REVISE_THRICE,
        routes=(("reviewer", "engineer"), ("reviewer~2", "engineer"), ("reviewer~3", "end")),
    ),
    "inline exhausted with on_exhausted a later step": Scenario(
        StartRequest("Build it", chain="loop-step"),
        REVISE_THRICE,
        routes=(("reviewer", "engineer"), ("reviewer~2", "engineer"), ("reviewer~3", "writer")),
    ),
    "inline gated loop": Scenario(
        StartRequest("Build it", chain="loop-gated"),
        {"reviewer": "revise", "reviewer~2": "approve"},
        routes=(("reviewer", "engineer"), ("reviewer~2", "end")),
    ),
    "inline forward jump": Scenario(
        StartRequest("Build it", chain="jump"), {"reviewer": "approve"}, routes=(("reviewer", "writer"),)
    ),
    "provider review-loop with retries: revise, approve": Scenario(
        StartRequest("Build it", chain="review-loop", worker_backend="provider"),
        {"reviewer": "revise", "reviewer~2": "approve"},
        errors={"reviewer~2": [RATE_LIMITED], "engineer~2": [RATE_LIMITED, RATE_LIMITED]},
        routes=(("reviewer", "engineer"), ("reviewer~2", "end")),
    ),
    # A gate's revise re-runs the work it shows (after: the gated step; before: the step before
    # it, then the gated one again), as a loop does.
    "inline revise at an after gate and a before gate": Scenario(
        StartRequest("Build it", chain="gated-revise"),
        {},
        decisions=lambda gate: "revise" if gate in ("after:engineer", "before:tester") else "approve",
    ),
    "provider revise at an after gate and a before gate": Scenario(
        StartRequest("Build it", chain="gated-revise", worker_backend="provider"),
        {},
        decisions=lambda gate: "revise" if gate in ("after:engineer", "before:tester") else "approve",
        errors={"engineer~2": [RATE_LIMITED]},
    ),
    # Nobody decides: the gate expires, and its on_expiry decides.
    **{
        f"{backend} gate expiry with on_expiry {on_expiry}": Scenario(
            StartRequest("Build it", chain=f"expiring-{on_expiry}", worker_backend=backend),
            {},
            decisions=lambda gate: "wait",
        )
        for on_expiry in ("approve", "reject", "fail")
        for backend in ("inline", "provider")
    },
    "provider review-loop: reject": Scenario(
        StartRequest("Build it", chain="review-loop", worker_backend="provider"),
        {"reviewer": "reject"},
        routes=(("reviewer", "fail"),),
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_every_prefix_of_a_routed_run_decides_as_the_uninterrupted_run(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = SCENARIOS[name]
    decided: dict[int, tuple[datetime, Action]] = {}
    heads: dict[int, RunHead] = {}

    def recording_next_action(head: RunHead, now: datetime) -> Action:
        action = next_action(head, now)
        previous = decided.get(head.last_seq)
        if previous is not None and previous[0] == now:
            # (A gate's expiry makes the same head decide differently later: time is an input.)
            assert previous[1] == action
        decided[head.last_seq] = (now, action)
        heads[head.last_seq] = head
        return action

    record_decisions(monkeypatch, recording_next_action)
    store = BoundaryStore()
    worker = InstanceWorker(scenario.verdicts, scenario.errors)
    runtime = make_runtime(store, worker, ManualClock(), ROUTED_CATALOG)  # type: ignore[arg-type]
    head, _ = await runtime.start(scenario.request)
    final = await play(
        runtime, head.run_id, decisions=scenario.decisions, output=answer_for(scenario.verdicts)
    )
    facts = await store.read_facts(head.run_id)
    assert final.status.is_terminal
    assert store.boundaries[-1] == len(facts) and len(store.boundaries) == final.version
    routes = [(a.plan.task_id, a.plan.applied) for _, a in decided.values() if isinstance(a, RouteTask)]
    assert tuple(routes) == scenario.routes
    if scenario.request.chain == "gated-revise":
        assert [t.task_id for t in final.tasks] == [
            "architect",
            "engineer",
            "engineer~2",
            "tester",
            "engineer~3",
            "tester~2",
        ]
        assert [t.status.value for t in final.tasks] == ["done"] * 3 + ["skipped"] + ["done"] * 2
        assert final.status.value == "completed" and final.format == 3
    if str(scenario.request.chain).startswith("expiring-"):
        expired = [a for _, a in decided.values() if isinstance(a, ExpireGate)]
        assert expired == [ExpireGate("after:engineer", expired[0].decision)]
        gate = final.gate("after:engineer")
        assert gate is not None and (gate.channel, gate.approver, gate.verified) == ("expiry", None, False)
        expected = {"approve": "completed", "reject": "rejected", "fail": "failed"}[expired[0].decision]
        assert final.status.value == expected
        if expected == "failed":
            assert final.error is not None and final.error.code == "approval_expired"

    for prefix_len in sorted({*store.boundaries, *decided}):
        folded = fold(facts[:prefix_len])
        last = facts[prefix_len - 1]
        if isinstance(last, AttemptStarted) and prefix_len not in decided:
            action = next_action(folded, ManualClock().now())
            if last.attempt < folded.contract.max_attempts:
                assert action == StartAttempt(last.task_id, last.attempt + 1, possible_duplicate_call=True)
            else:
                assert isinstance(action, FailTask) and action.error.code == "attempts_exhausted"
            continue
        assert prefix_len in decided, f"no decision was made after write ending at fact {prefix_len}"
        now, action = decided[prefix_len]
        stored = heads[prefix_len]
        assert folded.model_dump(exclude={"version"}) == stored.model_dump(exclude={"version"})
        assert next_action(folded, now) == action, f"prefix {prefix_len} of {name}"

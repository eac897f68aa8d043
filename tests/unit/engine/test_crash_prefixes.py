"""The one rule (DESIGN §1): a restarted run makes the same next decision the crashed run would
have made. For full runs of several shapes, every prefix of the fact log that ends at a durable
write is folded back into a head, and ``next_action`` on it must equal the action the uninterrupted
run took at that point."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

import pytest

import orchestration.engine.drive as drive_module
import orchestration.engine.host_writes as host_answers_module
from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.budget import refusal
from orchestration.core.clock import ManualClock
from orchestration.core.costs import Budget, BudgetLimits
from orchestration.core.decide import Action, FailTask, RequestBudget, StartAttempt, next_action, next_actions
from orchestration.core.facts import AttemptStarted, Fact
from orchestration.core.fold import fold
from orchestration.core.models import RunHead, TypedError
from orchestration.store import CreateResult, Lease
from stores.memory import MemoryStore
from tests.unit.helpers import Decision, ScriptedWorker, make_runtime, play

RATE_LIMITED = TypedError(code="rate_limited", message="slow down", retryable=True, http_status=429)
AUTH = TypedError(code="auth", message="bad key", retryable=False, http_status=401)

GATED_CATALOG = Catalog.builtin().extended(
    {
        "chains": {
            "gated": {
                "steps": [
                    {"specialist": "researcher", "approve_after": True},
                    "architect",
                    {"specialist": "engineer", "approve_before": True},
                    {"specialist": "tester", "on_failure": "continue"},
                    {"specialist": "reviewer", "approve_before": True, "approve_after": True},
                ]
            }
        }
    },
    "test",
    __import__("pathlib").Path("."),
)

Scenario = tuple[StartRequest, dict[str, list[str | TypedError]], Callable[[str], Decision]]

SCENARIOS: dict[str, Scenario] = {
    "inline default, gate before engineer": (
        StartRequest("Build a CLI", approve_before=("engineer",)),
        {},
        lambda gate: "approve",
    ),
    "inline gated chain, all approved": (StartRequest("Build it", chain="gated"), {}, lambda gate: "approve"),
    "inline gated chain, rejected at engineer": (
        StartRequest("Build it", chain="gated"),
        {},
        lambda gate: "reject" if gate == "before:engineer" else "approve",
    ),
    "inline custom list with repeats": (
        StartRequest("Write docs", chain=("writer", "reviewer", "writer"), approve_before=("writer-2",)),
        {},
        lambda gate: "approve",
    ),
    "provider with retries and a tolerated failure": (
        StartRequest("Build it", chain="gated", worker_backend="provider"),
        {"architect": [RATE_LIMITED, "ok"], "tester": [AUTH], "engineer": [RATE_LIMITED, RATE_LIMITED, "ok"]},
        lambda gate: "approve",
    ),
    # ScriptedWorker's calls spend 7 tokens each and reserve FAKE_MAX_TOKENS (10): the third call
    # of three would need 14 + 10 > 20.
    "provider with a budget that fails the run": (
        StartRequest(
            "Build it",
            chain=("architect", "engineer", "reviewer"),
            worker_backend="provider",
            budget=Budget(max_total_tokens=20),
        ),
        {},
        lambda gate: "approve",
    ),
    "provider with a budget that asks, approved twice": (
        StartRequest(
            "Build it",
            chain=("architect", "engineer", "reviewer", "writer", "tester", "researcher"),
            worker_backend="provider",
            budget=Budget(max_total_tokens=20, on_budget="ask"),
        ),
        {"engineer": [RATE_LIMITED, "ok"]},
        lambda gate: "approve",
    ),
    "provider with a step budget that asks, rejected": (
        StartRequest(
            "Build it",
            chain="gated",
            worker_backend="provider",
            budget=Budget(on_budget="ask", steps={"engineer": BudgetLimits(max_total_tokens=5)}),
        ),
        {},
        lambda gate: "reject" if gate.startswith("budget:") else "approve",
    ),
    "provider with a required failure": (
        StartRequest("Build it", chain=("architect", "engineer"), worker_backend="provider"),
        {"engineer": [RATE_LIMITED, RATE_LIMITED, RATE_LIMITED]},
        lambda gate: "approve",
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_every_prefix_decides_as_the_uninterrupted_run(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    request, script, decisions = SCENARIOS[name]
    decided: dict[int, tuple[datetime, Action]] = {}
    heads: dict[int, RunHead] = {}

    def recording_next_action(head: RunHead, now: datetime) -> Action:
        action = next_action(head, now)
        previous = decided.get(head.last_seq)
        if previous is not None:
            # Deciding twice on the same record (a drive after a pause) must agree with itself.
            assert previous[1] == action
        decided[head.last_seq] = (now, action)
        heads[head.last_seq] = head
        return action

    record_decisions(monkeypatch, recording_next_action)
    store = BoundaryStore()
    runtime = make_runtime(store, ScriptedWorker(script), ManualClock(), GATED_CATALOG)
    head, _ = await runtime.start(request)
    final = await play(runtime, head.run_id, decisions=decisions)
    facts = await store.read_facts(head.run_id)
    assert final.status.is_terminal
    assert store.boundaries[-1] == len(facts) and len(store.boundaries) == final.version

    # Every boundary, and every prefix decided on inside a write (a host's answer records what
    # follows from it in its own write: orchestration.engine.host_writes).
    for prefix_len in sorted({*store.boundaries, *decided}):
        folded = fold(facts[:prefix_len])
        last = facts[prefix_len - 1]
        if isinstance(last, AttemptStarted) and prefix_len not in decided:
            # The uninterrupted run called the provider here (no decision). A run restarted at this
            # point finds an orphaned attempt and retries it, marked as a possible duplicate call.
            # With the attempt budget spent, the task fails with attempts_exhausted instead.
            action = next_action(folded, ManualClock().now())
            if refusal(folded, folded.task(last.task_id)) is not None:
                # The orphan may have spent its most (it is charged so when the next attempt
                # starts): the budget may not allow the retry.
                assert isinstance(action, (FailTask, RequestBudget)), action
            elif last.attempt < folded.contract.max_attempts:
                assert action == StartAttempt(last.task_id, last.attempt + 1, possible_duplicate_call=True)
            else:
                assert isinstance(action, FailTask) and action.error.code == "attempts_exhausted"
            continue
        assert prefix_len in decided, f"no decision was made after write ending at fact {prefix_len}"
        now, action = decided[prefix_len]
        # The fold of the prefix is the head the store held (version aside: fold counts facts).
        stored = heads[prefix_len]
        assert folded.model_dump(exclude={"version"}) == stored.model_dump(exclude={"version"})
        assert next_action(folded, now) == action, f"prefix {prefix_len} of {name}"


def record_decisions(
    monkeypatch: pytest.MonkeyPatch, recorder: Callable[[RunHead, datetime], Action]
) -> None:
    """Have ``recorder`` see every decision the run makes: the drive's (``next_action``) and those a
    host's answer makes to record what follows from it in the same write (the first of
    ``next_actions``, which is ``next_action``)."""

    def recording_next_actions(head: RunHead, now: datetime) -> tuple[Action, ...]:
        actions = next_actions(head, now)
        assert recorder(head, now) == actions[0]
        return actions

    monkeypatch.setattr(drive_module, "next_action", recorder)
    monkeypatch.setattr(host_answers_module, "next_actions", recording_next_actions)


class BoundaryStore(MemoryStore):
    """Remembers the length of the fact log after each durable write."""

    def __init__(self) -> None:
        super().__init__()
        self.boundaries: list[int] = []

    async def create(
        self, head: RunHead, facts: Sequence[Fact], *, flushing: Callable[[], None] | None = None
    ) -> CreateResult:
        result = await super().create(head, facts, flushing=flushing)
        self.boundaries.append(head.last_seq)
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
        self.boundaries.append(head.last_seq)
        return stored


async def test_scenarios_cover_every_kind_of_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefix check above is only as strong as the decisions it sees: together, the scenarios
    must exercise every action ``next_action`` can return."""
    seen: set[str] = set()

    def recording(head: RunHead, now: datetime) -> Action:
        action = next_action(head, now)
        seen.add(type(action).__name__)
        return action

    record_decisions(monkeypatch, recording)
    for request, script, decisions in SCENARIOS.values():
        runtime = make_runtime(MemoryStore(), ScriptedWorker(script), ManualClock(), GATED_CATALOG)
        head, _ = await runtime.start(request)
        await play(runtime, head.run_id, decisions=decisions)
    expected = {
        "RequestApproval",
        "AwaitApproval",
        "PrepareHostTask",
        "AwaitHost",
        "StartAttempt",
        "FailTask",
        "RequestBudget",
        "FinishRun",
        "Idle",
    }
    assert expected <= seen, expected - seen

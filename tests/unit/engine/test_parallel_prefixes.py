"""The one rule (DESIGN §1) over parallel runs (fan-out, fan-in): for every prefix of the fact log
that ends at a durable write, ``next_actions`` on the fold of the prefix equals what the
uninterrupted run decided there; the write that followed a decision is one of its actions; every
attempt in flight at a prefix is, to a restarted run, an orphan to retry (marked); and a run with
anything left for the server to do is active, so a dispatcher picks it up after a crash.
(Linear runs: ``test_crash_prefixes.py``; routed ones: ``test_route_prefixes.py``.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import pytest

import orchestration.engine.fanout as fanout_module
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.costs import Budget
from orchestration.core.decide import (
    PAUSING_ACTIONS,
    Action,
    FailTask,
    FinishRun,
    PrepareHostTask,
    RequestApproval,
    RequestBudget,
    RouteTask,
    StartAttempt,
    WaitUntil,
    next_actions,
)
from orchestration.core.facts import (
    ApprovalRequested,
    AttemptStarted,
    Fact,
    HostTaskPrepared,
    RouteDecided,
    RunFinished,
    TaskCompleted,
    TaskFailed,
    route_decided,
)
from orchestration.core.fold import fold
from orchestration.core.models import RunHead, TypedError
from orchestration.core.vocabulary import TaskStatus
from tests.unit.engine.test_crash_prefixes import BoundaryStore
from tests.unit.helpers import Decision, ScriptedWorker, make_runtime
from tests.unit.parallel import PARALLEL_CATALOG, play_parallel
from tests.unit.routed import InstanceWorker, answer_for

RATE_LIMITED = TypedError(code="rate_limited", message="slow down", retryable=True, http_status=429)
AUTH = TypedError(code="auth", message="bad key", retryable=False, http_status=401)


@dataclass(frozen=True)
class Scenario:
    request: StartRequest
    script: dict[str, list[str | TypedError]] = field(default_factory=dict)
    decisions: Callable[[str], Decision] = lambda gate: "approve"
    status: str = "completed"
    #: routed runs: the verdict of each routing task instance (answered by instance)
    verdicts: dict[str, str] | None = None
    #: routed runs: the task instances the run ends with, in run order
    tasks: tuple[str, ...] | None = None
    #: the most actions one decision names (2: branches were ready together)
    most_actions: int = 2


SCENARIOS: dict[str, Scenario] = {
    "inline research: three host tasks at once, answered last first": Scenario(
        StartRequest("Study it", chain="research")
    ),
    "inline fan-out with gates on branches and the join": Scenario(
        StartRequest("Study it", chain="fan-gated")
    ),
    "inline fan-out, a branch's gate rejected": Scenario(
        StartRequest("Study it", chain="fan-gated"),
        decisions=lambda gate: "reject" if gate == "before:b" else "approve",
        status="rejected",
    ),
    "inline diamond": Scenario(StartRequest("Build it", chain="diamond")),
    "provider research with retries": Scenario(
        StartRequest("Study it", chain="research", worker_backend="provider"),
        {"research-practice": [RATE_LIMITED, "ok"], "research-critique": [RATE_LIMITED, RATE_LIMITED, "ok"]},
    ),
    "provider fan-out, a branch fails, on_failure continue": Scenario(
        StartRequest("Study it", chain="fan-continue", worker_backend="provider"),
        {"a": [AUTH]},
        status="completed_with_failures",
    ),
    "provider fan-out, a required branch fails": Scenario(
        StartRequest("Study it", chain="fan-continue", worker_backend="provider"),
        {"b": [AUTH]},
        status="failed",
    ),
    "provider diamond, two at a time": Scenario(
        StartRequest("Build it", chain="diamond", worker_backend="provider")
    ),
    "provider fan-out with max_parallel 2": Scenario(
        StartRequest("Study it", chain="fan-two", worker_backend="provider")
    ),
    # Each call reserves 10 tokens and spends 7 (tests.unit.helpers): two branches in flight at
    # most, and the writer (21 + 10 > 25) waits at a budget gate, approved.
    "provider fan-out within a budget that asks": Scenario(
        StartRequest(
            "Study it",
            chain="fan-continue",
            worker_backend="provider",
            budget=Budget(max_total_tokens=25, on_budget="ask"),
        )
    ),
    "provider fan-out with gates": Scenario(
        StartRequest("Study it", chain="fan-gated", worker_backend="provider")
    ),
    "inline diamond looping back to one branch: revise, approve": Scenario(
        StartRequest("Build it", chain="diamond-loop"),
        verdicts={"reviewer": "revise", "reviewer~2": "approve"},
        tasks=("architect", "front", "back", "reviewer", "front~2", "reviewer~2"),
    ),
    "provider diamond loop exhausted, the human accepts": Scenario(
        StartRequest("Build it", chain="diamond-loop", worker_backend="provider"),
        verdicts={"reviewer": "revise", "reviewer~2": "revise", "reviewer~3": "revise"},
        tasks=("architect", "front", "back", "reviewer", "front~2", "reviewer~2", "front~3", "reviewer~3"),
    ),
    "provider graph: revise, then a jump over two parallel steps": Scenario(
        StartRequest("Build it", chain="graph-jump", worker_backend="provider"),
        verdicts={"reviewer": "revise", "reviewer~2": "approve"},
        tasks=("engineer", "reviewer", "engineer~2", "reviewer~2", "tester", "docs", "writer"),
        most_actions=1,  # the route jumps over the two steps that would have run at once
    ),
    "inline graph: reject": Scenario(
        StartRequest("Build it", chain="graph-jump"),
        verdicts={"reviewer": "reject"},
        status="failed",
        tasks=("engineer", "reviewer", "tester", "docs", "writer"),
        most_actions=1,
    ),
}


def _matches(fact: Fact, action: Action) -> bool:
    """Whether ``fact`` is what acting on ``action`` records."""
    if isinstance(fact, AttemptStarted):
        return action == StartAttempt(fact.task_id, fact.attempt, fact.possible_duplicate_call)
    if isinstance(fact, HostTaskPrepared):
        return action == PrepareHostTask(fact.task_id, fact.attempt)
    if isinstance(fact, ApprovalRequested) and fact.budget is not None:
        return action == RequestBudget(fact.budget.task_id, fact.gate_id, fact.budget)
    if isinstance(fact, ApprovalRequested):
        return action == RequestApproval(fact.gate_id)
    if isinstance(fact, TaskFailed):
        return action == FailTask(fact.task_id, fact.error)
    if isinstance(fact, RunFinished):
        return isinstance(action, FinishRun) and action.status == fact.status
    if isinstance(fact, RouteDecided):
        return isinstance(action, RouteTask) and route_decided(action.plan, fact.seq, fact.at) == fact
    return False


DECISION_FACTS = (AttemptStarted, HostTaskPrepared, ApprovalRequested, TaskFailed, RunFinished, RouteDecided)


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_every_prefix_of_a_parallel_run_decides_as_the_uninterrupted_run(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = SCENARIOS[name]
    decided: dict[int, tuple[datetime, tuple[Action, ...]]] = {}
    heads: dict[int, RunHead] = {}
    most_actions = 0

    def recording(head: RunHead, now: datetime) -> tuple[Action, ...]:
        nonlocal most_actions
        actions = next_actions(head, now)
        previous = decided.get(head.last_seq)
        if previous is not None:
            # Deciding twice on the same record must agree with itself.
            assert previous[1] == actions
        decided[head.last_seq] = (now, actions)
        heads[head.last_seq] = head
        most_actions = max(most_actions, len(actions))
        return actions

    monkeypatch.setattr(fanout_module, "next_actions", recording)
    store = BoundaryStore()
    verdicts = scenario.verdicts
    worker = ScriptedWorker(scenario.script) if verdicts is None else InstanceWorker(verdicts)
    runtime = make_runtime(store, worker, ManualClock(), PARALLEL_CATALOG)  # type: ignore[arg-type]
    head, _ = await runtime.start(scenario.request)
    if verdicts is None:
        await play_parallel(runtime, head.run_id, decisions=scenario.decisions)
    else:
        await play_parallel(runtime, head.run_id, decisions=scenario.decisions, output=answer_for(verdicts))
    final = await runtime.status(head.run_id)
    facts = await store.read_facts(head.run_id)
    assert final.status.value == scenario.status
    if scenario.tasks is not None:
        assert tuple(t.task_id for t in final.tasks) == scenario.tasks
    assert store.boundaries[-1] == len(facts) and len(store.boundaries) == final.version
    # The branches were ready together: some decision named several of them at once.
    assert most_actions >= scenario.most_actions
    # Each task's output is recorded once.
    completed = [f.task_id for f in facts if isinstance(f, TaskCompleted)]
    assert len(completed) == len(set(completed))

    for i, prefix_len in enumerate(store.boundaries):
        folded = fold(facts[:prefix_len])
        now = decided[prefix_len][0] if prefix_len in decided else ManualClock().now()
        actions = next_actions(folded, now)
        if prefix_len in decided:
            stored = heads[prefix_len]
            assert folded.model_dump(exclude={"version"}) == stored.model_dump(exclude={"version"})
            assert actions == decided[prefix_len][1], f"prefix {prefix_len} of {name}"
        if i + 1 < len(store.boundaries):
            following = facts[prefix_len]
            if isinstance(following, DECISION_FACTS) and prefix_len in decided:
                assert any(_matches(following, a) for a in actions), (prefix_len, following, actions)
        if folded.status.is_terminal:
            continue
        # A restarted run retries every attempt that was in flight, marked as a possible duplicate
        # (unless the budget, which counts the orphan at its most, does not allow the retry).
        failing = any(isinstance(a, FinishRun) for a in actions)
        for task in folded.tasks:
            if task.status == TaskStatus.RUNNING and not failing:
                made = len(task.attempts)
                assert StartAttempt(task.task_id, made + 1, possible_duplicate_call=True) in actions or any(
                    isinstance(a, (FailTask, RequestBudget)) and a.task_id == task.task_id for a in actions
                )
        # Anything left for the server to do keeps the run active (a dispatcher picks it up).
        work = [a for a in actions if not isinstance(a, PAUSING_ACTIONS) or isinstance(a, WaitUntil)]
        assert (folded.status.kind == "active") == bool(work), (prefix_len, folded.status, actions)

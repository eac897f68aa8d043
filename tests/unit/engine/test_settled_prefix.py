"""The settled prefix a linear decision skips (orchestration.core.settled_prefix) never changes a
decision: over every head of the crash-matrix and routed scenarios (every prefix of their fact
logs, folded fresh and folded incrementally, decided in order, in reverse and shuffled, at several
times), ``next_action`` equals the walk over every task; and a kept answer whose tasks were replaced
is not reused."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

import orchestration.core.decide as decide_module
import orchestration.core.settled_prefix as prefix_module
from orchestration.core.budget import BUDGET_EXHAUSTED
from orchestration.core.clock import ManualClock
from orchestration.core.decide import Action, FinishRun, next_action
from orchestration.core.facts import Fact
from orchestration.core.fold import apply, fold
from orchestration.core.models import RunHead, TypedError
from orchestration.core.vocabulary import TaskStatus
from tests.unit.engine import test_crash_prefixes as crash
from tests.unit.engine import test_route_prefixes as routed
from tests.unit.helpers import ScriptedWorker, make_runtime, play
from tests.unit.routed import ROUTED_CATALOG, InstanceWorker, answer_for


def reference(head: RunHead, now: datetime, monkeypatch: pytest.MonkeyPatch) -> Action:
    """``next_action`` walking every task (the decision as it was before the prefix was kept)."""
    with monkeypatch.context() as patch:
        patch.setattr(decide_module, "passed_prefix", lambda head: (0, False))
        return next_action(head, now)


async def crash_logs() -> Iterator[tuple[str, list[Fact]]]:
    logs = []
    for name, (request, script, decisions) in crash.SCENARIOS.items():
        store = crash.BoundaryStore()
        runtime = make_runtime(store, ScriptedWorker(script), ManualClock(), crash.GATED_CATALOG)
        head, _ = await runtime.start(request)
        await play(runtime, head.run_id, decisions=decisions)
        logs.append((name, await store.read_facts(head.run_id)))
    for name, scenario in routed.SCENARIOS.items():
        store = crash.BoundaryStore()
        worker = InstanceWorker(scenario.verdicts, scenario.errors)
        runtime = make_runtime(store, worker, ManualClock(), ROUTED_CATALOG)  # type: ignore[arg-type]
        head, _ = await runtime.start(scenario.request)
        await play(runtime, head.run_id, decisions=scenario.decisions, output=answer_for(scenario.verdicts))
        logs.append((name, await store.read_facts(head.run_id)))
    return iter(logs)


def incremental_heads(facts: list[Fact]) -> list[RunHead]:
    """Every head of the log, each folded from the one before (sharing its unchanged tasks, as
    a drive's heads do)."""
    heads: list[RunHead] = []
    head: RunHead | None = None
    for fact in facts:
        head = apply(head, fact)
        heads.append(head)
    return heads


def times(head: RunHead) -> list[datetime]:
    base = ManualClock().now()
    return [base, head.updated_at, base + timedelta(hours=2), base + timedelta(days=30)]


async def test_every_head_decides_as_the_walk_over_every_task(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(11)
    checked = 0
    kinds: set[str] = set()
    for name, facts in await crash_logs():
        prefix_module.forget_all()
        heads = incremental_heads(facts)
        fresh = [fold(facts[:n]) for n in range(1, len(facts) + 1)]
        shuffled = heads[:]
        rng.shuffle(shuffled)
        orders: list[list[RunHead]] = [heads, heads[::-1], shuffled, fresh, heads]
        for order in orders:
            for head in order:
                for now in times(head):
                    expected = reference(head, now, monkeypatch)
                    assert next_action(head, now) == expected, (name, head.last_seq, now)
                    kinds.add(type(expected).__name__)
                    checked += 1
    assert checked > 1000
    assert {"StartAttempt", "FailTask", "FinishRun", "RouteTask", "RequestApproval", "ExpireGate"} <= kinds


async def test_a_kept_prefix_whose_tasks_changed_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head of the same run and chain whose first tasks are other objects (here: a done task
    made failed, which fails the run) is walked again from the start."""
    _, facts = next(iter(await crash_logs()))
    prefix_module.forget_all()
    heads = incremental_heads(facts)
    head = next(
        h
        for h in reversed(heads)
        if not h.status.is_terminal and sum(t.status == TaskStatus.DONE for t in h.tasks) >= 2
    )
    now = ManualClock().now()
    first = next_action(head, now)
    kept, _ = prefix_module.passed_prefix(head)
    assert kept >= 1
    failed = head.tasks[0].model_copy(
        update={"status": TaskStatus.FAILED, "error": TypedError(code="boom", message="boom")}
    )
    changed = head.model_copy(update={"tasks": (failed, *head.tasks[1:])})
    assert changed.chain is head.chain and changed.run_id == head.run_id
    assert next_action(changed, now) == FinishRun("failed", failed.error)
    assert next_action(changed, now) == reference(changed, now, monkeypatch)
    assert next_action(head, now) == first


async def test_the_kept_answers_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefix_module, "LIMIT", 3)
    prefix_module.forget_all()
    _, facts = next(iter(await crash_logs()))
    head = incremental_heads(facts)[-1]
    for i in range(10):
        prefix_module.passed_prefix(head.model_copy(update={"run_id": f"run-{i}"}))
        assert 1 <= len(prefix_module._last) <= 3


async def test_a_task_the_budget_failed_fails_the_run_whatever_its_step_tolerates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logs = dict(await crash_logs())
    heads = incremental_heads(logs["provider with retries and a tolerated failure"])
    tolerated = [
        h for h in heads if not h.status.is_terminal and h.task("tester").status == TaskStatus.FAILED
    ]
    assert tolerated
    now = ManualClock().now()
    for head in tolerated:
        index = [t.task_id for t in head.tasks].index("tester")
        task = head.tasks[index]
        refused = task.model_copy(update={"error": TypedError(code=BUDGET_EXHAUSTED, message="no budget")})
        # No gates: the tasks before the tester are passed, the tester is where the walk stops.
        steps = tuple(s.model_copy(update={"approve_after": False}) for s in head.chain.steps)
        chain = head.chain.model_copy(update={"steps": steps})
        changed = head.model_copy(
            update={"chain": chain, "tasks": (*head.tasks[:index], refused, *head.tasks[index + 1 :])}
        )
        assert prefix_module.passed_prefix(changed)[0] == index
        assert next_action(head, now) == reference(head, now, monkeypatch)
        expected = FinishRun("failed", refused.error)
        assert next_action(changed, now) == reference(changed, now, monkeypatch) == expected

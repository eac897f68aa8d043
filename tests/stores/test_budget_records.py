"""Costs and budgets on every store: a run whose contract carries prices and a budget, whose head
keeps running totals, and whose budget gate is created by its request and raised by its approval,
reads back exactly (head and facts), at record format 4; a decided budget gate is not changed by
a repeated approval with another raise."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.costs import Budget, BudgetAsk, BudgetLimits, Costs, HostUsage
from orchestration.core.facts import (
    ApprovalDecided,
    ApprovalRequested,
    AttemptStarted,
    Fact,
    HostTaskPrepared,
    TaskCompleted,
)
from orchestration.core.fold import apply_write, fold
from orchestration.core.models import RECORD_FORMAT, ExecutionContract, RunHead, Telemetry, text_hash
from orchestration.core.pricing import Price
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from orchestration.errors import Conflict
from orchestration.store import RunStore
from orchestration.workers.host import host_output_facts
from tests.stores.builders import new_run, run_id
from tests.unit.helpers import FAKE_MAX_TOKENS, ScriptedWorker, provider_contract, sequential_ids

COSTS = Costs(
    prices={"m": Price(input_per_mtok=3.0, output_per_mtok=15.0, source="default 2025-10-15")},
    max_tokens=100,
    budget=Budget(max_total_tokens=150, on_budget="ask", steps={"engineer": BudgetLimits(max_cost_usd=0.5)}),
)


async def _append(store: RunStore, head: RunHead, facts: list[Fact]) -> RunHead:
    new = apply_write(head, facts)
    return await store.append(head.run_id, head.version, facts, new)


async def test_costs_spend_and_budget_gates_read_back_exactly(store: RunStore) -> None:
    contract = ExecutionContract(worker_backend="provider", provider="fake", model="m", costs=COSTS)
    head, facts = new_run(run_id(1), contract=contract)
    created = (await store.create(head, facts)).head
    at = created.created_at
    out = "the design"
    done: list[Fact] = [
        AttemptStarted(seq=2, at=at, task_id="architect", attempt=1, executor="provider:fake:m"),
        TaskCompleted(
            seq=3,
            at=at + timedelta(seconds=1),
            task_id="architect",
            attempt=1,
            executor="provider:fake:m",
            output=out,
            output_sha256=text_hash(out),
            telemetry=Telemetry(input_tokens=40, output_tokens=20, latency_ms=5.0),
        ),
    ]
    head = await _append(store, created, done)
    assert head.spent is not None and head.spent.run.total_tokens == 60
    assert head.spent.run.cost_usd == (40 * 3.0 + 20 * 15.0) / 1_000_000
    ask = BudgetAsk(task_id="engineer", note="the run's budget allows 150 tokens: 60 spent ...")
    requested = ApprovalRequested(seq=4, at=at, format=4, gate_id="budget:1", budget=ask)
    head = await _append(store, head, [requested])
    decided = ApprovalDecided(
        seq=5, at=at, gate_id="budget:1", decision="approve", budget_raise=BudgetLimits(max_total_tokens=70)
    )
    head = await _append(store, head, [decided])
    assert head.format == 4 <= RECORD_FORMAT
    assert head.spent is not None and head.spent.raised.max_total_tokens == 70

    loaded = await store.load(run_id(1))
    assert loaded == head
    stored = await store.read_facts(run_id(1))
    assert stored == [*facts, *done, requested, decided]
    assert fold(stored).model_dump(exclude={"version"}) == loaded.model_dump(exclude={"version"})
    gate = loaded.gate("budget:1")
    assert gate is not None and gate.position == "budget" and gate.status == "approved"
    assert gate.note == ask.note and gate.task_id == "engineer"


async def test_reported_usage_reads_back_on_the_host_output_fact(store: RunStore) -> None:
    contract = ExecutionContract(worker_backend="inline", costs=Costs(budget=Budget(max_total_tokens=10_000)))
    head, facts = new_run(run_id(2), contract=contract)
    head = (await store.create(head, facts)).head
    prepared = HostTaskPrepared(
        seq=2,
        at=head.created_at,
        task_id="architect",
        attempt=1,
        executor="inline:host",
        prompt_sha256="0" * 64,
    )
    head = await _append(store, head, [prepared])
    usage = HostUsage(input_tokens=1234, output_tokens=567, cost_usd=0.0123)
    answer = host_output_facts(head, "architect", 1, "the design", head.created_at, None, usage)
    head = await _append(store, head, list(answer))
    loaded = await store.load(run_id(2))
    assert loaded == head and loaded.spent is not None
    assert (loaded.spent.run.input_tokens, loaded.spent.run.output_tokens) == (1234, 567)
    assert loaded.spent.run.cost_usd == 0.0123
    stored = await store.read_facts(run_id(2), after_seq=2)
    assert stored == answer and stored[0].type == "host_output_submitted" and stored[0].usage == usage


async def test_a_decided_budget_gate_takes_only_the_raise_it_recorded(store: RunStore) -> None:
    """Issue 22, finding 12: approving a decided budget gate again with another ``budget_raise``
    (or none) is a ``conflict``, not an OK that changes nothing; the same raise again is the
    idempotent repeat (nothing recorded), before and after the run went on."""
    runtime = Runtime(
        store,
        Catalog.builtin(),
        clock=ManualClock(),
        new_id=sequential_ids(),
        resolve_contract=provider_contract,
        worker=ScriptedWorker(),
        settings=RuntimeSettings(lease_ttl_seconds=30),
    )
    # Each scripted call spends 7 tokens and reserves FAKE_MAX_TOKENS (10): the third does not fit.
    budget = Budget(max_total_tokens=20, on_budget="ask")
    head, _ = await runtime.start(StartRequest("Build it", worker_backend="provider", budget=budget))
    await runtime.drive(head.run_id)
    assert (await store.load(head.run_id)).status == RunStatus.AWAITING_APPROVAL
    raised = BudgetLimits(max_total_tokens=10)
    approved = await runtime.approve(head.run_id, "approve", "budget:1", budget_raise=raised)
    for state in ("approved", "finished"):
        again = await runtime.approve(head.run_id, "approve", "budget:1", budget_raise=raised)
        assert again == await store.load(head.run_id) and again.last_seq == approved.last_seq
        for other in (BudgetLimits(max_total_tokens=20), BudgetLimits(max_cost_usd=1.0), None):
            with pytest.raises(Conflict) as info:
                await runtime.approve(head.run_id, "approve", "budget:1", budget_raise=other)
            assert info.value.code == "conflict", state
            assert 'already approved with budget_raise {"max_total_tokens":10}' in info.value.message
        assert await store.read_facts(head.run_id, approved.last_seq) == []
        await runtime.drive(head.run_id)
        approved = await store.load(head.run_id)
    assert approved.status == RunStatus.COMPLETED and FAKE_MAX_TOKENS == 10

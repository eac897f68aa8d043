"""Builders shared by the unit tests: a runtime on the memory store with a manual clock, a fake
provider worker, and a driver that plays the host and the approver."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from orchestration.chains.catalog import Catalog
from orchestration.chains.prompts import TaskPrompt
from orchestration.core import StartRequest
from orchestration.core.budget import with_costs
from orchestration.core.clock import ManualClock
from orchestration.core.decide import Action
from orchestration.core.models import (
    ChainSnapshot,
    ChainStep,
    ExecutionContract,
    RunHead,
    Telemetry,
    TypedError,
)
from orchestration.core.outcomes import AttemptFailedOutcome, AttemptOutcome, AttemptSucceeded
from orchestration.core.pricing import Price
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.agent_waits import awaited
from orchestration.engine.host_writes import RunMemory
from orchestration.engine.runtime import Runtime
from orchestration.workers.port import DeltaSink
from stores.memory import MemoryStore


def sequential_ids() -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"run-test-{next(counter):04d}"


@dataclass
class ScriptedWorker:
    """A provider worker that plays, per task, a list of outcomes ("ok" or a TypedError)."""

    script: dict[str, list[str | TypedError]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        n = self.calls.get(step.name, 0)
        self.calls[step.name] = n + 1
        plan = self.script.get(step.name, ["ok"])
        item = plan[min(n, len(plan) - 1)]
        if isinstance(item, TypedError):
            return AttemptFailedOutcome(item, Telemetry(http_status=item.http_status))
        return AttemptSucceeded(f"{step.name} output (attempt {attempt})", Telemetry(output_tokens=7))


#: the price of the scripted model ``fake-1`` (runs with a budget): $1 per 1000 output tokens
FAKE_PRICES = {"fake-1": Price(input_per_mtok=500.0, output_per_mtok=1000.0)}
#: the output limit of a scripted call (runs with a budget): what each call reserves
FAKE_MAX_TOKENS = 10


def _contract(request: StartRequest, _: ChainSnapshot) -> ExecutionContract:
    if request.worker_backend == "provider":
        return ExecutionContract(worker_backend="provider", provider="fake", model="fake-1", max_attempts=3)
    return ExecutionContract(worker_backend="inline")


def provider_contract(request: StartRequest, chain: ChainSnapshot) -> ExecutionContract:
    """The scripted contract; a start with a budget gets costs (:data:`FAKE_PRICES`,
    :data:`FAKE_MAX_TOKENS`), as :func:`orchestration.core.budget.with_costs` gives them."""
    if request.budget is None:
        return _contract(request, chain)
    return with_costs(_contract, prices=FAKE_PRICES, max_tokens=FAKE_MAX_TOKENS)(request, chain)


def make_runtime(
    store: MemoryStore | None = None,
    worker: ScriptedWorker | None = None,
    clock: ManualClock | None = None,
    catalog: Catalog | None = None,
    memory: RunMemory | None = None,
) -> Runtime:
    return Runtime(
        store or MemoryStore(),
        catalog or Catalog.builtin(),
        clock=clock or ManualClock(),
        new_id=sequential_ids(),
        resolve_contract=provider_contract,
        worker=worker or ScriptedWorker(),
        memory=memory,
        settings=RuntimeSettings(lease_ttl_seconds=30),
    )


#: what :func:`play` does at a gate: decide it, or ``wait`` (advance the manual clock to the gate's
#: expiry and let the run decide it by ``on_expiry``)
Decision = Literal["approve", "reject", "revise", "wait"]


async def play(
    runtime: Runtime,
    run_id: str,
    decisions: Callable[[str], Decision] = lambda gate: "approve",
    output: Callable[[str], str] = lambda task: f"host output for {task}",
    max_steps: int = 100,
    approver: str | None = None,
) -> RunHead:
    """Drive the run to its end, answering host tasks and gates like a host and an approver
    (``approver``: who the decisions name; ``"agent"`` for a chain the agent decides)."""
    for _ in range(max_steps):
        await runtime.drive(run_id)
        head = await runtime.status(run_id)
        if head.status.is_terminal:
            return head
        if head.status == RunStatus.AWAITING_AGENT:
            # What the dispatcher's follower does: follow each remote run to its end.
            for wait in awaited(head):
                await runtime.agent_waits.follow(run_id, wait)
        elif head.status == RunStatus.AWAITING_HOST:
            snap = await runtime.snapshot(run_id)
            assert snap.host_task is not None
            await runtime.submit_host_output(run_id, snap.host_task.task_id, output(snap.host_task.task_id))
        elif head.status == RunStatus.AWAITING_APPROVAL:
            gate = next(g for g in head.gates if g.status == "requested")
            decision = decisions(gate.gate_id)
            if decision == "wait":
                assert gate.expires_at is not None and isinstance(runtime.clock, ManualClock)
                runtime.clock.advance((gate.expires_at - runtime.clock.now()).total_seconds())
                continue
            await runtime.approve(run_id, decision, gate.gate_id, f"ok {gate.gate_id}", approver)
    raise AssertionError("run did not finish")


@dataclass
class DecisionLog:
    """What the uninterrupted run decided, keyed by the length of the fact log it decided on."""

    entries: list[tuple[int, datetime, Action]] = field(default_factory=list)


async def to_gate(runtime: Runtime, chain: str) -> RunHead:
    """Start an inline run of ``chain`` and answer its host tasks ("the work of <task>") until it
    waits at a gate."""
    head, _ = await runtime.start(StartRequest("Build it", chain=chain))
    while True:
        await runtime.drive(head.run_id)
        head = await runtime.status(head.run_id)
        if head.status == RunStatus.AWAITING_APPROVAL:
            return head
        snap = await runtime.snapshot(head.run_id)
        assert snap.host_task is not None, head.status
        task_id = snap.host_task.task_id
        await runtime.submit_host_output(head.run_id, task_id, f"the work of {task_id}")

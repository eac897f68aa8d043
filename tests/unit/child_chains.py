"""Chains with child runs shared by the child-run tests, and a runtime and a driver for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestration.chains.catalog import Catalog
from orchestration.core.clock import ManualClock
from orchestration.core.models import RunHead
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from orchestration.store import RunStore
from tests.unit.helpers import ScriptedWorker, provider_contract, sequential_ids

CHAINS: dict[str, Any] = {
    "inner": {"steps": ["engineer", "reviewer"]},
    "outer": {
        "steps": [
            "architect",
            {"name": "build", "chain": "inner", "output_of": "engineer"},
            "writer",
        ]
    },
    "outer-last": {"steps": ["architect", {"name": "build", "chain": "inner"}, "writer"]},
    "outer-tolerant": {
        "steps": ["architect", {"name": "build", "chain": "inner", "on_failure": "continue"}, "writer"]
    },
    "gated-inner": {"steps": [{"specialist": "engineer", "approve_before": True}, "reviewer"]},
    "outer-gated": {"steps": ["architect", {"name": "build", "chain": "gated-inner"}]},
    # A chain that runs itself: allowed because it bounds its depth.
    "recursive": {"max_depth": 2, "steps": ["architect", {"name": "again", "chain": "recursive"}]},
}


def child_catalog(extra: dict[str, Any] | None = None) -> Catalog:
    return Catalog.builtin().extended({"chains": {**CHAINS, **(extra or {})}}, "test", Path("."))


def child_runtime(
    store: RunStore,
    worker: ScriptedWorker | None = None,
    clock: ManualClock | None = None,
    catalog: Catalog | None = None,
) -> Runtime:
    return Runtime(
        store,
        catalog or child_catalog(),
        clock=clock or ManualClock(),
        new_id=sequential_ids(),
        resolve_contract=provider_contract,
        worker=worker or ScriptedWorker(),
        settings=RuntimeSettings(lease_ttl_seconds=30),
    )


async def drive_tree(runtime: Runtime, run_id: str, max_rounds: int = 50) -> RunHead:
    """Drive a run and every child run it has (as a dispatcher would) until the run settles."""
    for _ in range(max_rounds):
        await runtime.drive(run_id)
        head = await runtime.status(run_id)
        if head.status != RunStatus.AWAITING_CHILDREN:
            return head
        for task in head.tasks:
            for child in task.children or ():
                if child.status == "active":
                    await drive_tree(runtime, child.run_id, max_rounds)
    raise AssertionError(f"run {run_id} did not settle")

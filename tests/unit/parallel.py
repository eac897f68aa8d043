"""Builders for parallel runs: chains that fan out and fan in, and a host that answers every task
waiting for it (in reverse order, to show that the order does not matter)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestration.chains.catalog import Catalog
from orchestration.core.vocabulary import TaskStatus
from orchestration.engine.runtime import Runtime
from tests.unit.helpers import Decision

VERDICT = {"specialist": "reviewer", "output_schema": "verdict", "route_on": "verdict"}
RESEARCHERS = ("research-sources", "research-practice", "research-critique")


def fan(*branches: dict[str, Any], join: dict[str, Any] | None = None) -> dict[str, Any]:
    """Branches a, b, c (each after nothing), then a writer after all of them."""
    steps: list[dict[str, Any]] = [
        {"name": name, "specialist": "researcher", "after": [], **extra}
        for name, extra in zip("abc", branches, strict=False)
    ]
    steps.append({"specialist": "writer", "after": [s["name"] for s in steps], **(join or {})})
    return {"steps": steps}


PARALLEL_CATALOG = Catalog.builtin().extended(
    {
        "chains": {
            "fan-gated": fan(
                {"approve_after": True}, {"approve_before": True}, {}, join={"approve_before": True}
            ),
            "fan-continue": fan({"on_failure": "continue"}, {}, {}),
            "fan-two": {**fan({}, {}, {}), "max_parallel": 2},
            # a diamond whose reviewer loops back to one branch (front): the loop body is front and
            # the reviewer; back keeps its one instance
            "diamond-loop": {
                "steps": [
                    "architect",
                    {"name": "front", "specialist": "engineer", "after": ["architect"]},
                    {"name": "back", "specialist": "engineer", "after": ["architect"]},
                    {
                        **VERDICT,
                        "after": ["front", "back"],
                        "routes": {"approve": "end", "revise": "front", "reject": "fail"},
                        "on_exhausted": "ask",
                    },
                ]
            },
            # a reviewer that jumps over two parallel steps to the writer (approve), or loops back
            "graph-jump": {
                "steps": [
                    "engineer",
                    {
                        **VERDICT,
                        "after": ["engineer"],
                        "routes": {"approve": "writer", "revise": "engineer", "reject": "fail"},
                    },
                    {"specialist": "tester", "after": ["reviewer"]},
                    {"name": "docs", "specialist": "writer", "after": ["reviewer"]},
                    {"specialist": "writer", "after": ["tester", "docs"]},
                ]
            },
            # architect, then two engineers at once, then a reviewer after both
            "diamond": {
                "steps": [
                    "architect",
                    {"name": "front", "specialist": "engineer", "after": ["architect"]},
                    {"name": "back", "specialist": "engineer", "after": ["architect"]},
                    {"specialist": "reviewer", "after": ["front", "back"]},
                ]
            },
        }
    },
    "test",
    Path("."),
)


async def play_parallel(
    runtime: Runtime,
    run_id: str,
    decisions: Callable[[str], Decision] = lambda gate: "approve",
    output: Callable[[str], str] = lambda task: f"host output for {task}",
    max_steps: int = 100,
) -> None:
    """Drive the run to its end, answering every waiting host task (last first) and gate."""
    for _ in range(max_steps):
        await runtime.drive(run_id)
        head = await runtime.status(run_id)
        if head.status.is_terminal:
            return
        for task in reversed(head.tasks):
            if task.status == TaskStatus.AWAITING_HOST:
                await runtime.submit_host_output(run_id, task.task_id, output(task.task_id))
        for gate in head.gates:
            if gate.status == "requested":
                decision = decisions(gate.gate_id)
                assert decision != "wait", "parallel plays decide every gate"
                await runtime.approve(run_id, decision, gate.gate_id, comment=f"ok {gate.gate_id}")
                if decisions(gate.gate_id) == "reject":
                    return
    raise AssertionError("run did not finish")

"""Builders for routed runs: chains that loop and jump, a provider worker and a host that answer a
routing step by *task instance* (``reviewer`` revise, ``reviewer~2`` approve), never by call count,
so a run replays the same whatever was retried or restarted."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestration.chains.catalog import Catalog
from orchestration.chains.prompts import TaskPrompt
from orchestration.core.models import ChainStep, ExecutionContract, Telemetry, TypedError
from orchestration.core.outcomes import AttemptFailedOutcome, AttemptOutcome, AttemptSucceeded
from orchestration.workers.port import DeltaSink

VERDICT_STEP = {"specialist": "reviewer", "output_schema": "verdict", "route_on": "verdict"}
LOOP_ROUTES = {"approve": "end", "revise": "engineer", "reject": "fail"}


def loop_chain(on_exhausted: str, *, after: tuple[str, ...] = (), max_visits: int = 3) -> dict[str, Any]:
    """architect -> engineer -> reviewer (routing back to engineer) [-> after...]."""
    routes = dict(LOOP_ROUTES)
    if after:
        routes["approve"] = after[0]
    return {
        "steps": [
            "architect",
            {"specialist": "engineer", "max_visits": max_visits},
            {**VERDICT_STEP, "routes": routes, "on_exhausted": on_exhausted},
            *after,
        ]
    }


ROUTED_CATALOG = Catalog.builtin().extended(
    {
        "chains": {
            "loop-fail": loop_chain("fail"),
            "loop-end": loop_chain("end"),
            "loop-step": loop_chain("writer", after=("writer",)),
            "loop-gated": {
                "steps": [
                    "architect",
                    {"specialist": "engineer", "approve_before": True},
                    {**VERDICT_STEP, "routes": LOOP_ROUTES, "on_exhausted": "ask", "approve_after": True},
                ]
            },
            # gates the calling agent decides (the chain's policy): record format 5
            "agent-gated": {
                "approvers": ["agent"],
                "steps": ["architect", {"specialist": "engineer", "approve_after": True}],
            },
            # gates a person may send back (revise): after the engineer, before the tester
            "gated-revise": {
                "steps": [
                    "architect",
                    {"specialist": "engineer", "approve_after": True, "max_visits": 3},
                    {"specialist": "tester", "approve_before": True},
                ]
            },
            **{
                f"expiring-{on_expiry}": {
                    "steps": [
                        "architect",
                        {
                            "specialist": "engineer",
                            "approve_after": True,
                            "expires_after_seconds": 60,
                            "on_expiry": on_expiry,
                        },
                        "tester",
                    ]
                }
                for on_expiry in ("approve", "reject", "fail")
            },
            # a forward route: approve jumps over the tester to the writer
            "jump": {
                "steps": [
                    "engineer",
                    {**VERDICT_STEP, "routes": {"approve": "writer", "revise": "tester", "reject": "fail"}},
                    "tester",
                    "writer",
                ]
            },
        }
    },
    "routed-test",
    Path("."),
)


def verdict(value: str, notes: str = "") -> str:
    return json.dumps({"verdict": value, "notes": notes or f"notes for {value}"})


def answer_for(verdicts: Mapping[str, str]) -> Callable[[str], str]:
    """A host's answer per task id: the verdict for routing tasks named in ``verdicts``, prose for
    the others."""

    def answer(task_id: str) -> str:
        if task_id in verdicts:
            return verdict(verdicts[task_id], f"round notes from {task_id}")
        return f"the work of {task_id}"

    return answer


@dataclass
class InstanceWorker:
    """A provider worker scripted per task instance: ``verdicts`` answers routing tasks, ``errors``
    plays failed attempts first (per task id)."""

    verdicts: dict[str, str] = field(default_factory=dict)
    errors: dict[str, list[TypedError]] = field(default_factory=dict)
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
        n = self.calls.get(prompt.task_id, 0)
        self.calls[prompt.task_id] = n + 1
        planned = self.errors.get(prompt.task_id, [])
        if n < len(planned):
            return AttemptFailedOutcome(planned[n], Telemetry(http_status=planned[n].http_status))
        text = answer_for(self.verdicts)(prompt.task_id)
        value = json.loads(text) if step.output_schema is not None else None
        return AttemptSucceeded(text, Telemetry(output_tokens=5), value)

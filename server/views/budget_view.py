"""The budget part of a run view: what a run may spend (its budget, with what approvals added)
and what it spent, from the running totals its head keeps (see :mod:`orchestration.core.budget`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestration.core import RunHead, Spend, Tally, limits
from server.views.outline import View


class BudgetView(View):
    """A run's spend against its budget (its limits with what approvals added)."""

    spent_tokens: int
    spent_usd: float
    max_total_tokens: int | None = None
    max_cost_usd: float | None = None
    on_budget: Literal["fail", "ask"] = "fail"
    steps: dict[str, dict[str, float | int | None]] = Field(
        default_factory=dict, description="Per step with a budget: spent_tokens, spent_usd and its limits."
    )
    unpriced_calls: int = Field(default=0, description="Calls whose model has no price (cost unknown).")
    unmetered_calls: int = Field(
        default=0, description="Calls that ended without an outcome, counted at their most."
    )


def budget_view(head: RunHead) -> BudgetView | None:
    """The run's budget and spend (from the head's running totals); None without a budget."""
    costs = head.contract.costs
    if costs is None or costs.budget is None:
        return None
    spent = head.spent or Spend()
    run = limits(head, None)
    steps: dict[str, dict[str, float | int | None]] = {}
    for name in costs.budget.steps:
        tally = spent.steps.get(name, Tally())
        step = limits(head, name)
        steps[name] = {
            "spent_tokens": tally.total_tokens,
            "spent_usd": tally.cost_usd,
            "max_total_tokens": None if step is None else step.max_total_tokens,
            "max_cost_usd": None if step is None else step.max_cost_usd,
        }
    return BudgetView(
        spent_tokens=spent.run.total_tokens,
        spent_usd=spent.run.cost_usd,
        max_total_tokens=None if run is None else run.max_total_tokens,
        max_cost_usd=None if run is None else run.max_cost_usd,
        on_budget=costs.budget.on_budget,
        steps=steps,
        unpriced_calls=spent.run.unpriced_calls,
        unmetered_calls=spent.run.unmetered_calls,
    )

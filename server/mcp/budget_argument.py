"""``orchestrate_start``'s ``budget`` argument as the tool publishes it: the run's limits
and its steps' as a *list* of ``{step, max_total_tokens, max_cost_usd}`` objects, because an open map
(``steps: {name: limits}``, the core :class:`~orchestration.core.Budget`) is what strict function
calling refuses (OpenAI) or drops (converters that make it an empty object). Every optional field
takes ``null`` as "not given", as a strict model sends it. :meth:`BudgetArgument.to_budget` makes the
core model; the bounds are the core's (both classes extend :class:`~orchestration.core.BudgetLimits`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from orchestration.core import Budget, BudgetLimits, Limits
from orchestration.errors import InvalidArgument, quoted

LIMITS = Limits()


class StepBudget(BudgetLimits):
    """One step's limits, counting every visit of the step."""

    step: Annotated[str, Field(min_length=1, max_length=LIMITS.max_name_chars)]


class BudgetArgument(BudgetLimits):
    """A run's budget at the tool edge (see the module docstring)."""

    #: the core's ``OnBudget`` (mypy checks they agree where :meth:`to_budget` hands it over)
    on_budget: Literal["fail", "ask"] | None = None
    steps: Annotated[list[StepBudget] | None, Field(max_length=50)] = None

    def to_budget(self) -> Budget:
        """The core budget; ``invalid_argument`` when a step is named twice (a map cannot say
        that, a list can)."""
        steps = self.steps or []
        seen: set[str] = set()
        for limits in steps:
            if limits.step in seen:
                raise InvalidArgument(f"budget.steps names {quoted(limits.step)} twice; give each step once")
            seen.add(limits.step)
        return Budget(
            max_total_tokens=self.max_total_tokens,
            max_cost_usd=self.max_cost_usd,
            on_budget=self.on_budget or "fail",
            steps={
                s.step: BudgetLimits(max_total_tokens=s.max_total_tokens, max_cost_usd=s.max_cost_usd)
                for s in steps
            },
        )

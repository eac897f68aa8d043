"""The records of costs and budgets: what a run may spend (:class:`Costs`, recorded with its
contract), what it spent (:class:`Spend`, running totals in its head) and what a host reported.
A restarted run decides from these records, never from the resuming process's configuration. This
module imports nothing else of the domain, so that :mod:`orchestration.core.models` can hold them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestration.core.pricing import Price

#: ``fail``: a call the budget does not allow fails the run with ``budget_exhausted``; ``ask``: the
#: run waits at a ``budget`` gate, and approving it raises the budget
OnBudget = Literal["fail", "ask"]


def _no_description(schema: dict[str, Any]) -> None:
    # Budgets and usage are tool arguments too: every byte of their schema is paid by hosts in each
    # tools/list, and the tools' own field descriptions say what they mean.
    schema.pop("description", None)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_no_description)


class BudgetLimits(_Record):
    """Limits on what a run (or one of its steps) may spend: all tokens, in and out, and dollars
    (at the run's recorded prices). None: no limit of that kind. Also the amounts an approver adds
    to a budget at a ``budget`` gate."""

    max_total_tokens: int | None = Field(default=None, ge=1, le=10**12)
    max_cost_usd: float | None = Field(default=None, gt=0, le=10**9, allow_inf_nan=False)

    @property
    def empty(self) -> bool:
        return self.max_total_tokens is None and self.max_cost_usd is None


class Budget(BudgetLimits):
    """A run's budget: its own limits, its steps' (``steps``: step name -> limits, counting every
    visit of the step), and what a call that would go over does (``on_budget``)."""

    on_budget: OnBudget = "fail"
    steps: dict[str, BudgetLimits] = Field(default_factory=dict, max_length=50)


class Costs(_Record):
    """What a run knows about costs, recorded when it starts (in its execution contract)."""

    #: model -> price, for the run's models that have one (a model without one: tokens, no cost)
    prices: dict[str, Price] = Field(default_factory=dict)
    #: the output limit of each provider call (the most tokens a call can write); None: inline
    max_tokens: int | None = Field(default=None, ge=1)
    budget: Budget | None = None


class HostUsage(_Record):
    """Usage a host reports for its answer to a host task (its own model's tokens, optionally what
    they cost). Recorded as reported; the server cannot check it."""

    input_tokens: int = Field(ge=0, le=10**10)
    output_tokens: int = Field(ge=0, le=10**10)
    cost_usd: float | None = Field(default=None, ge=0, le=10**9, allow_inf_nan=False)


class Tally(_Record):
    """Running totals of calls' usage."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    #: calls whose model has no price: their tokens count, their cost is unknown (not in cost_usd)
    unpriced_calls: int = 0
    #: calls closed without an outcome (their worker died, or they ran out of time): each is
    #: counted at its most (``max_tokens``, priced), since the provider may have charged for it
    unmetered_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def plus(self, input_tokens: int, output_tokens: int, cost: float | None, *, unmetered: bool) -> Tally:
        return Tally(
            input_tokens=self.input_tokens + input_tokens,
            output_tokens=self.output_tokens + output_tokens,
            cost_usd=self.cost_usd + (cost or 0.0),
            unpriced_calls=self.unpriced_calls + (1 if cost is None else 0),
            unmetered_calls=self.unmetered_calls + (1 if unmetered else 0),
        )


class Spend(_Record):
    """What a run spent (kept in its head, folded from its facts) and what approvals added to its
    budget."""

    run: Tally = Tally()
    #: step name -> totals of all its visits, for the steps with a budget only
    steps: dict[str, Tally] = Field(default_factory=dict)
    #: added to the run's budget by approved ``budget`` gates
    raised: BudgetLimits = BudgetLimits()
    #: step name -> added to that step's budget
    raised_steps: dict[str, BudgetLimits] = Field(default_factory=dict)


class BudgetAsk(_Record):
    """A ``budget`` gate's request (on its ``approval_requested`` fact): the task whose call the
    budget did not allow, the budget it hit (``step``; None: the run's) and what was spent and
    what the call may need, in words."""

    task_id: str
    step: str | None = None
    note: str


__all__ = ["Budget", "BudgetAsk", "BudgetLimits", "Costs", "HostUsage", "OnBudget", "Spend", "Tally"]

"""What a run records about costs when it starts: :func:`with_costs` wraps the runtime's contract
resolver so that every contract carries :class:`~orchestration.core.costs.Costs` — the prices of the
run's models, the output limit of a provider call and the run's budget (the start's ``budget``,
else the chain's from the configuration) — checked before anything is stored."""

from __future__ import annotations

from collections.abc import Mapping

from orchestration.core.budget import model_of
from orchestration.core.costs import Budget, Costs
from orchestration.core.inputs import ContractResolver, StartRequest
from orchestration.core.models import ChainSnapshot, ExecutionContract
from orchestration.core.pricing import Price
from orchestration.errors import InvalidArgument, quoted


def check_budget(budget: Budget, chain: ChainSnapshot) -> None:
    """``InvalidArgument`` for a budget that limits nothing or names a step the chain lacks."""
    names = [s.name for s in chain.steps]
    for name, limits in budget.steps.items():
        if name not in names:
            raise InvalidArgument(
                f"budget.steps names {quoted(name)}, which is not a step of chain {chain.name}; "
                f"its steps are: {', '.join(names)}"
            )
        if limits.empty:
            raise InvalidArgument(f"budget.steps.{name} sets neither max_total_tokens nor max_cost_usd")
    if budget.empty and not budget.steps:
        raise InvalidArgument("budget sets no limit: give max_total_tokens, max_cost_usd or steps")


def _costs_usd(budget: Budget) -> bool:
    return budget.max_cost_usd is not None or any(s.max_cost_usd is not None for s in budget.steps.values())


def with_costs(
    resolve: ContractResolver,
    *,
    prices: Mapping[str, Price],
    max_tokens: int | None,
    budgets: Mapping[str, Budget] | None = None,
) -> ContractResolver:
    """``resolve`` with :class:`~orchestration.core.costs.Costs` added to each contract: ``prices``
    (model -> price: :func:`orchestration.core.pricing.price_table`) of the run's models, ``max_tokens``
    (the provider backend's output limit per call) and the budget: the start's, else
    ``budgets[chain name]``. A dollar budget for a model without a price is ``InvalidArgument``
    (it could not be checked). An inline run records costs only when it has a budget."""

    def resolved(request: StartRequest, chain: ChainSnapshot) -> ExecutionContract:
        contract = resolve(request, chain)
        budget = request.budget if request.budget is not None else (budgets or {}).get(chain.name)
        if budget is not None:
            check_budget(budget, chain)
        if contract.worker_backend == "inline":
            return contract if budget is None else contract.model_copy(update={"costs": Costs(budget=budget)})
        models = {m for m in (model_of(contract.executor_for(s)) for s in chain.steps) if m is not None}
        unpriced = sorted(models - prices.keys())
        if budget is not None and _costs_usd(budget) and unpriced:
            raise InvalidArgument(
                f"a budget in dollars needs the price of every model; {', '.join(unpriced)} has none: "
                f'add [prices."{unpriced[0]}"] input_per_mtok and output_per_mtok to construct.toml, '
                "or give max_total_tokens instead"
            )
        table = {m: prices[m] for m in sorted(models) if m in prices}
        costs = Costs(prices=table, max_tokens=max_tokens, budget=budget)
        return contract.model_copy(update={"costs": costs})

    return resolved


__all__ = ["check_budget", "with_costs"]

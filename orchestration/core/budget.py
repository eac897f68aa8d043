"""Costs and hard budgets: the pure rules (the records are in :mod:`orchestration.core.costs`).

A call starts only if, for the run's budget and its step's, what was spent, plus what the calls in
flight may still spend (each reserves its most), plus this call's most stays within the limit;
decided from the head alone (:func:`refusal`), so a restarted run refuses the same calls. The
rule, as users see it, is in docs/operations.md (Costs and budgets).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from orchestration.core.costs import Budget, BudgetLimits, Costs, Spend, Tally
from orchestration.core.inputs import ContractResolver, StartRequest
from orchestration.core.models import (
    ChainSnapshot,
    ExecutionContract,
    GateState,
    RunHead,
    TaskState,
    Telemetry,
)
from orchestration.core.pricing import Price, cost_usd
from orchestration.core.vocabulary import TaskStatus
from orchestration.errors import InvalidArgument, quoted

#: the prefix of a budget gate's id (``budget:1``, ``budget:2``, ...)
BUDGET_GATE = "budget"
#: the error code of a call the budget did not allow
BUDGET_EXHAUSTED = "budget_exhausted"


def model_of(executor: str | None) -> str | None:
    """The model of a provider executor (``provider:anthropic:claude-sonnet-4-5``); None else."""
    if executor is None or not executor.startswith("provider:"):
        return None
    parts = executor.split(":", 2)
    return parts[2] if len(parts) == 3 else None


# -- what a run records when it starts --------------------------------------------------------------


def check_budget(budget: Budget, chain: ChainSnapshot) -> None:
    """``InvalidArgument`` for a budget that limits nothing or names a step the chain lacks."""
    names = [s.name for s in chain.steps]
    for name, step_limits in budget.steps.items():
        if name not in names:
            raise InvalidArgument(
                f"budget.steps names {quoted(name)}, which is not a step of chain {chain.name}; "
                f"its steps are: {', '.join(names)}"
            )
        if step_limits.empty:
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


# -- what a run spent, and the rule -----------------------------------------------------------------


def _price(costs: Costs | None, executor: str | None) -> Price | None:
    model = model_of(executor)
    return None if costs is None or model is None else costs.prices.get(model)


def call_most(costs: Costs | None, executor: str | None) -> tuple[int, float]:
    """The most one call by ``executor`` may spend: ``max_tokens`` output tokens and their price
    (0 when the model has none). A host task's is (0, 0): only what its host reports counts."""
    if costs is None or costs.max_tokens is None or model_of(executor) is None:
        return 0, 0.0
    price = _price(costs, executor)
    return costs.max_tokens, 0.0 if price is None else cost_usd(price, 0, costs.max_tokens)


def priced(contract: ExecutionContract, executor: str, telemetry: Telemetry) -> Telemetry:
    """``telemetry`` with the cost of its tokens at the run's prices (unchanged when it has a cost
    already, as a host may report, no usage, or no price)."""
    if telemetry.cost_usd is not None or telemetry.reported_by_host:
        return telemetry
    if telemetry.input_tokens is None and telemetry.output_tokens is None:
        return telemetry
    price = _price(contract.costs, executor)
    if price is None:
        return telemetry
    cost = cost_usd(price, telemetry.input_tokens or 0, telemetry.output_tokens or 0)
    return telemetry.model_copy(update={"cost_usd": cost})


def _add(head: RunHead, step: str, tokens: tuple[int, int], cost: float | None, unmetered: bool) -> Spend:
    spend = head.spent or Spend()
    run = spend.run.plus(*tokens, cost, unmetered=unmetered)
    budget = None if head.contract.costs is None else head.contract.costs.budget
    if budget is None or step not in budget.steps:
        # A step's totals are kept only for a step with a budget: the head, rewritten at every
        # write, does not grow with the number of steps (views sum a task's attempts instead).
        return spend.model_copy(update={"run": run})
    tally = spend.steps.get(step, Tally()).plus(*tokens, cost, unmetered=unmetered)
    return spend.model_copy(update={"run": run, "steps": {**spend.steps, step: tally}})


# A child run's spend is not charged to its parent's head. For it to count against the parent's
# budget, a child's charge must also be charged to the parent (or the parent reserve the child's
# budget when it starts it), so that the parent's check sees it.
def charge(head: RunHead, step: str, telemetry: Telemetry) -> Spend | None:
    """``head.spent`` with an outcome's usage (``telemetry``, already :func:`priced`) added to the
    run's and ``step``'s totals; unchanged when the outcome reported no usage."""
    if telemetry.input_tokens is None and telemetry.output_tokens is None and telemetry.cost_usd is None:
        return head.spent
    tokens = (telemetry.input_tokens or 0, telemetry.output_tokens or 0)
    return _add(head, step, tokens, telemetry.cost_usd, False)


def charge_unmetered(head: RunHead, step: str, executor: str | None) -> Spend | None:
    """``head.spent`` with a call that ended without an outcome charged at its most (nothing for
    a host task, or a run without costs)."""
    tokens, usd = call_most(head.contract.costs, executor)
    if tokens == 0:
        return head.spent
    return _add(head, step, (0, tokens), usd if _price(head.contract.costs, executor) else None, True)


def limits(head: RunHead, step: str | None) -> BudgetLimits | None:
    """The run's budget (``step`` None) or ``step``'s, with what approvals added; None: none."""
    costs = head.contract.costs
    budget = None if costs is None else costs.budget
    if budget is None:
        return None
    base = BudgetLimits(max_total_tokens=budget.max_total_tokens, max_cost_usd=budget.max_cost_usd)
    if step is not None:
        base = budget.steps.get(step, BudgetLimits())
    if base.empty:
        return None
    spend = head.spent or Spend()
    added = spend.raised if step is None else spend.raised_steps.get(step, BudgetLimits())
    return BudgetLimits(
        max_total_tokens=None
        if base.max_total_tokens is None
        else base.max_total_tokens + (added.max_total_tokens or 0),
        max_cost_usd=None if base.max_cost_usd is None else base.max_cost_usd + (added.max_cost_usd or 0.0),
    )


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a task's call may not start: the budget it hit (``step``; None: the run's) and, in
    words, what was spent and what the call may need. ``wait``: other calls in flight hold
    reservations (in a parallel run), so the task waits for them instead."""

    task_id: str
    step: str | None
    message: str
    wait: bool


def _executor(head: RunHead, task: TaskState) -> str:
    return head.contract.executor_for(head.chain.step(task.step_name))


def refusal(head: RunHead, task: TaskState) -> Refusal | None:
    """Whether the budget refuses ``task``'s next call (the rule: the module's docstring). Pure;
    reads the head only: the totals it keeps and the attempts in flight (``running`` tasks)."""
    costs = head.contract.costs
    if costs is None or costs.budget is None:
        return None
    call_tokens, call_usd = call_most(costs, _executor(head, task))
    running = [t for t in head.tasks if t.status == TaskStatus.RUNNING]
    spend = head.spent or Spend()
    step = task.step_name
    for scope in (None, step):
        limit = limits(head, scope)
        if limit is None:
            continue
        tally = spend.run if scope is None else spend.steps.get(scope, Tally())
        held = [t for t in running if scope is None or t.step_name == scope]
        mosts = [call_most(costs, _executor(head, t)) for t in held]
        held_tokens = sum(m[0] for m in mosts)
        held_usd = sum(m[1] for m in mosts)
        what = "the run's budget" if scope is None else f"step {scope}'s budget"
        problem = None
        tokens = tally.total_tokens + held_tokens + call_tokens
        if limit.max_total_tokens is not None and tokens > limit.max_total_tokens:
            problem = (
                f"{what} allows {limit.max_total_tokens} tokens: {tally.total_tokens} spent, up to "
                f"{held_tokens} held by calls in flight, and the call of {task.task_id} may need up to "
                f"{call_tokens} (max_tokens)"
            )
        elif limit.max_cost_usd is not None and tally.cost_usd + held_usd + call_usd > limit.max_cost_usd:
            problem = (
                f"{what} allows ${limit.max_cost_usd:.4f}: ${tally.cost_usd:.4f} spent, up to "
                f"${held_usd:.4f} held by calls in flight, and the call of {task.task_id} may need up to "
                f"${call_usd:.4f} (max_tokens at the output price)"
            )
        if problem is not None:
            others = any(t.task_id != task.task_id for t in running)
            return Refusal(task.task_id, scope, problem, wait=others and task.status != TaskStatus.RUNNING)
    return None


def open_budget_gate(head: RunHead, task_id: str) -> GateState | None:
    """The requested budget gate of ``task_id``, if any."""
    for gate in head.gates:
        if gate.position == "budget" and gate.task_id == task_id and gate.status == "requested":
            return gate
    return None


def next_budget_gate_id(head: RunHead) -> str:
    """The id of the run's next budget gate: ``budget:<n>``, n counting them from 1."""
    return f"{BUDGET_GATE}:{sum(1 for g in head.gates if g.position == 'budget') + 1}"


def raise_budget(head: RunHead, gate: GateState, given: BudgetLimits | None) -> Spend:
    """``head.spent`` with the budget ``gate`` hit raised by ``given``: each kind of limit that
    budget has, by the amount given, or else by its original limit again."""
    spend = head.spent or Spend()
    costs = head.contract.costs
    budget = None if costs is None else costs.budget
    if budget is None:  # pragma: no cover - a budget gate exists only in a run with a budget
        return spend
    step = gate.budget_step
    base = BudgetLimits.model_validate(budget.model_dump(include={"max_total_tokens", "max_cost_usd"}))
    if step is not None:
        base = budget.steps.get(step, BudgetLimits())
    added = spend.raised if step is None else spend.raised_steps.get(step, BudgetLimits())
    tokens = None if given is None else given.max_total_tokens
    usd = None if given is None else given.max_cost_usd
    new = BudgetLimits(
        max_total_tokens=None
        if base.max_total_tokens is None
        else (added.max_total_tokens or 0) + (tokens or base.max_total_tokens),
        max_cost_usd=None
        if base.max_cost_usd is None
        else (added.max_cost_usd or 0.0) + (usd or base.max_cost_usd),
    )
    if step is None:
        return spend.model_copy(update={"raised": new})
    return spend.model_copy(update={"raised_steps": {**spend.raised_steps, step: new}})


def budget_raise(tokens: int | None, usd: float | None) -> BudgetLimits | None:
    """What an approver adds to a budget, from the CLI's ``--raise-tokens`` and ``--raise-usd``
    (None: neither given); ``InvalidArgument`` for an amount that is not positive."""
    if tokens is None and usd is None:
        return None
    try:
        return BudgetLimits(max_total_tokens=tokens, max_cost_usd=usd)
    except ValidationError:
        raise InvalidArgument(
            f"a budget raise must be positive: --raise-tokens {tokens}, --raise-usd {usd}"
        ) from None


def fails_run(task: TaskState) -> bool:
    """Whether ``task`` failed because the budget refused its call: that fails the run, whatever
    its step's ``on_failure`` (every later call would meet the same budget)."""
    return task.status == TaskStatus.FAILED and task.error is not None and task.error.code == BUDGET_EXHAUSTED


__all__ = [
    "BUDGET_EXHAUSTED",
    "Refusal",
    "budget_raise",
    "call_most",
    "charge",
    "charge_unmetered",
    "check_budget",
    "fails_run",
    "limits",
    "model_of",
    "next_budget_gate_id",
    "open_budget_gate",
    "priced",
    "raise_budget",
    "refusal",
    "with_costs",
]

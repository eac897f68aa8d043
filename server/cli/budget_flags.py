"""The CLI's budget and usage flags (see "Costs and budgets" in docs/operations.md).

``runs start`` takes a run's budget (``--max-total-tokens``, ``--max-cost-usd``, ``--on-budget``;
a step's own limits are set per chain in ``construct.toml``, ``[budgets.<chain>]``), and
``runs resume`` the usage a host reports for its output (``--input-tokens``, ``--output-tokens``,
``--cost-usd``), as ``orchestrate_start``'s ``budget`` and ``orchestrate_resume``'s ``usage`` do.
Values are checked by the same models as the tools' arguments: a bad one is ``invalid_argument``,
a usage error (exit status 2), as is a flag given without the one it goes with.
"""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from orchestration.core import Budget, HostUsage
from orchestration.errors import InvalidArgument
from server.cli.usage import UsageError


def add_budget_flags(start: argparse.ArgumentParser) -> None:
    start.add_argument("--max-total-tokens", type=int, metavar="N", help="the run's token budget")
    start.add_argument("--max-cost-usd", type=float, metavar="X", help="the run's budget in US dollars")
    start.add_argument(
        "--on-budget",
        choices=["fail", "ask"],
        help="a call over the budget fails the run (default) or waits at a gate that can raise it",
    )


def budget_of(args: argparse.Namespace) -> Budget | None:
    """The budget the flags give, or None (then the chain's from the configuration, if any)."""
    if args.max_total_tokens is None and args.max_cost_usd is None:
        if args.on_budget is not None:
            raise UsageError(error=InvalidArgument("--on-budget needs --max-total-tokens or --max-cost-usd"))
        return None
    try:
        return Budget(
            max_total_tokens=args.max_total_tokens,
            max_cost_usd=args.max_cost_usd,
            on_budget=args.on_budget or "fail",
        )
    except ValidationError as exc:
        raise UsageError(error=InvalidArgument(f"budget: {_problem(exc)}")) from None


def add_usage_flags(resume: argparse.ArgumentParser) -> None:
    resume.add_argument(
        "--input-tokens", type=int, metavar="N", help="with an output: your model's input tokens"
    )
    resume.add_argument("--output-tokens", type=int, metavar="N", help="with an output: its output tokens")
    resume.add_argument("--cost-usd", type=float, metavar="X", help="with an output: what it cost, if known")


def usage_of(args: argparse.Namespace) -> HostUsage | None:
    """The usage the flags report, or None; both token counts go together."""
    if args.input_tokens is None and args.output_tokens is None:
        if args.cost_usd is not None:
            raise UsageError(error=InvalidArgument("--cost-usd needs --input-tokens and --output-tokens"))
        return None
    if args.input_tokens is None or args.output_tokens is None:
        raise UsageError(error=InvalidArgument("--input-tokens and --output-tokens go together"))
    try:
        return HostUsage(
            input_tokens=args.input_tokens, output_tokens=args.output_tokens, cost_usd=args.cost_usd
        )
    except ValidationError as exc:
        raise UsageError(error=InvalidArgument(f"usage: {_problem(exc)}")) from None


def _problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])

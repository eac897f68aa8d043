"""Model prices, in US dollars per million tokens: :data:`DEFAULT_PRICES` are list prices as of
:data:`PRICES_AS_OF`, defaults that ``construct.toml`` overrides. A run records its prices when it
starts, so a later change applies to later runs only (docs/operations.md, Costs and budgets).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

#: The date the default prices below were taken from the providers' public price pages.
PRICES_AS_OF = "2025-10-15"


class Price(BaseModel):
    """The price of one model: US dollars per million input and output tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_per_mtok: float = Field(ge=0, allow_inf_nan=False)
    output_per_mtok: float = Field(ge=0, allow_inf_nan=False)
    #: where the price came from: ``default <date>`` or ``config``
    source: str = "config"


def _default(input_per_mtok: float, output_per_mtok: float) -> Price:
    return Price(
        input_per_mtok=input_per_mtok, output_per_mtok=output_per_mtok, source=f"default {PRICES_AS_OF}"
    )


#: List prices as of :data:`PRICES_AS_OF` (defaults: override them in ``construct.toml``).
DEFAULT_PRICES: Mapping[str, Price] = {
    "claude-opus-4-1": _default(15.0, 75.0),
    "claude-sonnet-4-5": _default(3.0, 15.0),
    "claude-haiku-4-5": _default(1.0, 5.0),
    "gpt-5": _default(1.25, 10.0),
    "gpt-5-mini": _default(0.25, 2.0),
    "gpt-4o": _default(2.5, 10.0),
    "gpt-4o-mini": _default(0.15, 0.6),
}


def price_table(overrides: Mapping[str, Price] | None = None) -> dict[str, Price]:
    """The defaults with ``overrides`` (the configuration's ``[prices]``) over them."""
    return {**DEFAULT_PRICES, **(overrides or {})}


def cost_usd(price: Price, input_tokens: int, output_tokens: int) -> float:
    """What ``input_tokens`` and ``output_tokens`` cost at ``price``."""
    return (input_tokens * price.input_per_mtok + output_tokens * price.output_per_mtok) / 1_000_000


__all__ = ["DEFAULT_PRICES", "PRICES_AS_OF", "Price", "cost_usd", "price_table"]

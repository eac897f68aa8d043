"""Riding out a store outage: jittered exponential backoff between the dispatcher's failed scans
(:class:`Backoff`), and the clock of one outage a drive stops past (:class:`Outage`). Both read the
monotonic ``anyio.current_time`` (an outage is measured, not dated) and an injected ``random.Random``.
"""

from __future__ import annotations

import random

import anyio


class Backoff:
    """Delays ``base * 2**n`` for the n-th consecutive failure, capped at ``cap``, each drawn
    uniformly from its upper half ("equal jitter"): processes that lost the store together do not
    come back in lockstep, and no delay falls below half its nominal value."""

    def __init__(self, base: float = 0.1, cap: float = 5.0, rng: random.Random | None = None) -> None:
        if base <= 0 or cap < base:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base = base
        self.cap = cap
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        """Count one more failure; the delay to wait before trying again."""
        nominal = min(self.cap, self.base * (1 << min(self.failures, 32)))
        self.failures += 1
        return nominal / 2 + self._rng.uniform(0, nominal / 2)

    def reset(self) -> None:
        self.failures = 0


class Outage:
    """How long the store has been failing without a success in between, against a limit."""

    def __init__(self, limit_seconds: float) -> None:
        self.limit_seconds = limit_seconds
        self._since: float | None = None

    def failed(self) -> None:
        """Record a failure (the outage starts at the first one)."""
        if self._since is None:
            self._since = anyio.current_time()

    def recovered(self) -> None:
        self._since = None

    @property
    def ongoing(self) -> bool:
        """Whether the store has failed since it last answered."""
        return self._since is not None

    @property
    def seconds(self) -> float:
        """How long the current outage has lasted (0 when the store is answering)."""
        return 0.0 if self._since is None else anyio.current_time() - self._since

    @property
    def over(self) -> bool:
        """Whether the current outage has lasted past the limit."""
        return self._since is not None and self.seconds >= self.limit_seconds

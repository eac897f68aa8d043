"""The retry policy for provider calls: whether another attempt is allowed, and after what delay.

Pure (randomness is an injected ``rng``). The provider worker folds its verdict into a failed
outcome; the runtime records it, with ``not_before``, in ``attempt_failed``; the pure ``decide``
acts on the record alone. Nothing else retries a provider call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from types import MappingProxyType

from orchestration.core.clock import Clock
from orchestration.core.models import ExecutionContract, Telemetry, TypedError
from orchestration.core.outcomes import AttemptFailedOutcome
from orchestration.workers.model_calls import ProviderErrorCode as Code

__all__ = [
    "DEFAULT_MAX_RETRIES_BY_CODE",
    "RetryDecision",
    "RetryPolicy",
    "Rng",
]

#: A source of uniform floats in [0, 1): ``random.Random(seed).random`` or ``random.random``.
Rng = Callable[[], float]

#: Retries allowed per code on top of the overall attempt budget (retries, not attempts). A client
#: marks every ``empty_response`` retryable, not knowing the history; the cap makes it "at most
#: once" (Anthropic's docs advise against resending an empty ``end_turn`` unchanged).
DEFAULT_MAX_RETRIES_BY_CODE: Mapping[str, int] = MappingProxyType(
    {Code.EMPTY_RESPONSE.value: 1, Code.MALFORMED_RESPONSE.value: 2}
)

# 2**64 half-seconds is far beyond any cap; bounding the exponent keeps the float finite.
_MAX_EXPONENT = 64


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """``retry``: whether to make another attempt; ``delay_seconds``: how long to wait first (0.0
    when not retrying); ``reason``: one line for logs and for the final error's message."""

    retry: bool
    delay_seconds: float
    reason: str

    def error_to_record(self, error: TypedError) -> TypedError:
        """The error as the attempt should be recorded.

        When the policy refuses to retry an error the provider marked retryable (a per-code cap, a
        too-long retry-after), the copy says ``retryable=False`` and why, so that whoever reads the
        record — the pure ``decide`` step included — does not schedule another attempt.
        """
        if self.retry or not error.retryable:
            return error
        return error.model_copy(update={"retryable": False, "message": f"{error.message} ({self.reason})"})


def _default_caps() -> Mapping[str, int]:
    return DEFAULT_MAX_RETRIES_BY_CODE


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and jitter, as the official SDKs do.

    ``max_attempts`` counts attempts, the first included (``ExecutionContract.max_attempts``).
    ``max_retry_after_seconds`` bounds how long a server may ask us to wait: above it the error is
    treated as final (a provider asking for hours is effectively saying "quota"); None: no bound.
    """

    max_attempts: int = 3
    base_delay_seconds: float = 0.5
    max_backoff_seconds: float = 8.0
    min_jitter: float = 0.75
    max_retries_by_code: Mapping[str, int] = field(default_factory=_default_caps)
    max_retry_after_seconds: float | None = 3600.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay_seconds < 0 or self.max_backoff_seconds < 0:
            raise ValueError("backoff delays must not be negative")
        if not 0.0 <= self.min_jitter <= 1.0:
            raise ValueError("min_jitter must be within [0, 1]")
        if any(cap < 0 for cap in self.max_retries_by_code.values()):
            raise ValueError("per-code retry caps must not be negative")

    def backoff_seconds(self, attempt_number: int, rng: Rng) -> float:
        """``min(base · 2^n, max_backoff) · U(min_jitter, 1)`` with ``n = attempt_number - 1``.

        ``attempt_number`` is the 1-based number of the attempt that just failed, so the wait before
        the first retry is ``0.5 s · U(0.75, 1)``, then 1, 2, 4, 8, 8... seconds (before jitter).
        ``rng()`` in [0, 1) maps to a factor in (min_jitter, 1]; it is clamped to stay in bounds.
        """
        n = min(max(0, attempt_number - 1), _MAX_EXPONENT)
        ceiling = min(self.base_delay_seconds * 2.0**n, self.max_backoff_seconds)
        r = min(max(rng(), 0.0), 1.0)
        return ceiling * (1.0 - (1.0 - self.min_jitter) * r)

    def decide(
        self,
        error: TypedError,
        *,
        attempt_number: int,
        same_code_failures: int,
        rng: Rng,
    ) -> RetryDecision:
        """Whether attempt ``attempt_number + 1`` may follow the failure ``error``, and when.

        ``attempt_number``: the 1-based number of the attempt that failed with ``error``.
        ``same_code_failures``: how many attempts so far failed with ``error.code``, this one
        included. The delay is the larger of the backoff and the server's ``retry_after_seconds``.
        """
        if not error.retryable:
            return RetryDecision(False, 0.0, f"{error.code} is not retryable")
        if attempt_number >= self.max_attempts:
            return RetryDecision(False, 0.0, f"attempt {attempt_number} of {self.max_attempts} failed")
        cap = self.max_retries_by_code.get(error.code)
        if cap is not None and same_code_failures > cap:
            return RetryDecision(False, 0.0, f"{error.code} is retried at most {cap} time(s)")
        delay = self.backoff_seconds(attempt_number, rng)
        retry_after = error.retry_after_seconds
        if retry_after is not None:
            if self.max_retry_after_seconds is not None and retry_after > self.max_retry_after_seconds:
                return RetryDecision(
                    False,
                    0.0,
                    f"the server asks to wait {retry_after:.0f} s, more than "
                    f"{self.max_retry_after_seconds:.0f} s",
                )
            delay = max(delay, retry_after)
        return RetryDecision(True, delay, f"retrying {error.code} in {delay:.2f} s")

    def decide_after(
        self,
        errors: Sequence[TypedError],
        *,
        rng: Rng,
        attempt_number: int | None = None,
    ) -> RetryDecision:
        """:meth:`decide` from the errors of the attempts so far, oldest first, the latest last.

        ``attempt_number`` defaults to ``len(errors)``; pass it when some attempts recorded no
        error (an attempt orphaned by a crash).
        """
        if not errors:
            raise ValueError("decide_after needs at least the error of the latest attempt")
        latest = errors[-1]
        return self.decide(
            latest,
            attempt_number=len(errors) if attempt_number is None else attempt_number,
            same_code_failures=sum(1 for e in errors if e.code == latest.code),
            rng=rng,
        )


def failed_outcome(
    policy: RetryPolicy,
    contract: ExecutionContract,
    attempt: int,
    previous_errors: tuple[TypedError, ...],
    error: TypedError,
    telemetry: Telemetry,
    rng: Callable[[], float],
    clock: Clock,
) -> AttemptFailedOutcome:
    """An attempt's failed outcome with ``policy``'s verdict folded in (at most the run's
    ``max_attempts``): the error to record, and when a retry may start (None: no retry). The
    provider and agent workers both answer a failure with it."""
    bounded = replace(policy, max_attempts=contract.max_attempts)
    decision = bounded.decide_after((*previous_errors, error), rng=rng, attempt_number=attempt)
    not_before = clock.now() + timedelta(seconds=decision.delay_seconds) if decision.retry else None
    return AttemptFailedOutcome(decision.error_to_record(error), telemetry, not_before)

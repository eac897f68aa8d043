"""Classification shared by both provider dialects: HTTP status, server retry hints, and the
message and code patterns that mean "context too long" or "quota spent".

The dialect modules (:mod:`.anthropic`, :mod:`.openai_compat`) read their own error bodies and call
into this module for everything the two APIs have in common, so that a status code means the same
thing whichever provider sent it. Everything here is pure; "now" is a parameter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from orchestration.core.models import Telemetry, TypedError
from orchestration.workers._redact import Redactor
from orchestration.workers.model_calls import RETRYABLE_BY_CODE, ProviderCallError
from orchestration.workers.model_calls import ProviderErrorCode as Code

__all__ = [
    "CONTEXT_LENGTH_CODES",
    "NEVER_RETRY",
    "QUOTA_CODES",
    "AttemptFacts",
    "apply_retry_hint",
    "as_int",
    "code_for_in_body_status",
    "code_for_status",
    "is_context_length",
    "is_quota_code",
    "parse_retry_after",
    "possible_duplicate_for",
    "should_retry_hint",
]

# Codes a server hint (``x-should-retry: true``) cannot make retryable: sending the same request
# again cannot fix a bad key, an empty wallet, a prompt that is too long or a policy refusal.
NEVER_RETRY = frozenset(
    {Code.AUTH, Code.QUOTA_EXHAUSTED, Code.CONTEXT_LENGTH_EXCEEDED, Code.CONTENT_FILTERED}
)

# Quota / spend codes (OpenAI ``type`` or ``code``; Anthropic ``error.details.error_code``). They
# arrive as 429s but waiting does not help, so they must not be treated as rate limits.
QUOTA_CODES = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "billing_hard_limit_reached",
        "billing_not_active",
        "enforced_spend_limit_reached",
    }
)

CONTEXT_LENGTH_CODES = frozenset(
    {"context_length_exceeded", "exceed_context_size_error", "model_context_window_exceeded"}
)

# Messages that mean the prompt does not fit, across Anthropic ("prompt is too long", "exceed
# context limit"), OpenAI and vLLM ("maximum context length is N tokens"), llama.cpp ("exceeds the
# available context size") and others ("context window"). Only consulted for 400/413 errors, so a
# rate-limit message mentioning tokens is never mistaken for one.
_CONTEXT_LENGTH_MESSAGE = re.compile(
    r"prompt is too long|exceeds? (the )?(available )?context|maximum context length"
    r"|context (length|window|size|limit)",
    re.IGNORECASE,
)


def is_quota_code(value: object) -> bool:
    """True for a provider code that means the account or key has no money or quota left."""
    if not isinstance(value, str):
        return False
    return value in QUOTA_CODES or value.endswith("_spend_limit_exceeded")


def is_context_length(code: object, message: str) -> bool:
    """True when an error code or message says the prompt does not fit the model's context."""
    if isinstance(code, str) and code in CONTEXT_LENGTH_CODES:
        return True
    return bool(_CONTEXT_LENGTH_MESSAGE.search(message))


def code_for_status(status: int) -> Code:
    """The taxonomy code an HTTP status means when the body says nothing more specific."""
    if status in (408, 504):
        return Code.TIMEOUT
    if status == 429:
        return Code.RATE_LIMITED
    if status == 402:
        return Code.QUOTA_EXHAUSTED
    if status in (401, 403):
        return Code.AUTH
    if status in (503, 529):
        return Code.OVERLOADED
    if status >= 500:
        return Code.SERVER_ERROR
    # 400, 404, 409, 413, 422, any other 4xx, and 3xx (redirects are not followed: a redirect
    # means the base URL is wrong).
    return Code.INVALID_REQUEST


def code_for_in_body_status(value: object) -> Code:
    """The code for an error reported inside a 2xx body (OpenRouter's 200-with-error).

    The HTTP exchange itself succeeded, so only the clearly transient or clearly permanent in-body
    codes keep their HTTP meaning; anything else is an upstream failure: ``server_error``.
    """
    if is_quota_code(value):
        return Code.QUOTA_EXHAUSTED
    if isinstance(value, str) and value in CONTEXT_LENGTH_CODES:
        return Code.CONTEXT_LENGTH_EXCEEDED
    status = as_int(value)
    if status == 429:
        return Code.RATE_LIMITED
    if status == 402:
        return Code.QUOTA_EXHAUSTED
    if status in (408, 504):
        return Code.TIMEOUT
    if status in (503, 529):
        return Code.OVERLOADED
    return Code.SERVER_ERROR


def parse_retry_after(headers: Mapping[str, str], now: datetime) -> float | None:
    """Seconds the server asks us to wait, or None.

    ``retry-after-ms`` (milliseconds, sent by OpenAI and Anthropic) wins over ``retry-after``, which
    is either delta-seconds or an HTTP-date (RFC 9110 §10.2.3) taken relative to ``now``. A date in
    the past means "now" (0.0); a negative, non-finite or unparseable value is ignored (None).
    ``headers`` must be case-insensitive (``httpx2.Headers``) or use lowercase names.
    """
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        ms = _non_negative_float(raw_ms)
        if ms is not None:
            return ms / 1000.0
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _non_negative_float(raw)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" parses naive; HTTP-dates are always UTC
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def should_retry_hint(headers: Mapping[str, str]) -> bool | None:
    """The server's ``x-should-retry`` verdict (``true`` / ``false``), or None when absent."""
    value = headers.get("x-should-retry")
    if value is None:
        return None
    value = value.strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    return None


def apply_retry_hint(code: Code, retryable: bool, hint: bool | None) -> bool:
    """Let ``x-should-retry`` override the table, as the official SDKs do, with one exception:
    ``true`` cannot make a :data:`NEVER_RETRY` code retryable."""
    if hint is None:
        return retryable
    if hint and code in NEVER_RETRY:
        return False
    return hint


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """What one attempt measured, shared by every error built for it.

    ``provider`` prefixes messages ("anthropic", "openai-compat") so that a stored error says which
    API spoke; ``redact`` scrubs every message before it is stored.
    """

    provider: str
    redact: Redactor
    latency_ms: float | None = None
    http_status: int | None = None
    request_id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    first_token_ms: float | None = None
    stream_ms: float | None = None

    def telemetry(self, *, possible_duplicate_call: bool = False) -> Telemetry:
        return Telemetry(
            latency_ms=self.latency_ms,
            http_status=self.http_status,
            provider_request_id=self.request_id,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            possible_duplicate_call=possible_duplicate_call,
            first_token_ms=self.first_token_ms,
            stream_ms=self.stream_ms,
        )

    def failure(
        self,
        code: Code,
        message: str,
        *,
        retryable: bool | None = None,
        retry_after_seconds: float | None = None,
        possible_duplicate_call: bool = False,
    ) -> ProviderCallError:
        """A :class:`ProviderCallError` for this attempt; ``retryable`` defaults to the table."""
        error = TypedError(
            code=code.value,
            message=self.redact(f"{self.provider}: {message}"),
            retryable=RETRYABLE_BY_CODE[code] if retryable is None else retryable,
            http_status=self.http_status,
            retry_after_seconds=retry_after_seconds,
            provider_request_id=self.request_id,
        )
        return ProviderCallError(error, self.telemetry(possible_duplicate_call=possible_duplicate_call))


def possible_duplicate_for(code: Code, status: int) -> bool:
    """Whether a failed HTTP answer may still have run (and billed) the request.

    A gateway timeout (504, or ``timeout_error`` in a body) gives up waiting on a model that may
    well finish; a 408 says the server never received the whole request, so nothing ran."""
    return code is Code.TIMEOUT and status != 408


def as_int(value: object) -> int | None:
    """An integer usage count or status from JSON, or None (bool is not a count)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _non_negative_float(raw: str) -> float | None:
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value

"""Retry hints (``retry-after``, ``retry-after-ms``, ``x-should-retry``), the backoff formula and
the retry policy's caps. All pure: time and randomness are injected."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import httpx2
import pytest

from orchestration.core.models import TypedError
from orchestration.workers._redact import Redactor
from orchestration.workers.classify import (
    apply_retry_hint,
    code_for_in_body_status,
    code_for_status,
    parse_retry_after,
    should_retry_hint,
)
from orchestration.workers.model_calls import RETRYABLE_BY_CODE, ProviderErrorCode
from orchestration.workers.retry import RetryDecision, RetryPolicy

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def headers(**values: str) -> httpx2.Headers:
    return httpx2.Headers({k.replace("_", "-"): v for k, v in values.items()})


def err(code: str, *, retryable: bool = True, retry_after: float | None = None) -> TypedError:
    return TypedError(
        code=code, message=f"{code} happened", retryable=retryable, retry_after_seconds=retry_after
    )


# --- retry-after ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"retry_after": "7"}, 7.0),
        ({"retry_after": " 1.5 "}, 1.5),
        ({"retry_after": "0"}, 0.0),
        ({"retry_after_ms": "250"}, 0.25),
        ({"retry_after_ms": "1500", "retry_after": "9"}, 1.5),
        ({"retry_after_ms": "junk", "retry_after": "9"}, 9.0),
        ({"retry_after": "Sun, 29 Nov 2026 12:00:30 GMT"}, 30.0),
        ({"retry_after": "Sunday, 29-Nov-26 12:01:00 GMT"}, 60.0),  # RFC 850, still valid
        ({"retry_after": "Sun, 29 Nov 2026 11:59:00 GMT"}, 0.0),  # in the past: now
        ({"retry_after": "-3"}, None),
        ({"retry_after": "nan"}, None),
        ({"retry_after": "inf"}, None),
        ({"retry_after": "soon"}, None),
        ({"retry_after_ms": "-1"}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(values: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers(**values), NOW) == expected


def test_retry_after_header_names_are_case_insensitive() -> None:
    assert parse_retry_after(httpx2.Headers({"Retry-After": "3"}), NOW) == 3.0
    assert parse_retry_after(httpx2.Headers({"Retry-After-Ms": "30"}), NOW) == 0.03


def test_retry_after_date_depends_on_now() -> None:
    value = headers(retry_after="Sun, 29 Nov 2026 12:00:30 GMT")
    later = datetime(2026, 11, 29, 12, 0, 20, tzinfo=UTC)
    assert parse_retry_after(value, later) == 10.0


@pytest.mark.parametrize(("raw", "hint"), [("true", True), ("FALSE", False), (" false ", False), ("1", None)])
def test_should_retry_hint(raw: str, hint: bool | None) -> None:
    assert should_retry_hint(headers(x_should_retry=raw)) is hint
    assert should_retry_hint(headers()) is None


def test_a_hint_cannot_make_permanent_codes_retryable() -> None:
    for code in ProviderErrorCode:
        assert apply_retry_hint(code, RETRYABLE_BY_CODE[code], None) is RETRYABLE_BY_CODE[code]
        assert apply_retry_hint(code, RETRYABLE_BY_CODE[code], False) is False
    assert apply_retry_hint(ProviderErrorCode.INVALID_REQUEST, False, True) is True
    for permanent in ("auth", "quota_exhausted", "context_length_exceeded", "content_filtered"):
        assert apply_retry_hint(ProviderErrorCode(permanent), False, True) is False


# --- status tables -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "invalid_request"),
        (401, "auth"),
        (402, "quota_exhausted"),
        (403, "auth"),
        (404, "invalid_request"),
        (408, "timeout"),
        (409, "invalid_request"),
        (413, "invalid_request"),
        (422, "invalid_request"),
        (429, "rate_limited"),
        (500, "server_error"),
        (502, "server_error"),
        (503, "overloaded"),
        (504, "timeout"),
        (529, "overloaded"),
        (302, "invalid_request"),
    ],
)
def test_code_for_status(status: int, code: str) -> None:
    assert code_for_status(status) == code


def test_every_code_has_a_retry_default_matching_the_taxonomy() -> None:
    retryable = {c.value for c, r in RETRYABLE_BY_CODE.items() if r}
    assert set(RETRYABLE_BY_CODE) == set(ProviderErrorCode)
    assert retryable == {
        "transport_error",
        "timeout",
        "rate_limited",
        "overloaded",
        "server_error",
        "empty_response",
        "malformed_response",
    }


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (429, "rate_limited"),
        ("429", "rate_limited"),
        (502, "server_error"),
        (True, "server_error"),
        ({}, "server_error"),
    ],
)
def test_in_body_codes(value: object, code: str) -> None:
    assert code_for_in_body_status(value) == code


# --- backoff -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (6, 8.0), (50, 8.0), (10_000, 8.0)],
)
def test_backoff_ceiling_and_floor(attempt: int, ceiling: float) -> None:
    policy = RetryPolicy()
    assert policy.backoff_seconds(attempt, lambda: 0.0) == ceiling
    assert policy.backoff_seconds(attempt, lambda: 1.0) == pytest.approx(0.75 * ceiling)


def test_backoff_stays_within_bounds_for_random_draws() -> None:
    policy = RetryPolicy()
    rng = random.Random(1234)
    for attempt in range(1, 12):
        ceiling = min(0.5 * 2 ** (attempt - 1), 8.0)
        draws = [policy.backoff_seconds(attempt, rng.random) for _ in range(200)]
        assert all(0.75 * ceiling <= d <= ceiling for d in draws)
        assert max(draws) - min(draws) > 0.1 * ceiling  # jitter actually spreads the delays


def test_backoff_clamps_a_misbehaving_rng() -> None:
    policy = RetryPolicy()
    assert policy.backoff_seconds(1, lambda: -5.0) == 0.5
    assert policy.backoff_seconds(1, lambda: 7.0) == pytest.approx(0.375)


def test_backoff_is_deterministic_for_a_seeded_rng() -> None:
    policy = RetryPolicy()
    first = [policy.backoff_seconds(n, random.Random(7).random) for n in range(1, 6)]
    again = [policy.backoff_seconds(n, random.Random(7).random) for n in range(1, 6)]
    assert first == again


# --- the policy ----------------------------------------------------------------------------------

ZERO = lambda: 0.0  # noqa: E731 - a named constant rng reads best in the calls below


def test_non_retryable_errors_stop() -> None:
    decision = RetryPolicy().decide(
        err("auth", retryable=False), attempt_number=1, same_code_failures=1, rng=ZERO
    )
    assert decision == RetryDecision(False, 0.0, "auth is not retryable")


def test_the_attempt_budget_stops_retries() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert policy.decide(err("overloaded"), attempt_number=2, same_code_failures=2, rng=ZERO).retry
    last = policy.decide(err("overloaded"), attempt_number=3, same_code_failures=3, rng=ZERO)
    assert not last.retry
    assert "attempt 3 of 3" in last.reason


def test_empty_response_is_retried_at_most_once() -> None:
    policy = RetryPolicy(max_attempts=10)
    assert policy.decide(err("empty_response"), attempt_number=1, same_code_failures=1, rng=ZERO).retry
    second = policy.decide(err("empty_response"), attempt_number=2, same_code_failures=2, rng=ZERO)
    assert not second.retry
    assert "at most 1" in second.reason


def test_malformed_response_is_retried_at_most_twice() -> None:
    policy = RetryPolicy(max_attempts=10)
    outcomes = [
        policy.decide(err("malformed_response"), attempt_number=n, same_code_failures=n, rng=ZERO).retry
        for n in (1, 2, 3)
    ]
    assert outcomes == [True, True, False]


def test_caps_count_only_the_same_code() -> None:
    policy = RetryPolicy(max_attempts=10)
    history = [err("overloaded"), err("empty_response"), err("timeout"), err("overloaded")]
    assert policy.decide_after([*history, err("empty_response")], rng=ZERO).retry is False
    assert policy.decide_after([*history[:3], err("malformed_response")], rng=ZERO).retry is True


def test_uncapped_codes_use_the_whole_budget() -> None:
    policy = RetryPolicy(max_attempts=5)
    decisions = [policy.decide_after([err("timeout")] * n, rng=ZERO).retry for n in range(1, 6)]
    assert decisions == [True, True, True, True, False]


def test_delay_is_the_larger_of_backoff_and_retry_after() -> None:
    policy = RetryPolicy()
    slow = policy.decide(
        err("rate_limited", retry_after=20.0), attempt_number=1, same_code_failures=1, rng=ZERO
    )
    assert (slow.retry, slow.delay_seconds) == (True, 20.0)
    quick = policy.decide(
        err("rate_limited", retry_after=0.1), attempt_number=2, same_code_failures=2, rng=ZERO
    )
    assert quick.delay_seconds == 1.0


def test_a_too_long_retry_after_stops() -> None:
    policy = RetryPolicy(max_retry_after_seconds=120.0)
    decision = policy.decide(
        err("rate_limited", retry_after=7200.0), attempt_number=1, same_code_failures=1, rng=ZERO
    )
    assert not decision.retry
    assert "7200 s" in decision.reason
    unbounded = RetryPolicy(max_retry_after_seconds=None)
    assert unbounded.decide(
        err("rate_limited", retry_after=7200.0), attempt_number=1, same_code_failures=1, rng=ZERO
    )


def test_decide_after_can_take_the_attempt_number() -> None:
    policy = RetryPolicy(max_attempts=3)
    # Two attempts recorded errors, a third was orphaned by a crash: the budget is spent.
    assert not policy.decide_after([err("timeout"), err("timeout")], rng=ZERO, attempt_number=3).retry
    with pytest.raises(ValueError):
        policy.decide_after([], rng=ZERO)


def test_error_to_record_marks_refused_retries_final() -> None:
    policy = RetryPolicy(max_attempts=10)
    error = err("empty_response")
    refused = policy.decide(error, attempt_number=2, same_code_failures=2, rng=ZERO)
    recorded = refused.error_to_record(error)
    assert recorded.retryable is False
    assert recorded.code == "empty_response"
    assert "at most 1" in recorded.message
    allowed = policy.decide(error, attempt_number=1, same_code_failures=1, rng=ZERO)
    assert allowed.error_to_record(error) is error


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"min_jitter": 1.5},
        {"base_delay_seconds": -1.0},
        {"max_retries_by_code": {"x": -1}},
    ],
)
def test_policy_validation(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


# --- redaction -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Incorrect API key provided: sk-proj-****abcd.", "Incorrect API key provided: [redacted]."),
        ("Authorization: Bearer abc.def", "Authorization: [redacted]"),
        ("got bearer xyz123 here", "got Bearer [redacted] here"),
        ('{"x-api-key": "k-123"}', '{"x-api-key": "[redacted]"}'),
        ("line one\nline two", "line one line two"),
        ("plain message", "plain message"),
    ],
)
def test_redactor_shapes(text: str, expected: str) -> None:
    assert Redactor()(text) == expected


def test_redactor_removes_exact_secrets_before_truncating() -> None:
    secret = "opaque-token-" + "q" * 40
    redact = Redactor([secret, None, ""])
    out = redact("x" * 480 + secret, limit=500)
    assert secret[:10] not in out
    assert len(out) <= 500
    assert secret not in repr(redact)


# --- public surface ------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["model_calls", "classify", "anthropic", "openai_compat", "retry"])
def test_export_lists_name_real_public_objects(module: str) -> None:
    import importlib

    mod = importlib.import_module(f"orchestration.workers.{module}")
    for name in mod.__all__:
        assert hasattr(mod, name), name
        assert not name.startswith("_")

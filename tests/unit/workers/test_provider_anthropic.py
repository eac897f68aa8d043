"""The Anthropic adapter against ``httpx2.MockTransport``: request shape, every taxonomy code from a
realistic response, transport failures, cancellation, and that the key never leaks."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx2
import pytest

from orchestration.core.clock import ManualClock
from orchestration.workers.anthropic import AnthropicClient
from orchestration.workers.model_calls import (
    ProviderCallError,
    ProviderRequest,
    ProviderResponse,
    make_http_client,
)

CANARY = "sk-ant-api03-" + secrets.token_urlsafe(32)
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
REQUEST = ProviderRequest(
    model="claude-sonnet-4-5", system="You are an engineer.", user="Build it.", max_tokens=256
)
REQ_ID = "req_011CSHoEeqs5C35K2UUqR7Fy"

Handler = (
    Callable[[httpx2.Request], httpx2.Response]
    | Callable[[httpx2.Request], Coroutine[None, None, httpx2.Response]]
)


class Ticks:
    """A monotonic clock that advances 0.25 s per reading: latency is always 250 ms."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


@asynccontextmanager
async def client_for(handler: Handler, **kwargs: Any) -> AsyncIterator[AnthropicClient]:
    async with make_http_client(httpx2.MockTransport(handler)) as http:
        yield AnthropicClient(http, api_key=CANARY, clock=ManualClock(NOW), monotonic=Ticks(), **kwargs)


async def complete(handler: Handler, request: ProviderRequest = REQUEST) -> ProviderResponse:
    async with client_for(handler) as client:
        return await client.complete(request)


async def failure(handler: Handler, request: ProviderRequest = REQUEST) -> ProviderCallError:
    with pytest.raises(ProviderCallError) as info:
        await complete(handler, request)
    return info.value


def message(
    content: list[dict[str, Any]] | None = None,
    stop_reason: str | None = "end_turn",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "Done."}] if content is None else content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 34},
        **extra,
    }


def reply(
    status: int, body: Any = None, headers: dict[str, str] | None = None, text: str | None = None
) -> Handler:
    def handler(request: httpx2.Request) -> httpx2.Response:
        merged = {"request-id": REQ_ID, **(headers or {})}
        if text is not None:
            return httpx2.Response(status, text=text, headers=merged)
        return httpx2.Response(status, json=body, headers=merged)

    return handler


def error_body(etype: str, msg: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": etype, "message": msg}
    if details is not None:
        error["details"] = details
    return {"type": "error", "error": error, "request_id": REQ_ID}


# --- request shape -------------------------------------------------------------------------------


async def test_request_shape() -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json=message())

    await complete(handler)
    [request] = seen
    assert request.method == "POST"
    assert str(request.url) == "https://api.anthropic.com/v1/messages"
    assert request.headers["x-api-key"] == CANARY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert request.headers["content-type"] == "application/json"
    assert "authorization" not in request.headers
    assert json.loads(request.content) == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 256,
        "system": "You are an engineer.",
        "messages": [{"role": "user", "content": "Build it."}],
        "stream": True,
    }


async def test_optional_fields_temperature_and_empty_system() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(json.loads(request.content))
        return httpx2.Response(200, json=message())

    await complete(handler, ProviderRequest(model="m", system="", user="u", max_tokens=5, temperature=0.2))
    assert seen[0]["temperature"] == 0.2
    assert "system" not in seen[0]


async def test_version_header_is_configurable() -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json=message())

    async with client_for(handler, anthropic_version="2026-10-21") as client:
        await client.complete(REQUEST)
    assert seen[0].headers["anthropic-version"] == "2026-10-21"


@pytest.mark.parametrize(
    "base",
    ["https://gw.example/anthropic", "https://gw.example/anthropic/", "https://gw.example/anthropic/v1"],
)
async def test_base_url_convention(base: str) -> None:
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(str(request.url))
        return httpx2.Response(200, json=message())

    async with make_http_client(httpx2.MockTransport(handler)) as http:
        await AnthropicClient(http, api_key=CANARY, base_url=base).complete(REQUEST)
    assert seen == ["https://gw.example/anthropic/v1/messages"]


@pytest.mark.parametrize(
    "base", ["ftp://x.example", "https://user:pw@x.example", "https://x.example?k=1", "nope"]
)
async def test_bad_base_urls_are_refused(base: str) -> None:
    async with make_http_client(httpx2.MockTransport(reply(200, message()))) as http:
        with pytest.raises(ValueError) as info:
            AnthropicClient(http, api_key=CANARY, base_url=base)
    assert "pw" not in str(info.value)  # credentials in a URL are never quoted back


@pytest.mark.parametrize("bad", ["", " " + CANARY, CANARY + "\n", CANARY[:10] + "é" + CANARY[10:]])
async def test_unusable_keys_are_refused_without_echoing_them(bad: str) -> None:
    async with make_http_client(httpx2.MockTransport(reply(200, message()))) as http:
        with pytest.raises(ValueError) as info:
            AnthropicClient(http, api_key=bad)
    assert CANARY not in str(info.value)
    assert CANARY[:10] not in str(info.value)


async def test_repr_of_the_client_hides_the_key() -> None:
    async with client_for(reply(200, message())) as client:
        assert CANARY not in repr(client)
        assert CANARY not in str(vars(client).get("_redact"))


async def test_per_request_timeout_replaces_the_read_timeout() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.extensions["timeout"])
        return httpx2.Response(200, json=message())

    await complete(
        handler, ProviderRequest(model="m", system="s", user="u", max_tokens=5, timeout_seconds=7.5)
    )
    await complete(handler)
    # waiting for a pooled connection is a local wait: no deadline
    assert seen[0] == {"connect": 10.0, "read": 7.5, "write": 30.0, "pool": None}
    assert seen[1]["read"] == 600.0


# --- success -------------------------------------------------------------------------------------


async def test_success_joins_text_blocks_and_records_telemetry() -> None:
    body = message(
        content=[
            {"type": "thinking", "thinking": "plan...", "signature": "sig"},
            {"type": "text", "text": "Hello, "},
            {"type": "text", "text": "world."},
        ]
    )
    body["usage"] = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 5,
        "cache_read_input_tokens": 100,
        "output_tokens": 7,
    }
    response = await complete(reply(200, body))
    assert response.text == "Hello, world."
    assert response.stop_reason == "end_turn"
    t = response.telemetry
    assert (t.http_status, t.provider_request_id, t.input_tokens, t.output_tokens) == (200, REQ_ID, 115, 7)
    assert t.latency_ms == pytest.approx(250.0)
    assert not t.possible_duplicate_call


async def test_stop_sequence_is_a_normal_stop() -> None:
    response = await complete(reply(200, message(stop_reason="stop_sequence")))
    assert response.text == "Done."


# --- HTTP errors ---------------------------------------------------------------------------------

HTTP_ERRORS = [
    (
        "bad-field",
        400,
        error_body("invalid_request_error", "max_tokens: Field required"),
        {},
        "invalid_request",
        False,
    ),
    (
        "prompt-too-long",
        400,
        error_body("invalid_request_error", "prompt is too long: 215000 tokens > 200000 maximum"),
        {},
        "context_length_exceeded",
        False,
    ),
    (
        "exceed-context-limit",
        400,
        error_body(
            "invalid_request_error",
            "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, "
            "decrease input length or `max_tokens` and try again",
        ),
        {},
        "context_length_exceeded",
        False,
    ),
    (
        "low-credit",
        400,
        error_body(
            "invalid_request_error",
            "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing.",
        ),
        {},
        "quota_exhausted",
        False,
    ),
    ("auth", 401, error_body("authentication_error", "invalid x-api-key"), {}, "auth", False),
    ("billing", 402, error_body("billing_error", "Payment required"), {}, "quota_exhausted", False),
    (
        "permission",
        403,
        error_body(
            "permission_error", "Your API key does not have permission to use the specified resource."
        ),
        {},
        "auth",
        False,
    ),
    ("not-found", 404, error_body("not_found_error", "model: claude-nope"), {}, "invalid_request", False),
    (
        "too-large",
        413,
        error_body("request_too_large", "Request exceeds the maximum allowed number of bytes."),
        {},
        "invalid_request",
        False,
    ),
    (
        "rate-limit",
        429,
        error_body("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
        {"retry-after": "7"},
        "rate_limited",
        True,
    ),
    (
        "spend-limit",
        429,
        error_body(
            "rate_limit_error",
            "You have reached your specified workspace API usage limits.",
            details={"error_code": "enforced_spend_limit_reached"},
        ),
        {},
        "quota_exhausted",
        False,
    ),
    ("api-error", 500, error_body("api_error", "Internal server error"), {}, "server_error", True),
    ("gateway-timeout", 504, error_body("timeout_error", "Request timed out"), {}, "timeout", True),
    ("overloaded", 529, error_body("overloaded_error", "Overloaded"), {}, "overloaded", True),
    ("request-timeout", 408, {"detail": "timeout"}, {}, "timeout", True),
    ("redirect", 301, None, {"location": "https://elsewhere.example/"}, "invalid_request", False),
]


@pytest.mark.parametrize(
    ("status", "body", "headers", "code", "retryable"),
    [case[1:] for case in HTTP_ERRORS],
    ids=[case[0] for case in HTTP_ERRORS],
)
async def test_http_errors_are_classified(
    status: int, body: Any, headers: dict[str, str], code: str, retryable: bool
) -> None:
    error = await failure(reply(status, body, headers))
    assert error.error.code == code
    assert error.error.retryable is retryable
    assert error.error.http_status == status
    assert error.telemetry.http_status == status
    assert error.error.provider_request_id == REQ_ID
    assert error.telemetry.latency_ms == pytest.approx(250.0)
    assert error.error.message.startswith("anthropic: ")
    if isinstance(body, dict) and "error" in body:
        assert body["error"]["message"][:30] in error.error.message


async def test_rate_limit_carries_retry_after() -> None:
    error = await failure(reply(429, error_body("rate_limit_error", "slow down"), {"retry-after": "7"}))
    assert error.error.retry_after_seconds == 7.0


async def test_retry_after_http_date_uses_the_injected_clock() -> None:
    headers = {"retry-after": "Sun, 29 Nov 2026 12:00:30 GMT"}
    error = await failure(reply(429, error_body("rate_limit_error", "slow down"), headers))
    assert error.error.retry_after_seconds == 30.0


async def test_gateway_timeout_may_have_billed_but_a_408_has_not() -> None:
    error = await failure(reply(504, error_body("timeout_error", "Request timed out")))
    assert error.telemetry.possible_duplicate_call
    error = await failure(reply(408, {"detail": "request timeout"}))
    assert error.error.code == "timeout"
    assert not error.telemetry.possible_duplicate_call


@pytest.mark.parametrize(
    ("status", "code"),
    [(503, "overloaded"), (502, "server_error"), (500, "server_error")],
)
async def test_non_json_error_pages_are_classified_by_status(status: int, code: str) -> None:
    page = "<html><head><title>503 Service Unavailable</title></head><body>nginx</body></html>"
    error = await failure(reply(status, text=page))
    assert error.error.code == code
    assert error.error.retryable
    assert "503 Service Unavailable" in error.error.message


async def test_error_object_inside_a_2xx_is_classified_by_type() -> None:
    error = await failure(reply(200, error_body("overloaded_error", "Overloaded")))
    assert (error.error.code, error.error.retryable, error.error.http_status) == ("overloaded", True, 200)


async def test_request_id_falls_back_to_the_body() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(529, json=error_body("overloaded_error", "Overloaded"))

    error = await failure(handler)
    assert error.error.provider_request_id == REQ_ID


@pytest.mark.parametrize(
    ("status", "etype", "hint", "retryable"),
    [
        (529, "overloaded_error", "false", False),
        (409, "invalid_request_error", "true", True),
        (401, "authentication_error", "true", False),  # a hint cannot make a bad key retryable
        (500, "api_error", "maybe", True),
    ],
)
async def test_x_should_retry_overrides_the_table(
    status: int, etype: str, hint: str, retryable: bool
) -> None:
    error = await failure(reply(status, error_body(etype, "x"), {"x-should-retry": hint}))
    assert error.error.retryable is retryable


# --- unusable 2xx content ------------------------------------------------------------------------

THINKING = {"type": "thinking", "thinking": "Let me think about this at length...", "signature": "EqQB"}

CONTENT_CASES = [
    ("refusal", message(content=[], stop_reason="refusal"), "content_filtered", False),
    (
        "context-window",
        message(content=[{"type": "text", "text": "partial"}], stop_reason="model_context_window_exceeded"),
        "context_length_exceeded",
        False,
    ),
    ("max-tokens-with-text", message(stop_reason="max_tokens"), "truncated", False),
    (
        "max-tokens-thinking-only",
        message(content=[THINKING], stop_reason="max_tokens"),
        "reasoning_only",
        False,
    ),
    ("thinking-only", message(content=[THINKING], stop_reason="end_turn"), "reasoning_only", False),
    (
        "redacted-thinking-only",
        message(content=[{"type": "redacted_thinking", "data": "abc"}]),
        "reasoning_only",
        False,
    ),
    ("empty", message(content=[], stop_reason="end_turn"), "empty_response", True),
    ("whitespace", message(content=[{"type": "text", "text": " \n "}]), "empty_response", True),
    ("pause-turn", message(stop_reason="pause_turn"), "truncated", False),
    ("no-content", {"id": "msg_1", "type": "message", "stop_reason": "end_turn"}, "malformed_response", True),
    ("content-not-list", message(content=None) | {"content": "Done."}, "malformed_response", True),
    ("text-block-without-text", message(content=[{"type": "text"}]), "malformed_response", True),
    ("block-not-object", message(content=["Done."]), "malformed_response", True),  # type: ignore[list-item]
    ("json-array", [1, 2, 3], "malformed_response", True),
]


@pytest.mark.parametrize(
    ("body", "code", "retryable"), [c[1:] for c in CONTENT_CASES], ids=[c[0] for c in CONTENT_CASES]
)
async def test_unusable_2xx_content_is_classified(body: Any, code: str, retryable: bool) -> None:
    error = await failure(reply(200, body))
    assert (error.error.code, error.error.retryable) == (code, retryable)
    assert error.error.http_status == 200
    assert error.error.provider_request_id == REQ_ID


async def test_truncation_keeps_usage_and_says_what_to_do() -> None:
    error = await failure(reply(200, message(stop_reason="max_tokens")))
    assert "max_tokens=256" in error.error.message
    assert (error.telemetry.input_tokens, error.telemetry.output_tokens) == (12, 34)


async def test_non_json_2xx_is_malformed() -> None:
    error = await failure(reply(200, text="<html>upstream hiccup</html>"))
    assert (error.error.code, error.error.retryable) == ("malformed_response", True)
    assert "upstream hiccup" in error.error.message


# --- transport failures --------------------------------------------------------------------------

TRANSPORT_CASES = [
    (httpx2.ConnectError, "transport_error", False),
    (httpx2.ConnectTimeout, "timeout", False),
    (httpx2.PoolTimeout, "timeout", False),
    (httpx2.WriteTimeout, "timeout", False),
    (httpx2.ReadTimeout, "timeout", True),
    (httpx2.ReadError, "transport_error", True),
    (httpx2.WriteError, "transport_error", False),
    (httpx2.RemoteProtocolError, "transport_error", True),
    (httpx2.ProxyError, "transport_error", False),
    (httpx2.LocalProtocolError, "invalid_request", False),
    (httpx2.UnsupportedProtocol, "invalid_request", False),
    (httpx2.DecodingError, "malformed_response", False),
]


@pytest.mark.parametrize(
    ("exc_type", "code", "duplicate"), TRANSPORT_CASES, ids=[c[0].__name__ for c in TRANSPORT_CASES]
)
async def test_transport_exceptions_are_mapped(
    exc_type: type[httpx2.HTTPError], code: str, duplicate: bool
) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        raise exc_type("boom [Errno 104] Connection reset by peer", request=request)  # type: ignore[call-arg]

    error = await failure(handler)
    assert error.error.code == code
    assert error.error.http_status is None
    assert error.telemetry.possible_duplicate_call is duplicate
    assert error.telemetry.latency_ms == pytest.approx(250.0)
    assert exc_type.__name__ in error.error.message
    assert isinstance(error.__cause__, exc_type)


async def test_the_call_is_cancellable() -> None:
    async def hang(request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    started = time.monotonic()
    with anyio.move_on_after(0.05) as scope:
        await complete(hang)
    assert scope.cancelled_caught
    assert time.monotonic() - started < 2.0


# --- secrets -------------------------------------------------------------------------------------


def leaky_scenarios() -> list[Handler]:
    """Every error path, several of them echoing the key back the way real servers and proxies do."""
    handlers: list[Handler] = [reply(s, b, h) for _, s, b, h, _, _ in HTTP_ERRORS]
    handlers += [reply(200, b) for _, b, _, _ in CONTENT_CASES]
    handlers += [
        reply(401, error_body("authentication_error", f"invalid x-api-key: {CANARY}")),
        reply(400, error_body("invalid_request_error", f"header x-api-key={CANARY} malformed")),
        reply(502, text=f"<html>bad gateway; upstream said Authorization: Bearer {CANARY}</html>"),
        reply(200, text=f"x-api-key: {CANARY}"),
        reply(200, error_body("api_error", f"echo {CANARY}{CANARY}")),
    ]

    def raiser(exc_type: type[httpx2.HTTPError]) -> Handler:
        def handler(request: httpx2.Request) -> httpx2.Response:
            raise exc_type(f"failed with key {CANARY}", request=request)  # type: ignore[call-arg]

        return handler

    handlers += [raiser(exc_type) for exc_type, _, _ in TRANSPORT_CASES]
    return handlers


async def test_the_key_never_appears_in_errors_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    scenarios = leaky_scenarios()
    assert len(scenarios) > 40
    for handler in scenarios:
        error = await failure(handler)
        for text in (
            str(error),
            repr(error),
            error.error.model_dump_json(),
            error.telemetry.model_dump_json(),
            repr(error.error),
        ):
            assert CANARY not in text
            assert CANARY[13:30] not in text  # not even a fragment of the secret part
    assert caplog.records, "the adapter logs every attempt"
    assert CANARY not in caplog.text
    assert all(getattr(r, "action", None) for r in caplog.records if r.name == "construct.provider")


async def test_a_key_echoed_in_an_error_message_is_redacted() -> None:
    error = await failure(reply(401, error_body("authentication_error", f"invalid x-api-key: {CANARY}")))
    assert "[redacted]" in error.error.message
    assert error.error.message.startswith("anthropic: HTTP 401 authentication_error: invalid x-api-key")


async def test_a_success_logs_no_prompt(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await complete(reply(200, message()))
    assert REQUEST.user not in caplog.text
    assert REQUEST.system not in caplog.text
    [record] = [r for r in caplog.records if r.name == "construct.provider"]
    assert record.action == "provider.call_succeeded"  # type: ignore[attr-defined]

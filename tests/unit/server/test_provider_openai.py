"""The OpenAI-compatible adapter against ``httpx2.MockTransport``: request shape for OpenAI,
OpenRouter and local servers, every taxonomy code from a realistic response (OpenRouter's
200-with-error included), and that the key never leaks."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest

from orchestration.core.clock import ManualClock
from orchestration.errors import ConfigError
from orchestration.workers.model_calls import (
    ProviderCallError,
    ProviderRequest,
    ProviderResponse,
    make_http_client,
)
from orchestration.workers.openai_compat import OpenAICompatClient
from orchestration.workers.provider_worker import ProviderWorker
from server.app import ConstructApp
from server.cli import main as cli
from server.cli.grammar import EXIT_USAGE
from server.settings.config import load_settings
from server.settings.providers import provider_settings

CANARY = "sk-or-v1-" + secrets.token_hex(32)
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
REQUEST = ProviderRequest(
    model="openai/gpt-5-mini", system="You review code.", user="Review it.", max_tokens=512
)
REQ_ID = "req_8c1f2e3d4b5a69788796a5b4c3d2e1f0"

Handler = (
    Callable[[httpx2.Request], httpx2.Response]
    | Callable[[httpx2.Request], Coroutine[None, None, httpx2.Response]]
)


@asynccontextmanager
async def client_for(handler: Handler, **kwargs: Any) -> AsyncIterator[OpenAICompatClient]:
    kwargs.setdefault("api_key", CANARY)
    kwargs.setdefault("base_url", "https://api.openai.com")
    async with make_http_client(httpx2.MockTransport(handler)) as http:
        yield OpenAICompatClient(http, clock=ManualClock(NOW), **kwargs)


async def complete(handler: Handler, request: ProviderRequest = REQUEST, **kwargs: Any) -> ProviderResponse:
    async with client_for(handler, **kwargs) as client:
        return await client.complete(request)


async def failure(handler: Handler, request: ProviderRequest = REQUEST, **kwargs: Any) -> ProviderCallError:
    with pytest.raises(ProviderCallError) as info:
        await complete(handler, request, **kwargs)
    return info.value


def completion(
    content: Any = "Looks good.",
    finish_reason: str | None = "stop",
    **message_extra: Any,
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion",
        "created": 1764417600,
        "model": "gpt-5-mini-2025-08-07",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None, **message_extra},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30},
    }


def reply(
    status: int, body: Any = None, headers: dict[str, str] | None = None, text: str | None = None
) -> Handler:
    def handler(request: httpx2.Request) -> httpx2.Response:
        merged = {"x-request-id": REQ_ID, **(headers or {})}
        if text is not None:
            return httpx2.Response(status, text=text, headers=merged)
        return httpx2.Response(status, json=body, headers=merged)

    return handler


def oai_error(msg: str, etype: str | None, code: Any = None, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": msg, "type": etype, "param": None, "code": code, **extra}}


def capture(seen: list[httpx2.Request]) -> Handler:
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json=completion())

    return handler


# --- request shape -------------------------------------------------------------------------------


async def test_request_shape_openai() -> None:
    seen: list[httpx2.Request] = []
    await complete(capture(seen))
    [request] = seen
    assert request.method == "POST"
    assert str(request.url) == "https://api.openai.com/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {CANARY}"
    assert request.headers["content-type"] == "application/json"
    assert "x-api-key" not in request.headers
    assert json.loads(request.content) == {
        "model": "openai/gpt-5-mini",
        "messages": [
            {"role": "system", "content": "You review code."},
            {"role": "user", "content": "Review it."},
        ],
        "max_completion_tokens": 512,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def test_openrouter_is_the_default_base_and_takes_attribution_headers() -> None:
    seen: list[httpx2.Request] = []
    async with make_http_client(httpx2.MockTransport(capture(seen))) as http:
        client = OpenAICompatClient(
            http,
            api_key=CANARY,
            extra_headers={"HTTP-Referer": "https://construct.example", "X-Title": "construct-mcp"},
        )
        assert client.provider == "openrouter"
        await client.complete(REQUEST)
    [request] = seen
    assert str(request.url) == "https://openrouter.ai/api/v1/chat/completions"
    assert request.headers["http-referer"] == "https://construct.example"
    assert request.headers["x-title"] == "construct-mcp"
    assert request.headers["authorization"] == f"Bearer {CANARY}"


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("https://api.openai.com", "https://api.openai.com/v1/chat/completions"),
        ("https://api.openai.com/v1/", "https://api.openai.com/v1/chat/completions"),
        ("https://openrouter.ai/api/v1", "https://openrouter.ai/api/v1/chat/completions"),
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1/chat/completions"),
        ("http://localhost:11434/v1", "http://localhost:11434/v1/chat/completions"),
    ],
)
async def test_base_url_convention(base: str, url: str) -> None:
    seen: list[httpx2.Request] = []
    await complete(capture(seen), base_url=base)
    assert str(seen[0].url) == url


async def test_local_server_without_key_sends_no_auth_and_old_max_tokens_field() -> None:
    seen: list[httpx2.Request] = []
    await complete(
        capture(seen),
        ProviderRequest(model="smollm2", system="", user="hi", max_tokens=8, temperature=0.0),
        api_key=None,
        base_url="http://127.0.0.1:8080",
        max_tokens_field="max_tokens",
    )
    [request] = seen
    assert "authorization" not in request.headers
    assert json.loads(request.content) == {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def test_extra_headers_cannot_replace_the_auth_header() -> None:
    seen: list[httpx2.Request] = []
    await complete(capture(seen), extra_headers={"Authorization": "Bearer other"})
    assert seen[0].headers.get_list("authorization") == [f"Bearer {CANARY}"]


# --- the output limit travels in the one field the endpoint reads --------------------------------

LIMIT_FIELDS = {"max_tokens", "max_completion_tokens"}


def limit_fields(request: httpx2.Request) -> dict[str, Any]:
    """The output-limit fields of a request body (exactly one must be there)."""
    body = json.loads(request.content)
    return {k: v for k, v in body.items() if k in LIMIT_FIELDS}


@pytest.mark.parametrize(
    ("base", "field"),
    [
        ("https://api.openai.com", "max_completion_tokens"),
        ("https://API.OpenAI.com/v1/", "max_completion_tokens"),
        ("https://openrouter.ai/api/v1", "max_tokens"),
        ("http://127.0.0.1:8080", "max_tokens"),  # llama.cpp ignores max_completion_tokens
        ("http://localhost:11434/v1", "max_tokens"),  # Ollama
        ("http://gpu-box.internal:8000", "max_tokens"),  # vLLM
        ("https://api.openai.com.example.net", "max_tokens"),  # not OpenAI's host
    ],
)
async def test_the_default_limit_field_follows_the_base_url(base: str, field: str) -> None:
    seen: list[httpx2.Request] = []
    async with client_for(capture(seen), base_url=base) as client:
        assert client.max_tokens_field == field
        await client.complete(REQUEST)
    assert limit_fields(seen[0]) == {field: 512}


@pytest.mark.parametrize(
    ("base", "field"),
    [
        ("https://api.openai.com", "max_tokens"),
        ("http://127.0.0.1:8080", "max_completion_tokens"),
        ("https://openrouter.ai/api", "max_completion_tokens"),
    ],
)
async def test_an_explicit_limit_field_beats_the_default(base: str, field: str) -> None:
    seen: list[httpx2.Request] = []
    await complete(capture(seen), base_url=base, max_tokens_field=field)
    assert limit_fields(seen[0]) == {field: 512}


async def test_an_unknown_limit_field_is_refused() -> None:
    async with make_http_client(httpx2.MockTransport(capture([]))) as http:
        with pytest.raises(
            ValueError, match="'max_output_tokens' is not one of: max_completion_tokens, max_tokens"
        ):
            OpenAICompatClient(http, max_tokens_field="max_output_tokens")  # type: ignore[arg-type]


async def provider_body(
    home: Path, provider: str, env: dict[str, str], config: str | None = None
) -> httpx2.Request:
    """The request the provider backend sends for ``provider``, configured like a server would be:
    ``env`` (and a ``construct.toml`` with ``config``) through load_settings and provider_settings."""
    if config is not None:
        (home / "construct.toml").write_text(config, "utf-8")
    settings = load_settings(env=env, home=home)
    seen: list[httpx2.Request] = []
    async with make_http_client(httpx2.MockTransport(capture(seen))) as http:
        worker = ProviderWorker(provider_settings(settings), http)
        await worker.client(provider).complete(REQUEST)
    [request] = seen
    return request


async def test_the_server_sends_max_tokens_to_a_local_openai_compatible_server(tmp_path: Path) -> None:
    # The bug: CONSTRUCT_MAX_TOKENS was ignored by llama.cpp, which reads max_tokens only.
    request = await provider_body(
        tmp_path, "openai", {"CONSTRUCT_OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"}
    )
    assert str(request.url) == "http://127.0.0.1:8080/v1/chat/completions"
    assert limit_fields(request) == {"max_tokens": 512}


async def test_the_server_defaults_for_openai_and_openrouter(tmp_path: Path) -> None:
    env = {"OPENAI_API_KEY": CANARY, "OPENROUTER_API_KEY": CANARY}
    assert limit_fields(await provider_body(tmp_path, "openai", env)) == {"max_completion_tokens": 512}
    assert limit_fields(await provider_body(tmp_path, "openrouter", env)) == {"max_tokens": 512}


async def test_the_environment_chooses_the_openai_limit_field(tmp_path: Path) -> None:
    env = {
        "OPENAI_API_KEY": CANARY,
        "CONSTRUCT_OPENAI_BASE_URL": "http://127.0.0.1:8000",
        "CONSTRUCT_OPENAI_MAX_TOKENS_FIELD": "max_completion_tokens",
    }
    assert limit_fields(await provider_body(tmp_path, "openai", env)) == {"max_completion_tokens": 512}
    env = {"OPENAI_API_KEY": CANARY, "CONSTRUCT_OPENAI_MAX_TOKENS_FIELD": "max_tokens"}
    assert limit_fields(await provider_body(tmp_path, "openai", env)) == {"max_tokens": 512}


async def test_a_provider_table_chooses_its_limit_field(tmp_path: Path) -> None:
    config = (
        '[providers.openrouter]\nmax_tokens_field = "max_completion_tokens"\n'
        '[providers.openai]\nbase_url = "http://127.0.0.1:8080"\nmax_tokens_field = "max_completion_tokens"\n'
    )
    # The table beats the environment, like every other setting of the file.
    env = {"OPENROUTER_API_KEY": CANARY, "CONSTRUCT_OPENAI_MAX_TOKENS_FIELD": "max_tokens"}
    for provider in ("openrouter", "openai"):
        request = await provider_body(tmp_path, provider, env, config)
        assert limit_fields(request) == {"max_completion_tokens": 512}


def test_a_bad_limit_field_in_the_environment_is_a_startup_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"CONSTRUCT_OPENAI_MAX_TOKENS_FIELD": "max_output_tokens"})
    assert (caught.value.file, caught.value.field) == ("environment", "CONSTRUCT_OPENAI_MAX_TOKENS_FIELD")
    assert "'max_completion_tokens' or 'max_tokens'" in caught.value.problem


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        (
            '[providers.openai]\nmax_tokens_field = "max_token"\n',
            "providers.openai.max_tokens_field",
            "'max_tokens'",
        ),
        (
            '[providers.anthropic]\nmax_tokens_field = "max_tokens"\n',
            "providers",
            "applies to openai and openrouter",
        ),
        ('openai_max_tokens_field = "max_tokens"\n', "openai_max_tokens_field", "[providers.openai]"),
    ],
)
def test_a_bad_limit_field_in_the_config_file_is_a_startup_error(
    tmp_path: Path, text: str, field: str, problem: str
) -> None:
    (tmp_path / "construct.toml").write_text(text, "utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(env={}, home=tmp_path)
    assert (caught.value.file, caught.value.field) == (str(tmp_path / "construct.toml"), field)
    assert problem in caught.value.problem


def test_the_cli_refuses_to_start_with_a_bad_limit_field(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONSTRUCT_HOME", str(tmp_path))
    monkeypatch.setenv("CONSTRUCT_OPENAI_MAX_TOKENS_FIELD", "both")
    # Were the value accepted, the server would start and serve: return at once instead of hanging.
    monkeypatch.setattr(ConstructApp, "serve", lambda *args: None)
    assert cli.run(["serve", "--transport", "streamable-http"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "configuration error: environment: CONSTRUCT_OPENAI_MAX_TOKENS_FIELD:" in err


# --- success -------------------------------------------------------------------------------------


async def test_success_and_telemetry() -> None:
    response = await complete(reply(200, completion()))
    assert response.text == "Looks good."
    assert response.stop_reason == "stop"
    t = response.telemetry
    assert (t.http_status, t.provider_request_id, t.input_tokens, t.output_tokens) == (200, REQ_ID, 21, 9)
    assert t.latency_ms is not None and t.latency_ms >= 0


async def test_content_as_a_list_of_parts() -> None:
    parts = [{"type": "text", "text": "Looks "}, {"type": "image_url"}, {"type": "text", "text": "good."}]
    assert (await complete(reply(200, completion(content=parts)))).text == "Looks good."


async def test_text_with_reasoning_is_a_success() -> None:
    response = await complete(reply(200, completion(reasoning="First, check the tests.")))
    assert response.text == "Looks good."


@pytest.mark.parametrize(
    ("headers", "body_id", "expected"),
    [
        ({"x-request-id": "req_a"}, "chatcmpl-1", "req_a"),
        ({"X-Generation-Id": "gen-1764417600-abc"}, "gen-1764417600-abc", "gen-1764417600-abc"),
        ({}, "gen-1764417600-xyz", "gen-1764417600-xyz"),
    ],
)
async def test_request_ids(headers: dict[str, str], body_id: str, expected: str) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json=completion() | {"id": body_id}, headers=headers)

    response = await complete(handler)
    assert response.telemetry.provider_request_id == expected


# --- HTTP errors ---------------------------------------------------------------------------------

OPENROUTER_MODERATION = {
    "error": {
        "code": 403,
        "message": "openai/gpt-5-mini requires moderation on OpenAI. Your input was flagged for "
        "'violence'. No credits were charged.",
        "metadata": {
            "reasons": ["violence"],
            "flagged_input": "the user's prompt would be here",
            "provider_name": "OpenAI",
            "model_slug": "openai/gpt-5-mini",
        },
    }
}

HTTP_ERRORS = [
    (
        "rate-limit",
        429,
        oai_error(
            "Rate limit reached for gpt-5-mini in organization org-abc on tokens per min (TPM): "
            "Limit 30000, Used 29000, Requested 2000. Please try again in 2s.",
            "tokens",
            "rate_limit_exceeded",
        ),
        {"retry-after": "2", "x-ratelimit-remaining-tokens": "0"},
        "rate_limited",
        True,
    ),
    (
        "insufficient-quota",
        429,
        oai_error(
            "You exceeded your current quota, please check your plan and billing details.",
            "insufficient_quota",
            "insufficient_quota",
        ),
        {},
        "quota_exhausted",
        False,
    ),
    (
        "spend-limit",
        429,
        oai_error("Organization spend limit reached.", "requests", "organization_spend_limit_exceeded"),
        {},
        "quota_exhausted",
        False,
    ),
    (
        "credit-balance",
        429,
        oai_error("Credit balance exhausted.", "insufficient_quota", "credit_balance_exhausted"),
        {},
        "quota_exhausted",
        False,
    ),
    (
        "openrouter-credits",
        402,
        {
            "error": {
                "code": 402,
                "message": "Insufficient credits. Add more using https://openrouter.ai/credits",
            }
        },
        {},
        "quota_exhausted",
        False,
    ),
    (
        "context-length",
        400,
        oai_error(
            "This model's maximum context length is 128000 tokens. However, your messages resulted in "
            "130512 tokens. Please reduce the length of the messages.",
            "invalid_request_error",
            "context_length_exceeded",
            param="messages",
        ),
        {},
        "context_length_exceeded",
        False,
    ),
    (
        "vllm-flat-context",
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 4096 tokens. "
            "However, you requested 5000 tokens.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        {},
        "context_length_exceeded",
        False,
    ),
    (
        "llamacpp-context",
        400,
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 9000,
                "n_ctx": 8192,
            }
        },
        {},
        "context_length_exceeded",
        False,
    ),
    (
        "bad-param",
        400,
        oai_error("Unrecognized request argument supplied: foo", "invalid_request_error"),
        {},
        "invalid_request",
        False,
    ),
    (
        "auth",
        401,
        oai_error(
            "Incorrect API key provided: sk-proj-****abcd.", "invalid_request_error", "invalid_api_key"
        ),
        {},
        "auth",
        False,
    ),
    ("moderation", 403, OPENROUTER_MODERATION, {}, "content_filtered", False),
    (
        "region",
        403,
        oai_error("Country, region, or territory not supported", "request_forbidden", "unsupported_country"),
        {},
        "auth",
        False,
    ),
    (
        "model-not-found",
        404,
        oai_error("The model `gpt-9` does not exist", "invalid_request_error", "model_not_found"),
        {},
        "invalid_request",
        False,
    ),
    ("unprocessable", 422, {"detail": [{"msg": "field required"}]}, {}, "invalid_request", False),
    ("request-timeout", 408, oai_error("Request timed out.", "timeout"), {}, "timeout", True),
    (
        "server-error",
        500,
        oai_error("The server had an error while processing your request. Sorry about that!", "server_error"),
        {},
        "server_error",
        True,
    ),
    (
        "model-down",
        502,
        {"error": {"code": 502, "message": "Provider returned error"}},
        {},
        "server_error",
        True,
    ),
    (
        "no-provider",
        503,
        {"error": {"code": 503, "message": "No endpoints found that can handle the request."}},
        {"retry-after": "5"},
        "overloaded",
        True,
    ),
    ("gateway-timeout", 504, None, {}, "timeout", True),
    ("azure-filter", 400, oai_error("filtered", None, "content_filter"), {}, "content_filtered", False),
    ("string-error", 500, {"error": "upstream exploded"}, {}, "server_error", True),
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
    assert (error.error.code, error.error.retryable) == (code, retryable)
    assert error.error.http_status == status == error.telemetry.http_status
    assert error.error.provider_request_id == REQ_ID
    assert error.error.message.startswith("openai: HTTP ")


async def test_moderation_never_copies_the_flagged_input() -> None:
    error = await failure(reply(403, OPENROUTER_MODERATION))
    assert "flagged" in error.error.message
    assert "the user's prompt would be here" not in error.error.message


async def test_retry_after_ms_wins_over_retry_after() -> None:
    body = oai_error("slow down", "requests", "rate_limit_exceeded")
    error = await failure(reply(429, body, {"retry-after-ms": "250", "retry-after": "9"}))
    assert error.error.retry_after_seconds == 0.25


async def test_retry_after_on_503() -> None:
    error = await failure(reply(503, {"error": {"code": 503, "message": "busy"}}, {"retry-after": "5"}))
    assert (error.error.code, error.error.retry_after_seconds) == ("overloaded", 5.0)


async def test_x_should_retry_false_stops_a_rate_limit() -> None:
    body = oai_error("slow down", "requests", "rate_limit_exceeded")
    error = await failure(reply(429, body, {"x-should-retry": "false"}))
    assert (error.error.code, error.error.retryable) == ("rate_limited", False)


# --- OpenRouter 200-with-error and unusable content ----------------------------------------------


@pytest.mark.parametrize(
    ("in_body_code", "code", "retryable"),
    [
        (429, "rate_limited", True),
        (502, "server_error", True),
        (500, "server_error", True),
        (400, "server_error", True),
        (None, "server_error", True),
        (503, "overloaded", True),
        (402, "quota_exhausted", False),
        ("insufficient_quota", "quota_exhausted", False),
    ],
)
async def test_openrouter_200_with_error(in_body_code: Any, code: str, retryable: bool) -> None:
    body = {"error": {"code": in_body_code, "message": "Upstream error from Together: connection lost"}}
    error = await failure(
        reply(200, body, {"x-generation-id": "gen-1"}, text=None), base_url="https://openrouter.ai/api"
    )
    assert (error.error.code, error.error.retryable, error.error.http_status) == (code, retryable, 200)
    assert "Upstream error from Together" in error.error.message
    assert error.error.message.startswith("openrouter: ")


CONTENT_CASES = [
    ("refusal", completion(content=None), "refusal", "content_filtered", False),
    (
        "content-filter",
        completion(content=None, finish_reason="content_filter"),
        None,
        "content_filtered",
        False,
    ),
    ("length-with-text", completion(finish_reason="length"), None, "truncated", False),
    ("length-no-text", completion(content="", finish_reason="length"), None, "truncated", False),
    (
        "openrouter-reasoning-only",
        completion(content="", finish_reason="length", reasoning="Thinking step by step..."),
        None,
        "reasoning_only",
        False,
    ),
    (
        "vllm-reasoning-only",
        completion(content=None, finish_reason="stop", reasoning_content="<think>hmm</think>"),
        None,
        "reasoning_only",
        False,
    ),
    (
        "reasoning-details-only",
        completion(content=None, reasoning_details=[{"type": "reasoning.encrypted", "data": "x"}]),
        None,
        "reasoning_only",
        False,
    ),
    ("empty", completion(content=""), None, "empty_response", True),
    ("null-content", completion(content=None), None, "empty_response", True),
    ("finish-error", completion(content="partial", finish_reason="error"), None, "server_error", True),
    ("no-choices", {"id": "chatcmpl-1", "object": "chat.completion"}, None, "malformed_response", True),
    ("empty-choices", {"id": "chatcmpl-1", "choices": []}, None, "malformed_response", True),
    (
        "choice-without-message",
        {"choices": [{"index": 0, "finish_reason": "stop"}]},
        None,
        "malformed_response",
        True,
    ),
    ("content-number", completion(content=42), None, "malformed_response", True),
    ("json-string", "ok", None, "malformed_response", True),
]


@pytest.mark.parametrize(
    ("body", "refusal", "code", "retryable"),
    [c[1:] for c in CONTENT_CASES],
    ids=[c[0] for c in CONTENT_CASES],
)
async def test_unusable_2xx_content_is_classified(
    body: Any, refusal: str | None, code: str, retryable: bool
) -> None:
    if refusal is not None:
        body = json.loads(json.dumps(body))
        body["choices"][0]["message"]["refusal"] = "I'm sorry, but I can't help with that."
    error = await failure(reply(200, body))
    assert (error.error.code, error.error.retryable, error.error.http_status) == (code, retryable, 200)


async def test_refusal_message_is_kept() -> None:
    body = completion(content=None)
    body["choices"][0]["message"]["refusal"] = "I can't help with that."
    error = await failure(reply(200, body))
    assert "I can't help with that." in error.error.message


async def test_non_json_2xx_is_malformed() -> None:
    error = await failure(reply(200, text="data: {not json"))
    assert (error.error.code, error.error.retryable) == ("malformed_response", True)


async def test_truncated_keeps_usage() -> None:
    error = await failure(reply(200, completion(finish_reason="length")))
    assert (error.telemetry.input_tokens, error.telemetry.output_tokens) == (21, 9)
    assert "512 tokens" in error.error.message


async def test_transport_errors_use_the_shared_mapping() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ReadTimeout("timed out", request=request)

    error = await failure(handler)
    assert (error.error.code, error.error.retryable) == ("timeout", True)
    assert error.telemetry.possible_duplicate_call


# --- secrets -------------------------------------------------------------------------------------


async def test_the_key_never_appears_in_errors_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    handlers: list[Handler] = [reply(s, b, h) for _, s, b, h, _, _ in HTTP_ERRORS]
    handlers += [reply(200, b) for _, b, _, _, _ in CONTENT_CASES]
    handlers += [
        reply(
            401,
            oai_error(f"Incorrect API key provided: {CANARY}.", "invalid_request_error", "invalid_api_key"),
        ),
        reply(200, {"error": {"code": 500, "message": f"upstream rejected Bearer {CANARY}"}}),
        reply(400, {"error": f"bad header api_key={CANARY}"}),
        reply(502, text=f"proxy error for key {CANARY}"),
    ]

    def raiser(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError(f"refused {CANARY}", request=request)

    handlers.append(raiser)
    secret_header = "gw-" + secrets.token_hex(16)
    for handler in handlers:
        error = await failure(handler, extra_headers={"X-Gateway-Key": secret_header})
        for text in (
            str(error),
            repr(error),
            error.error.model_dump_json(),
            error.telemetry.model_dump_json(),
        ):
            assert CANARY not in text
            assert CANARY[9:30] not in text
            assert secret_header not in text
    assert CANARY not in caplog.text
    assert secret_header not in caplog.text


async def test_a_gateway_key_in_extra_headers_is_redacted_too() -> None:
    secret_header = "gw-" + secrets.token_hex(16)
    body = {"error": {"message": f"unknown key {secret_header}"}}
    error = await failure(reply(401, body), extra_headers={"X-Gateway-Key": secret_header})
    assert secret_header not in error.error.message
    assert "[redacted]" in error.error.message

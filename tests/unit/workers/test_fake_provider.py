"""The fake provider over real HTTP, driven by the real adapters: scripted successes and failures,
per-task counting, connection resets, slow answers, runtime scenario changes, and the process mode."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from orchestration.workers.anthropic import AnthropicClient
from orchestration.workers.model_calls import (
    ProviderCallError,
    ProviderClient,
    ProviderRequest,
)
from orchestration.workers.openai_compat import OpenAICompatClient
from tests.fakes.fake_provider import FakeProvider

ROOT = Path(__file__).resolve().parents[3]
KEY = "sk-test-fake-provider-key"


def request(
    task: str | None = None, *, where: str = "system", timeout: float | None = None
) -> ProviderRequest:
    marker = f"[task:{task}] " if task else ""
    system = (marker if where == "system" else "") + "You are a careful engineer."
    user = (marker if where == "user" else "") + "Do the thing."
    return ProviderRequest(
        model="fake-model", system=system, user=user, max_tokens=64, timeout_seconds=timeout
    )


def anthropic(http: httpx2.AsyncClient, fake: FakeProvider, *, stream: bool = True) -> AnthropicClient:
    return AnthropicClient(http, api_key=KEY, base_url=fake.base_url, stream=stream)


def openai(
    http: httpx2.AsyncClient, fake: FakeProvider, *, openrouter: bool = False, stream: bool = True
) -> OpenAICompatClient:
    base = f"{fake.base_url}/api" if openrouter else fake.base_url
    return OpenAICompatClient(http, api_key=KEY, base_url=base, stream=stream)


DIALECTS = ["anthropic", "openai", "openrouter"]


def client_for(
    dialect: str, http: httpx2.AsyncClient, fake: FakeProvider, *, stream: bool = True
) -> ProviderClient:
    if dialect == "anthropic":
        return anthropic(http, fake, stream=stream)
    return openai(http, fake, openrouter=dialect == "openrouter", stream=stream)


async def fails(client: ProviderClient, req: ProviderRequest) -> ProviderCallError:
    with pytest.raises(ProviderCallError) as info:
        await client.complete(req)
    return info.value


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_success(dialect: str, fake: FakeProvider, http: httpx2.AsyncClient) -> None:
    fake.set_scenario({"default": [{"text": "hello from the fake"}]})
    response = await client_for(dialect, http, fake).complete(request())
    assert response.text == "hello from the fake"
    assert response.telemetry.http_status == 200
    assert (response.telemetry.input_tokens, response.telemetry.output_tokens) == (11, 7)
    expected_prefix = {"anthropic": "req_fake", "openai": "req_fake", "openrouter": "gen-fake-"}[dialect]
    assert (response.telemetry.provider_request_id or "").startswith(expected_prefix)
    assert fake.calls() == {"default": 1}


async def test_task_keys_route_to_their_scripts(fake: FakeProvider, http: httpx2.AsyncClient) -> None:
    fake.set_scenario(
        {
            "engineer": [{"text": "patch"}],
            "reviewer": [{"text": "approved"}],
            "default": [{"text": "generic"}],
        }
    )
    client = anthropic(http, fake)
    assert (await client.complete(request("engineer"))).text == "patch"
    assert (await client.complete(request("reviewer", where="user"))).text == "approved"
    assert (await client.complete(request())).text == "generic"
    assert (await client.complete(request("architect"))).text == "generic"  # no script: the default one
    assert fake.calls() == {"engineer": 1, "reviewer": 1, "default": 1, "architect": 1}


async def test_rate_limited_then_success_is_counted(fake: FakeProvider, http: httpx2.AsyncClient) -> None:
    fake.set_scenario({"engineer": [{"error": "rate_limited", "retry_after": 2}, {"text": "done"}]})
    client = openai(http, fake)
    error = await fails(client, request("engineer"))
    assert (error.error.code, error.error.retryable, error.error.retry_after_seconds) == (
        "rate_limited",
        True,
        2.0,
    )
    assert error.error.http_status == 429
    assert (await client.complete(request("engineer"))).text == "done"
    assert (await client.complete(request("engineer"))).text == "done"  # the last reply repeats
    assert fake.calls_for("engineer") == 3
    response = await http.get(f"{fake.base_url}/_calls")
    assert response.json() == {"engineer": 3}


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_reset_is_a_transport_error(dialect: str, fake: FakeProvider, http: httpx2.AsyncClient) -> None:
    fake.set_scenario({"default": [{"reset": True}, {"text": "back"}]})
    client = client_for(dialect, http, fake)
    error = await fails(client, request())
    assert (error.error.code, error.error.retryable, error.error.http_status) == (
        "transport_error",
        True,
        None,
    )
    assert error.telemetry.possible_duplicate_call
    assert (await client.complete(request())).text == "back"  # the pool recovers from the dead socket


async def test_slow_answer_times_out_on_a_short_client_timeout(
    fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    fake.set_scenario({"default": [{"delay_seconds": 5, "text": "too late"}, {"text": "prompt"}]})
    client = anthropic(http, fake)
    started = time.monotonic()
    error = await fails(client, request(timeout=0.2))
    assert time.monotonic() - started < 3.0
    assert (error.error.code, error.error.retryable) == ("timeout", True)
    assert error.telemetry.possible_duplicate_call
    assert (await client.complete(request(timeout=2.0))).text == "prompt"


async def test_slow_answer_within_the_timeout_succeeds(fake: FakeProvider, http: httpx2.AsyncClient) -> None:
    fake.set_scenario({"default": [{"delay_seconds": 0.3, "text": "worth the wait"}]})
    response = await openai(http, fake).complete(request(timeout=5.0))
    assert response.text == "worth the wait"
    assert (response.telemetry.latency_ms or 0) >= 300


async def test_auth_headers_and_bodies_are_recorded(fake: FakeProvider, http: httpx2.AsyncClient) -> None:
    await anthropic(http, fake).complete(request("engineer"))
    await openai(http, fake).complete(request("reviewer"))
    seen = fake.requests()
    assert [r["path"] for r in seen] == ["/v1/messages", "/v1/chat/completions"]
    assert seen[0]["headers"]["x-api-key"] == KEY
    assert seen[0]["headers"]["anthropic-version"] == "2023-06-01"
    assert seen[1]["headers"]["authorization"] == f"Bearer {KEY}"
    assert seen[0]["body"]["system"].startswith("[task:engineer]")
    assert seen[1]["body"]["max_tokens"] == 64  # a local server: the field llama.cpp reads
    over_http = (await http.get(f"{fake.base_url}/_requests")).json()
    assert [r["task"] for r in over_http] == ["engineer", "reviewer"]


async def test_scenario_replaced_at_runtime_over_http(fake: FakeProvider, http: httpx2.AsyncClient) -> None:
    client = anthropic(http, fake)
    await client.complete(request("engineer"))
    reply = await http.post(f"{fake.base_url}/_scenario", json={"engineer": [{"error": "overloaded"}]})
    assert reply.json() == {"ok": True}
    assert fake.calls() == {}
    error = await fails(client, request("engineer"))
    assert (error.error.code, error.error.http_status) == ("overloaded", 529)
    await http.post(f"{fake.base_url}/_reset")
    assert fake.calls() == {} and fake.requests() == []


async def test_openrouter_200_with_error_in_body(fake: FakeProvider, http: httpx2.AsyncClient) -> None:
    fake.set_scenario(
        {"default": [{"error": "error_in_body", "in_body_code": 429}, {"error": "error_in_body"}]}
    )
    client = openai(http, fake, openrouter=True)
    first = await fails(client, request())
    assert (first.error.code, first.error.http_status) == ("rate_limited", 200)
    assert (first.error.provider_request_id or "").startswith("gen-fake-")
    second = await fails(client, request())
    assert second.error.code == "server_error"


async def test_overrides_status_headers_and_raw_body(fake: FakeProvider, http: httpx2.AsyncClient) -> None:
    fake.set_scenario(
        {
            "default": [
                {"error": "server_error", "should_retry": False},
                {"status": 503, "raw": "upstream connect error", "retry_after_ms": 1500},
            ]
        }
    )
    client = anthropic(http, fake)
    first = await fails(client, request())
    assert (first.error.code, first.error.retryable) == ("server_error", False)
    second = await fails(client, request())
    assert (second.error.code, second.error.retry_after_seconds) == ("overloaded", 1.5)
    assert "upstream connect error" in second.error.message


EXPECTED = {
    "rate_limited": "rate_limited",
    "quota_exhausted": "quota_exhausted",
    "billing": "quota_exhausted",
    "overloaded": "overloaded",
    "server_error": "server_error",
    "bad_gateway": "server_error",
    "timeout": "timeout",
    "auth": "auth",
    "permission": "auth",
    "invalid_request": "invalid_request",
    "not_found": "invalid_request",
    "context_length_exceeded": "context_length_exceeded",
    "content_filtered": "content_filtered",
    "refusal": "content_filtered",
    "moderation": "content_filtered",
    "truncated": "truncated",
    "reasoning_only": "reasoning_only",
    "empty_response": "empty_response",
    "malformed_response": "malformed_response",
    "missing_content": "malformed_response",
    "finish_error": "server_error",
}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_every_scripted_error_classifies_as_documented(
    dialect: str, stream: bool, fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    """Streamed (each 2xx answer as events: the error event, the stop reasons, a malformed
    message) or plain, an answer classifies the same."""
    from tests.fakes.fake_provider import ERRORS

    expected = dict(EXPECTED, error_in_body="overloaded" if dialect == "anthropic" else "server_error")
    assert set(expected) == set(ERRORS)
    fake.set_scenario({kind: [{"error": kind}] for kind in expected})
    client = client_for(dialect, http, fake, stream=stream)
    got = {kind: (await fails(client, request(kind))).error.code for kind in expected}
    assert got == expected


async def test_runs_as_a_separate_process(tmp_path: Path, http: httpx2.AsyncClient) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"engineer": [{"error": "overloaded"}, {"text": "from a process"}]}))
    command = [
        sys.executable,
        "-m",
        "tests.fakes.fake_provider",
        "--port",
        "0",
        "--scenario-file",
        str(scenario),
    ]
    async with await anyio.open_process(command, cwd=ROOT) as process:
        try:
            assert process.stdout is not None
            with anyio.fail_after(20):
                line = b""
                while not line.endswith(b"\n"):
                    line += await process.stdout.receive(1)
            port = int(line)
            base = f"http://127.0.0.1:{port}"
            client = AnthropicClient(http, api_key=KEY, base_url=base)
            assert (await fails(client, request("engineer"))).error.code == "overloaded"
            assert (await client.complete(request("engineer"))).text == "from a process"
            calls: dict[str, Any] = (await http.get(f"{base}/_calls")).json()
            assert calls == {"engineer": 2}
        finally:
            process.terminate()
            with anyio.fail_after(10):
                await process.wait()

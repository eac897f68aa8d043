"""Streamed provider calls over real HTTP (the fake provider streams both APIs): deltas in order and
the whole answer once, typed answers streamed as tool JSON / JSON content, the classification of a
cut, an error event, a missing final event, the fallback to a plain call when a stream is refused
(remembered per client), the stream telemetry, and a cancel that closes the stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from orchestration.workers.anthropic import AnthropicClient
from orchestration.workers.model_calls import (
    ProviderCallError,
    ProviderRequest,
    ProviderResponse,
    make_http_client,
)
from orchestration.workers.openai_compat import OpenAICompatClient
from orchestration.workers.provider_worker import ProviderWorker
from server.settings.config import load_settings
from server.settings.providers import provider_settings
from tests.fakes.fake_provider import FakeProvider

KEY = "sk-test-fake-provider-key"
DIALECTS = ["anthropic", "openai", "openrouter"]
TEXT = "The review: the patch is sound, ship it."
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"verdict": {"type": "string"}},
    "required": ["verdict"],
}


def client_for(
    dialect: str, http: httpx2.AsyncClient, fake: FakeProvider
) -> AnthropicClient | OpenAICompatClient:
    if dialect == "anthropic":
        return AnthropicClient(http, api_key=KEY, base_url=fake.base_url)
    base = f"{fake.base_url}/api" if dialect == "openrouter" else fake.base_url
    return OpenAICompatClient(http, api_key=KEY, base_url=base)


def request(deltas: list[str], schema: dict[str, Any] | None = None) -> ProviderRequest:
    return ProviderRequest(
        model="fake-model",
        system="You review code.",
        user="Review it.",
        max_tokens=64,
        output_schema=schema,
        on_delta=deltas.append,
    )


async def fails(client: AnthropicClient | OpenAICompatClient, req: ProviderRequest) -> ProviderCallError:
    with pytest.raises(ProviderCallError) as info:
        await client.complete(req)
    return info.value


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_streamed_answer_arrives_in_deltas_and_whole(
    dialect: str, fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    fake.set_scenario({"default": [{"text": TEXT, "chunk_chars": 6, "chunk_delay_seconds": 0.01}]})
    deltas: list[str] = []
    response = await client_for(dialect, http, fake).complete(request(deltas))
    assert response.text == TEXT
    assert deltas == [TEXT[i : i + 6] for i in range(0, len(TEXT), 6)]
    [sent] = fake.requests()
    assert sent["body"]["stream"] is True
    assert sent["headers"]["accept"] == "text/event-stream"
    if dialect != "anthropic":
        assert sent["body"]["stream_options"] == {"include_usage": True}
    t = response.telemetry
    # the usage comes from the stream's events (message_start + message_delta / the usage chunk)
    assert (t.input_tokens, t.output_tokens, t.http_status) == (11, 7, 200)
    assert t.provider_request_id
    assert t.first_token_ms is not None and t.stream_ms is not None
    assert 0 < t.first_token_ms <= (t.latency_ms or 0)
    with anyio.fail_after(5):
        # The fake, on another thread, records the stream once its last write returned: after
        # the client has read it, possibly.
        while not fake.streams():  # noqa: ASYNC110 - the fake runs on another thread
            await anyio.sleep(0.01)
    assert [s["finished"] for s in fake.streams()] == [True]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_typed_answer_streams_its_json_and_is_returned_whole(
    dialect: str, fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    answer = {"verdict": "approve", "notes": "a long enough note to be cut in pieces"}
    fake.set_scenario({"default": [{"text": json.dumps(answer), "chunk_chars": 5}]})
    deltas: list[str] = []
    response = await client_for(dialect, http, fake).complete(request(deltas, SCHEMA))
    assert json.loads(response.text) == answer
    assert len(deltas) > 3
    assert json.loads("".join(deltas)) == answer  # Anthropic: input_json_delta; OpenAI: content
    body = fake.requests()[0]["body"]
    assert body["stream"] is True
    assert ("tool_choice" in body) == (dialect == "anthropic")


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_stream_cut_after_it_started_is_a_retryable_transport_error(
    dialect: str, fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    fake.set_scenario({"default": [{"text": TEXT, "cut": "reset", "cut_after": 2}]})
    deltas: list[str] = []
    exc = await fails(client_for(dialect, http, fake), request(deltas))
    assert len(deltas) == 2  # the stream had started: message_start and two deltas came
    assert exc.error.code == "transport_error"
    assert exc.error.retryable
    assert exc.telemetry.possible_duplicate_call  # the model ran: a retry may be billed twice


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_stream_without_its_final_event_is_truncated_never_a_success(
    dialect: str, fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    fake.set_scenario({"default": [{"text": TEXT, "cut": "end", "cut_after": 3}]})
    deltas: list[str] = []
    exc = await fails(client_for(dialect, http, fake), request(deltas))
    assert len(deltas) == 3
    assert exc.error.code == "truncated"
    assert exc.error.retryable  # unlike max_tokens: the same request may well finish next time
    assert exc.telemetry.possible_duplicate_call
    assert "stream ended" in exc.error.message


@pytest.mark.parametrize(
    ("dialect", "in_body_code", "code"),
    [
        ("anthropic", None, "overloaded"),  # an overloaded_error event after the 200
        ("openai", 503, "overloaded"),
        ("openrouter", None, "server_error"),  # OpenRouter's upstream 502 in a chunk
        ("openrouter", 429, "rate_limited"),
    ],
)
async def test_an_error_event_mid_stream_keeps_its_class(
    dialect: str, in_body_code: int | None, code: str, fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    reply: dict[str, Any] = {"text": TEXT, "cut": "error", "cut_after": 2}
    if in_body_code is not None:
        reply["in_body_code"] = in_body_code
    fake.set_scenario({"default": [reply]})
    deltas: list[str] = []
    exc = await fails(client_for(dialect, http, fake), request(deltas))
    assert len(deltas) == 2
    assert exc.error.code == code
    assert exc.error.retryable
    assert exc.error.http_status == 200


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_endpoint_that_refuses_streams_is_called_plainly_and_remembered(
    dialect: str, fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    fake.set_scenario({"default": [{"text": TEXT, "refuse_stream": True}]})
    client = client_for(dialect, http, fake)
    assert client.streaming
    deltas: list[str] = []
    first = await client.complete(request(deltas))
    second = await client.complete(request(deltas))
    assert first.text == second.text == TEXT
    assert deltas == []  # a plain answer has no deltas
    assert first.telemetry.first_token_ms is None and first.telemetry.stream_ms is None
    assert [r["body"].get("stream") for r in fake.requests()] == [True, None, None]
    assert not client.streaming


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_server_that_ignores_stream_answers_plainly(
    dialect: str, fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    fake.set_scenario({"default": [{"text": TEXT, "plain": True}]})
    deltas: list[str] = []
    response = await client_for(dialect, http, fake).complete(request(deltas))
    assert response.text == TEXT and deltas == []


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_streaming_off_sends_plain_requests(
    dialect: str, fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    fake.set_scenario({"default": [{"text": TEXT}]})
    if dialect == "anthropic":
        client: AnthropicClient | OpenAICompatClient = AnthropicClient(
            http, api_key=KEY, base_url=fake.base_url, stream=False
        )
    else:
        client = OpenAICompatClient(http, api_key=KEY, base_url=fake.base_url, stream=False)
    deltas: list[str] = []
    assert (await client.complete(request(deltas))).text == TEXT
    assert "stream" not in fake.requests()[0]["body"] and deltas == []


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_cancelled_call_closes_its_stream(
    dialect: str, fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    fake.set_scenario({"default": [{"text": TEXT * 20, "chunk_chars": 4, "chunk_delay_seconds": 0.05}]})
    client = client_for(dialect, http, fake)
    deltas: list[str] = []
    outcome: list[ProviderResponse] = []
    with anyio.CancelScope() as scope:

        def cancel_on_third(piece: str) -> None:
            deltas.append(piece)
            if len(deltas) == 3:
                scope.cancel()

        req = ProviderRequest(
            model="fake-model", system="s", user="u", max_tokens=64, on_delta=cancel_on_third
        )
        outcome.append(await client.complete(req))
    assert scope.cancelled_caught and outcome == []
    assert len(deltas) == 3
    with anyio.fail_after(5):  # the server sees the connection go and stops sending
        while not fake.streams():  # noqa: ASYNC110 - the fake runs on another thread
            await anyio.sleep(0.01)
    [stream] = fake.streams()
    assert not stream["finished"] and stream["deltas"] < 10


async def test_comments_crlf_and_split_data_lines_are_read_as_the_sse_standard_says() -> None:
    """One answer, sent with a comment, CRLF line ends, a ``data`` field split over two lines
    and an unnamed event (``event`` missing: the type comes from the data)."""
    events = [
        ": keep-alive",
        "event: message_start",
        'data: {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",',
        'data: "content": [], "stop_reason": null, "usage": {"input_tokens": 3, "output_tokens": 1}}}',
        "",
        'data: {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}',
        "",
        "event: content_block_delta",
        'data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}',
        "",
        "event: message_delta",
        'data: {"type": "message_delta", "delta": {"stop_reason": "end_turn"},',
        'data: "usage": {"output_tokens": 2}}',
        "",
        "event: message_stop",
        'data: {"type": "message_stop"}',
        "",
        "",
    ]
    body = "\r\n".join(events).encode()

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    deltas: list[str] = []
    async with make_http_client(httpx2.MockTransport(handler)) as http:
        response = await AnthropicClient(http, api_key=KEY).complete(request(deltas))
    assert (response.text, deltas) == ("hi", ["hi"])
    assert (response.telemetry.input_tokens, response.telemetry.output_tokens) == (3, 2)


async def test_streaming_is_on_by_default_and_configured_per_provider(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text("[providers.openai]\nstream = false\n")
    env = {"OPENAI_API_KEY": KEY, "ANTHROPIC_API_KEY": KEY}
    settings = provider_settings(load_settings(env=env, home=tmp_path))
    assert {name: e.stream for name, e in settings.endpoints.items()} == {
        "anthropic": True,
        "openrouter": True,
        "openai": False,
    }
    async with make_http_client() as http:
        worker = ProviderWorker(settings, http)
        clients = {name: worker.client(name) for name in ("anthropic", "openai")}
    assert [getattr(c, "streaming", None) for c in clients.values()] == [True, False]

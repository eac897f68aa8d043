"""Typed output on the provider backend: how each adapter asks for structured output (Anthropic's
forced tool, OpenAI-compatible ``response_format`` with its fallbacks), and the worker's boundary
validation: an invalid answer is a retryable ``invalid_output`` attempt, the next attempt is told
what was wrong, and attempts stay bounded."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from orchestration.chains.catalog import Catalog
from orchestration.chains.schemas import BUILTIN_SCHEMAS
from orchestration.core import StartRequest
from orchestration.core.clock import SystemClock
from orchestration.core.facts import AttemptFailed, TaskCompleted
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.runtime import Runtime
from orchestration.errors import ConfigError
from orchestration.workers.anthropic import AnthropicClient
from orchestration.workers.model_calls import ProviderCallError, ProviderRequest, make_http_client
from orchestration.workers.openai_compat import OpenAICompatClient
from orchestration.workers.provider_worker import (
    ProviderEndpoint,
    ProviderSettings,
    ProviderWorker,
    contract_resolver,
)
from orchestration.workers.retry import RetryPolicy
from server.settings.config import load_settings
from server.settings.providers import provider_settings
from stores.memory import MemoryStore
from tests.fakes.fake_provider import FakeProvider
from tests.unit.helpers import sequential_ids

CANARY = "sk-canary-" + secrets.token_hex(16)
VERDICT = dict(BUILTIN_SCHEMAS["verdict"])
TYPED = ProviderRequest(
    model="m", system="You review.", user="Review it.", max_tokens=256, output_schema=VERDICT
)
APPROVE = {"verdict": "approve", "notes": "fine"}
# What llama.cpp's Python server says to a json_schema response_format.
LLAMA_REFUSAL = {
    "error": {
        "message": "response_format.type must be 'text' or 'json_object'",
        "type": "invalid_request_error",
    }
}

Handler = Callable[[httpx2.Request], httpx2.Response]


def anthropic_message(content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": stop,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def chat(content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    }


# --- Anthropic: a forced tool ----------------------------------------------------------------------


async def test_anthropic_forces_the_answer_tool_and_returns_its_input_as_json() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        bodies.append(json.loads(request.content))
        block = {"type": "tool_use", "id": "toolu_01", "name": "answer", "input": APPROVE}
        return httpx2.Response(200, json=anthropic_message([block], "tool_use"))

    async with make_http_client(httpx2.MockTransport(handler)) as http:
        response = await AnthropicClient(http, api_key=CANARY).complete(TYPED)
    [body] = bodies
    assert body["tools"] == [
        {
            "name": "answer",
            "description": "Give your answer to the task. Its input is your whole answer.",
            "input_schema": VERDICT,
        }
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "answer"}
    assert json.loads(response.text) == APPROVE and response.stop_reason == "tool_use"


async def test_anthropic_in_prompt_mode_offers_no_tool_and_an_untyped_request_neither() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        bodies.append(json.loads(request.content))
        return httpx2.Response(200, json=anthropic_message([{"type": "text", "text": "{}"}], "end_turn"))

    async with make_http_client(httpx2.MockTransport(handler)) as http:
        await AnthropicClient(http, api_key=CANARY, structured_output="prompt").complete(TYPED)
        untyped = ProviderRequest(model="m", system="s", user="u", max_tokens=8)
        await AnthropicClient(http, api_key=CANARY).complete(untyped)
    assert all("tools" not in b and "tool_choice" not in b for b in bodies)


async def test_anthropic_a_cut_tool_call_is_truncated_not_an_answer() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        block = {"type": "tool_use", "id": "toolu_01", "name": "answer", "input": {"verdict": "appr"}}
        return httpx2.Response(200, json=anthropic_message([block], "max_tokens"))

    async with make_http_client(httpx2.MockTransport(handler)) as http:
        with pytest.raises(ProviderCallError) as info:
            await AnthropicClient(http, api_key=CANARY).complete(TYPED)
    assert info.value.code == "truncated"


# --- OpenAI-compatible: response_format and its fallbacks ---------------------------------------


def scripted(replies: list[httpx2.Response], seen: list[dict[str, Any]]) -> Handler:
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(json.loads(request.content))
        return replies[min(len(seen), len(replies)) - 1]

    return handler


def formats(seen: list[dict[str, Any]]) -> list[Any]:
    return [body.get("response_format", {}).get("type") for body in seen]


async def test_openai_asks_for_a_json_schema() -> None:
    seen: list[dict[str, Any]] = []
    handler = scripted([httpx2.Response(200, json=chat(json.dumps(APPROVE)))], seen)
    async with make_http_client(httpx2.MockTransport(handler)) as http:
        client = OpenAICompatClient(http, base_url="https://api.openai.com", api_key=CANARY)
        response = await client.complete(TYPED)
    [body] = seen
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": VERDICT, "strict": False},
    }
    assert json.loads(response.text) == APPROVE


async def test_a_refused_json_schema_falls_back_to_json_object_and_is_remembered() -> None:
    seen: list[dict[str, Any]] = []
    replies = [httpx2.Response(400, json=LLAMA_REFUSAL), httpx2.Response(200, json=chat(json.dumps(APPROVE)))]
    async with make_http_client(httpx2.MockTransport(scripted(replies, seen))) as http:
        client = OpenAICompatClient(http, base_url="http://127.0.0.1:8080")
        response = await client.complete(TYPED)
        assert json.loads(response.text) == APPROVE
        assert formats(seen) == ["json_schema", "json_object"]
        assert seen[1]["response_format"] == {"type": "json_object", "schema": VERDICT}
        assert client.structured_output_mode == "json_object"
        await client.complete(TYPED)  # the endpoint's answer is remembered: no second refusal
    assert formats(seen) == ["json_schema", "json_object", "json_object"]


async def test_then_to_instructions_in_the_prompt() -> None:
    seen: list[dict[str, Any]] = []
    refused_too = {"error": {"message": "unknown field 'response_format.schema'", "type": "invalid_request"}}
    replies = [
        httpx2.Response(400, json=LLAMA_REFUSAL),
        httpx2.Response(400, json=refused_too),
        httpx2.Response(200, json=chat(json.dumps(APPROVE))),
    ]
    async with make_http_client(httpx2.MockTransport(scripted(replies, seen))) as http:
        client = OpenAICompatClient(http, base_url="http://127.0.0.1:8080")
        response = await client.complete(TYPED)
        assert json.loads(response.text) == APPROVE
        assert formats(seen) == ["json_schema", "json_object", None]
        assert client.structured_output_mode == "prompt"
        await client.complete(TYPED)
    assert formats(seen) == ["json_schema", "json_object", None, None]


async def test_a_pinned_mode_and_other_400s_do_not_fall_back() -> None:
    seen: list[dict[str, Any]] = []
    async with make_http_client(
        httpx2.MockTransport(scripted([httpx2.Response(400, json=LLAMA_REFUSAL)], seen))
    ) as http:
        pinned = OpenAICompatClient(http, base_url="http://127.0.0.1:8080", structured_output="json_schema")
        with pytest.raises(ProviderCallError) as info:
            await pinned.complete(TYPED)
    assert info.value.code == "invalid_request" and formats(seen) == ["json_schema"]

    seen.clear()
    too_long = {
        "error": {"message": "maximum context length is 8192 tokens", "code": "context_length_exceeded"}
    }
    async with make_http_client(
        httpx2.MockTransport(scripted([httpx2.Response(400, json=too_long)], seen))
    ) as http:
        client = OpenAICompatClient(http, base_url="http://127.0.0.1:8080")
        with pytest.raises(ProviderCallError) as info:
            await client.complete(TYPED)
    assert info.value.code == "context_length_exceeded" and formats(seen) == ["json_schema"]


async def test_prompt_mode_sends_no_response_format_and_untyped_requests_none() -> None:
    seen: list[dict[str, Any]] = []
    async with make_http_client(
        httpx2.MockTransport(scripted([httpx2.Response(200, json=chat("{}"))], seen))
    ) as http:
        await OpenAICompatClient(http, base_url="http://127.0.0.1:8080", structured_output="prompt").complete(
            TYPED
        )
        await OpenAICompatClient(http, base_url="http://127.0.0.1:8080").complete(
            ProviderRequest(model="m", system="s", user="u", max_tokens=8)
        )
    assert formats(seen) == [None, None]


async def test_unknown_modes_are_refused() -> None:
    async with make_http_client() as http:
        with pytest.raises(ValueError, match="structured_output 'xml'"):
            OpenAICompatClient(http, structured_output="xml")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'auto' or 'prompt'"):
            AnthropicClient(http, api_key=CANARY, structured_output="json_schema")


# --- the worker and the runtime, against the fake provider over HTTP -----------------------------


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider({}) as provider:
        yield provider


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    async with make_http_client() as client:
        yield client


def runtime_for(fake: FakeProvider, http: httpx2.AsyncClient, model: str, max_attempts: int = 3) -> Runtime:
    settings = ProviderSettings(
        endpoints={
            "anthropic": ProviderEndpoint("anthropic", fake.base_url, CANARY, "ANTHROPIC_API_KEY"),
            "openrouter": ProviderEndpoint(
                "openrouter", f"{fake.base_url}/api", CANARY, "OPENROUTER_API_KEY"
            ),
        },
        default_model=model,
        max_attempts=max_attempts,
    )
    worker = ProviderWorker(
        settings, http, rng=lambda: 0.0, policy=RetryPolicy(base_delay_seconds=0.01, max_backoff_seconds=0.02)
    )
    catalog = Catalog.builtin().extended(
        {
            "chains": {
                "review": {"steps": ["engineer", {"specialist": "reviewer", "output_schema": "verdict"}]}
            }
        },
        "test",
        Path("."),
    )
    return Runtime(
        MemoryStore(),
        catalog,
        clock=SystemClock(),
        new_id=sequential_ids(),
        resolve_contract=contract_resolver("provider", settings),
        worker=worker,
    )


async def run_review(runtime: Runtime) -> str:
    head, _ = await runtime.start(StartRequest("Build a parser", chain="review"))
    await runtime.drive(head.run_id)
    return head.run_id


def user_prompt(request: dict[str, Any]) -> str:
    messages = request["body"]["messages"]
    return str(messages[-1]["content"])


@pytest.mark.parametrize("model", ["claude-test-1", "some-org/open-model"])
async def test_a_valid_typed_answer_is_recorded_with_its_value(
    fake: FakeProvider, http: httpx2.AsyncClient, model: str
) -> None:
    fake.set_scenario({"engineer": [{"text": "the parser"}], "reviewer": [{"text": json.dumps(APPROVE)}]})
    runtime = runtime_for(fake, http, model)
    run_id = await run_review(runtime)
    head = await runtime.status(run_id)
    assert head.status == RunStatus.COMPLETED
    fact = await runtime.store.read_fact(run_id, head.task("reviewer").output_seq or 0)
    assert isinstance(fact, TaskCompleted) and fact.value == APPROVE
    engineer = await runtime.store.read_fact(run_id, head.task("engineer").output_seq or 0)
    assert isinstance(engineer, TaskCompleted) and engineer.value is None
    view = await runtime.snapshot(run_id)
    assert view.values == {"reviewer": APPROVE}


async def test_an_invalid_answer_fails_the_attempt_and_the_next_one_is_told_why(
    fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    fake.set_scenario(
        {
            "engineer": [{"text": "the parser"}],
            "reviewer": [{"text": '{"verdict": "lgtm", "notes": "fine"}'}, {"text": json.dumps(APPROVE)}],
        }
    )
    runtime = runtime_for(fake, http, "some-org/open-model")
    run_id = await run_review(runtime)
    head = (await runtime.snapshot(run_id)).head
    assert head.status == RunStatus.COMPLETED
    reviewer = head.task("reviewer")
    assert [a.outcome for a in reviewer.attempts] == ["failed", "succeeded"]
    error = reviewer.attempts[0].error
    assert error is not None and error.code == "invalid_output" and error.retryable
    assert "at /verdict: 'lgtm' is not one of ['approve', 'revise', 'reject']" in error.message
    first, second = [r for r in fake.requests() if r["task"] == "reviewer"]
    assert "previous answer was rejected" not in user_prompt(first)
    assert "## Your previous answer was rejected" in user_prompt(second)
    assert error.message in user_prompt(second)
    facts = await runtime.store.read_facts(run_id, 0, head.last_seq)
    assert [f.error.code for f in facts if isinstance(f, AttemptFailed)] == ["invalid_output"]


async def test_invalid_answers_stay_bounded_by_the_attempt_budget(
    fake: FakeProvider, http: httpx2.AsyncClient
) -> None:
    fake.set_scenario({"engineer": [{"text": "the parser"}], "reviewer": [{"text": "I approve."}]})
    runtime = runtime_for(fake, http, "claude-test-1", max_attempts=3)
    run_id = await run_review(runtime)
    head = await runtime.status(run_id)
    assert head.status == RunStatus.FAILED
    assert head.task("reviewer").status == TaskStatus.FAILED
    assert head.error is not None and head.error.code == "invalid_output"
    assert fake.calls_for("reviewer") == 3


# --- configuration -----------------------------------------------------------------------------


def test_structured_output_is_configured_per_provider(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(
        '[providers.openrouter]\nstructured_output = "prompt"\n'
        '[providers.anthropic]\nstructured_output = "prompt"\n'
    )
    env = {"CONSTRUCT_OPENAI_STRUCTURED_OUTPUT": "json_object", "OPENAI_API_KEY": CANARY}
    endpoints = provider_settings(load_settings(env=env, home=tmp_path)).endpoints
    assert {name: e.structured_output for name, e in endpoints.items()} == {
        "anthropic": "prompt",
        "openrouter": "prompt",
        "openai": "json_object",
    }
    default = provider_settings(load_settings(env={}, home=tmp_path / "none"))
    assert default.endpoints["openai"].structured_output == "auto"


async def test_the_worker_builds_clients_in_the_configured_mode() -> None:
    settings = ProviderSettings(
        endpoints={
            "openai": ProviderEndpoint("openai", "http://127.0.0.1:8080", structured_output="json_object")
        }
    )
    async with make_http_client() as http:
        client = ProviderWorker(settings, http).client("openai")
    assert isinstance(client, OpenAICompatClient) and client.structured_output_mode == "json_object"


@pytest.mark.parametrize(
    ("text", "env", "field", "problem"),
    [
        (
            '[providers.anthropic]\nstructured_output = "json_schema"\n',
            {},
            "providers",
            "'auto' (a forced tool)",
        ),
        (
            '[providers.openai]\nstructured_output = "xml"\n',
            {},
            "providers.openai.structured_output",
            "'prompt'",
        ),
        ("", {"CONSTRUCT_OPENAI_STRUCTURED_OUTPUT": "xml"}, "CONSTRUCT_OPENAI_STRUCTURED_OUTPUT", "'prompt'"),
    ],
)
def test_a_bad_structured_output_setting_is_a_startup_error(
    tmp_path: Path, text: str, env: dict[str, str], field: str, problem: str
) -> None:
    (tmp_path / "construct.toml").write_text(text, "utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(env=env, home=tmp_path)
    assert caught.value.field == field
    assert problem in caught.value.problem


async def test_through_the_mcp_tools_with_the_provider_backend(fake: FakeProvider, tmp_path: Path) -> None:
    from mcp import Client

    from server.app import ConstructApp

    fake.set_scenario(
        {
            "engineer": [{"text": "the parser"}],
            "reviewer": [{"text": "Approved!"}, {"text": json.dumps(APPROVE)}],
        }
    )
    config = tmp_path / "construct.toml"
    config.write_text(
        '[chains.rev]\nsteps = ["engineer", { specialist = "reviewer", output_schema = "verdict" }]\n'
    )
    env = {
        "CONSTRUCT_HOME": str(tmp_path),
        "CONSTRUCT_POLL_SECONDS": "0.1",
        "CONSTRUCT_WORKER_BACKEND": "provider",
        "CONSTRUCT_MODEL": "claude-test-1",
        "CONSTRUCT_ANTHROPIC_BASE_URL": fake.base_url,
        "ANTHROPIC_API_KEY": CANARY,  # keys come from the environment, with the other settings
    }
    app = ConstructApp(load_settings(env=env, config_file=config))
    async with Client(app.build_server()) as client:
        started = await client.call_tool("orchestrate_start", {"request": "Build a parser", "chain": "rev"})
        assert not started.is_error, started.content
        run_id = (started.structured_content or {})["run_id"]
        view: dict[str, Any] = {}
        for _ in range(10):
            result = await client.call_tool(
                "run_status", {"run_id": run_id, "wait_seconds": 30, "detail": "full"}
            )
            view = result.structured_content or {}
            if view["status_kind"] == "terminal":
                break
    assert view["status"] == "completed"
    reviewer = view["tasks"][1]
    assert reviewer["value"] == APPROVE
    assert [a["error"]["code"] if a["error"] else None for a in reviewer["attempts"]] == [
        "invalid_output",
        None,
    ]
    [tool_request] = [r for r in fake.requests() if r["task"] == "reviewer"][:1]
    assert tool_request["body"]["tool_choice"] == {"type": "tool", "name": "answer"}

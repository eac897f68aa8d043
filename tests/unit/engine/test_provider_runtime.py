"""The provider backend end to end inside one process: the runtime drives a chain whose tasks are
executed by :class:`ProviderWorker` against the fake provider over real HTTP."""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import SystemClock
from orchestration.core.decide import WaitUntil
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from orchestration.errors import InvalidArgument
from orchestration.workers.model_calls import make_http_client
from orchestration.workers.provider_worker import (
    ProviderEndpoint,
    ProviderSettings,
    ProviderWorker,
    contract_resolver,
)
from orchestration.workers.retry import RetryPolicy
from stores.memory import MemoryStore
from tests.fakes.fake_provider import FakeProvider
from tests.unit.helpers import sequential_ids

CANARY = "sk-canary-" + secrets.token_hex(16)


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider({}) as provider:
        yield provider


def settings_for(fake: FakeProvider, model: str = "claude-test-1") -> ProviderSettings:
    return ProviderSettings(
        endpoints={
            "anthropic": ProviderEndpoint("anthropic", fake.base_url, CANARY, "ANTHROPIC_API_KEY"),
            "openrouter": ProviderEndpoint(
                "openrouter", f"{fake.base_url}/api", CANARY, "OPENROUTER_API_KEY"
            ),
        },
        default_model=model,
        max_attempts=3,
    )


_clients: list[httpx2.AsyncClient] = []


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while _clients:
        await _clients.pop().aclose()


async def make(fake: FakeProvider, model: str = "claude-test-1", wait_cap: float = 30.0) -> Runtime:
    settings = settings_for(fake, model)
    http = make_http_client()
    _clients.append(http)
    worker = ProviderWorker(
        settings, http, rng=lambda: 0.0, policy=RetryPolicy(base_delay_seconds=0.01, max_backoff_seconds=0.05)
    )
    return Runtime(
        MemoryStore(),
        Catalog.builtin(),
        clock=SystemClock(),
        new_id=sequential_ids(),
        resolve_contract=contract_resolver("provider", settings),
        worker=worker,
        settings=RuntimeSettings(in_memory_wait_cap_seconds=wait_cap),
    )


async def run_to_end(runtime: Runtime, **start: Any) -> str:
    head, _ = await runtime.start(StartRequest("Build a parser", **start))
    await runtime.drive(head.run_id)
    return head.run_id


@pytest.mark.parametrize("model", ["claude-test-1", "some-org/open-model"])
async def test_full_chain_completes_with_the_providers_outputs(fake: FakeProvider, model: str) -> None:
    fake.set_scenario({t: [{"text": f"{t} says hi"}] for t in ("architect", "engineer", "reviewer")})
    runtime = await make(fake, model)
    run_id = await run_to_end(runtime)
    head = (await runtime.snapshot(run_id)).head
    assert head.status == RunStatus.COMPLETED
    provider = "anthropic" if model.startswith("claude") else "openrouter"
    assert {t.executor for t in head.tasks} == {f"provider:{provider}:{model}"}
    assert await runtime.outputs(head) == {t: f"{t} says hi" for t in ("architect", "engineer", "reviewer")}
    assert fake.calls() == {"architect": 1, "engineer": 1, "reviewer": 1}
    architect = head.task("architect").attempts[0]
    assert architect.telemetry.output_tokens and architect.telemetry.provider_request_id


async def test_rate_limited_then_success_is_retried(fake: FakeProvider) -> None:
    fake.set_scenario({"engineer": [{"error": "rate_limited", "retry_after": 0}, {"text": "patched"}]})
    runtime = await make(fake)
    head = (await runtime.snapshot(await run_to_end(runtime))).head
    assert head.status == RunStatus.COMPLETED
    engineer = head.task("engineer")
    assert [a.outcome for a in engineer.attempts] == ["failed", "succeeded"]
    assert engineer.attempts[0].error is not None and engineer.attempts[0].error.code == "rate_limited"
    assert engineer.attempts[0].telemetry.http_status == 429
    assert fake.calls_for("engineer") == 2


async def test_auth_failure_fails_the_run_without_retrying(fake: FakeProvider) -> None:
    fake.set_scenario({"default": [{"error": "auth"}]})
    runtime = await make(fake)
    head = await runtime.status(await run_to_end(runtime))
    assert head.status == RunStatus.FAILED
    assert head.error is not None and head.error.code == "auth"
    assert head.task("architect").status == TaskStatus.FAILED
    assert head.task("engineer").status == TaskStatus.SKIPPED
    assert fake.calls_for("architect") == 1


async def test_attempt_budget_is_bounded(fake: FakeProvider) -> None:
    fake.set_scenario({"default": [{"error": "overloaded"}]})
    runtime = await make(fake)
    head = await runtime.status(await run_to_end(runtime, chain=("writer",)))
    assert head.status == RunStatus.FAILED
    assert head.error is not None and head.error.code in ("attempts_exhausted", "overloaded")
    assert fake.calls_for("writer") == 3


async def test_long_retry_after_becomes_a_durable_wait(fake: FakeProvider) -> None:
    fake.set_scenario({"writer": [{"error": "rate_limited", "retry_after": 120}, {"text": "done"}]})
    runtime = await make(fake, wait_cap=5)
    head, _ = await runtime.start(StartRequest("x", chain=("writer",)))
    action = await runtime.drive(head.run_id)
    assert isinstance(action, WaitUntil)
    waiting = await runtime.status(head.run_id)
    assert waiting.status == RunStatus.QUEUED and waiting.not_before is not None
    assert (waiting.not_before - waiting.updated_at).total_seconds() >= 119
    assert await runtime.store.runnable(SystemClock().now()) == []


async def test_continue_on_failure_completes_with_failures(fake: FakeProvider) -> None:
    fake.set_scenario({"tester": [{"error": "content_filtered"}]})
    catalog = Catalog.builtin().extended(
        {
            "chains": {
                "qa": {"steps": ["engineer", {"specialist": "tester", "on_failure": "continue"}, "writer"]}
            }
        },
        "test",
        __import__("pathlib").Path("."),
    )
    runtime = await make(fake)
    runtime.catalog = catalog
    head = await runtime.status(await run_to_end(runtime, chain="qa"))
    assert head.status == RunStatus.COMPLETED_WITH_FAILURES
    assert head.task("tester").status == TaskStatus.FAILED
    assert head.task("writer").status == TaskStatus.DONE


async def test_missing_key_fails_at_start_naming_the_variable(fake: FakeProvider) -> None:
    settings = ProviderSettings(
        endpoints={"anthropic": ProviderEndpoint("anthropic", fake.base_url, None)}, default_model="claude-x"
    )
    runtime = Runtime(
        MemoryStore(), Catalog.builtin(), resolve_contract=contract_resolver("provider", settings)
    )
    with pytest.raises(InvalidArgument, match="ANTHROPIC_API_KEY"):
        await runtime.start(StartRequest("x"))
    assert (await runtime.list_runs()).runs == [], "nothing was stored"


async def test_canary_key_never_stored_or_logged(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.set_scenario(
        {
            "architect": [{"error": "rate_limited", "retry_after": 0}, {"text": "a"}],
            "engineer": [{"error": "server_error"}, {"text": "b"}],
            "reviewer": [{"error": "auth"}],
        }
    )
    runtime = await make(fake)
    run_id = await run_to_end(runtime)
    store = runtime.store
    assert isinstance(store, MemoryStore)
    dumped = (await store.load(run_id)).model_dump_json() + "".join(
        f.model_dump_json() for f in await store.read_facts(run_id)
    )
    assert CANARY not in dumped
    assert CANARY not in caplog.text
    sent = [r for r in fake.requests() if CANARY in str(r)]
    assert sent, "the key was really sent to the provider (the check above is not vacuous)"

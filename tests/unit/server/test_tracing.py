"""Traces (issue 14, part 1): the spans of a run, its tasks, attempts and model calls, in process,
with the SDK's in-memory exporter; the ``traceparent`` a start carries, recorded with the run; what
the server exports by the OTEL_* variables. The span tree across a real restart is
tests/acceptance/test_trace_restart.py."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import httpx2
import pytest
from mcp import Client
from mcp.types import RequestParamsMeta
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock, SystemClock
from orchestration.core.facts import AttemptStarted, RunCreated, TaskCompleted, parse_fact, parse_head
from orchestration.core.fold import apply_write
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.runtime import Runtime
from orchestration.tracing import current_traceparent, parent_context
from orchestration.workers.model_calls import make_http_client
from orchestration.workers.provider_worker import (
    ProviderEndpoint,
    ProviderSettings,
    ProviderWorker,
    contract_resolver,
)
from orchestration.workers.retry import RetryPolicy
from server.app import ConstructApp
from server.settings.config import load_settings
from server.settings.telemetry import configure_tracing, wanted_exporters
from stores.memory import MemoryStore
from tests.fakes.fake_provider import FakeProvider
from tests.spans import (
    CALLER_SPAN_ID,
    META,
    TRACE_ID,
    TRACEPARENT,
    finished,
    fresh_globals,
    global_provider,
    memory_spans,
    named,
    recorded_values,
)
from tests.unit.helpers import ScriptedWorker, make_runtime, sequential_ids

CANARY = "sk-canary-" + secrets.token_hex(16)
REQUEST = "Build a parser [secret-request-text]"


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    client = make_http_client()
    try:
        yield client
    finally:
        await client.aclose()


def provider_runtime(fake: FakeProvider, http: httpx2.AsyncClient) -> Runtime:
    settings = ProviderSettings(
        endpoints={"anthropic": ProviderEndpoint("anthropic", fake.base_url, CANARY, "ANTHROPIC_API_KEY")},
        default_model="claude-test-1",
        max_attempts=3,
    )
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
    )


async def test_a_provider_run_is_a_span_tree_under_the_callers_trace(http: httpx2.AsyncClient) -> None:
    scenario = {
        "architect": [{"text": "design [secret-output]"}],
        "engineer": [{"error": "overloaded"}, {"text": "patch [secret-output]"}],
        "reviewer": [{"text": "approved [secret-output]"}],
    }
    with FakeProvider(scenario) as fake, memory_spans() as exporter:
        runtime = provider_runtime(fake, http)
        head, _ = await runtime.start(StartRequest(REQUEST, traceparent=TRACEPARENT))
        await runtime.drive(head.run_id)
        assert (await runtime.status(head.run_id)).status == RunStatus.COMPLETED
        completed = [f for f in await runtime.read_facts(head.run_id) if isinstance(f, TaskCompleted)]
        spans = finished(exporter)

    # The recorded outputs carry the stream's telemetry too (the output itself is the whole text).
    assert len(completed) == 3
    assert all((f.telemetry.first_token_ms or 0) > 0 for f in completed)
    assert all(f.telemetry.stream_ms is not None for f in completed)
    assert all(f.output.endswith("[secret-output]") for f in completed)

    assert {s.trace_id for s in spans} == {TRACE_ID}
    [run] = named(spans, "run ")
    assert run.name == "run default" and run.parent_id == CALLER_SPAN_ID
    assert run.attributes["construct.run.id"] == head.run_id
    assert run.attributes["construct.run.status"] == "completed"
    tasks = {s.attributes["construct.task.id"]: s for s in named(spans, "task ")}
    assert set(tasks) == {"architect", "engineer", "reviewer"}
    assert all(
        t.parent_id == run.span_id and t.attributes["construct.task.status"] == "done" for t in tasks.values()
    )
    attempts = named(spans, "attempt ")
    by_task = {
        task_id: sorted(
            (a.attributes["construct.attempt.number"], a.attributes["construct.attempt.outcome"])
            for a in attempts
            if a.parent_id == span.span_id
        )
        for task_id, span in tasks.items()
    }
    assert by_task == {
        "architect": [(1, "succeeded")],
        "engineer": [(1, "failed"), (2, "succeeded")],
        "reviewer": [(1, "succeeded")],
    }
    failed = next(a for a in attempts if a.attributes["construct.attempt.outcome"] == "failed")
    assert failed.attributes["error.type"] == "overloaded" and failed.status == "ERROR"
    assert not any("construct.attempt.follows_orphan" in a.attributes for a in attempts)

    # One model call per attempt, a child of it, in the GenAI semantic conventions.
    chats = named(spans, "chat ")
    assert sorted(c.parent_id or "" for c in chats) == sorted(a.span_id for a in attempts)
    succeeded = [c for c in chats if "error.type" not in c.attributes]
    assert len(succeeded) == 3
    for chat in succeeded:
        assert chat.name == "chat claude-test-1"
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "anthropic"
        assert chat.attributes["gen_ai.system"] == "anthropic"
        assert chat.attributes["gen_ai.request.model"] == "claude-test-1"
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0
        assert chat.attributes["gen_ai.usage.output_tokens"] > 0
        assert chat.attributes["gen_ai.response.finish_reasons"] == ("end_turn",)
        assert chat.attributes["server.address"] == "127.0.0.1"
        # a streamed call (the default): its first delta's latency and the stream's duration
        assert chat.attributes["construct.stream.first_token_ms"] > 0
        assert chat.attributes["construct.stream.duration_ms"] >= 0
    [overloaded] = [c for c in chats if "error.type" in c.attributes]
    assert overloaded.attributes["error.type"] == "overloaded"
    assert overloaded.attributes["http.response.status_code"] == 529

    # Never prompt text, outputs or keys.
    values = recorded_values(spans)
    for secret in ("secret-request-text", "secret-output", CANARY, "You are"):
        assert secret not in values


async def test_a_resumed_attempt_says_it_follows_the_orphan() -> None:
    """A process died during attempt 1 of the architect (its attempt_started is recorded, nothing
    after): the next drive retries it as attempt 2, and that attempt's span names the orphan."""
    clock = ManualClock(datetime(2026, 3, 1, tzinfo=UTC))
    store = MemoryStore()
    runtime = make_runtime(store, ScriptedWorker(), clock)
    head, _ = await runtime.start(
        StartRequest("x", chain=("architect",), worker_backend="provider", traceparent=TRACEPARENT)
    )
    started = AttemptStarted(
        seq=2, at=clock.now(), task_id="architect", attempt=1, executor="provider:fake:fake-1"
    )
    await store.append(head.run_id, head.version, [started], apply_write(head, [started]))
    clock.advance(60)
    with memory_spans() as exporter:
        await runtime.drive(head.run_id)
        spans = finished(exporter)
    assert (await runtime.status(head.run_id)).status == RunStatus.COMPLETED
    [attempt] = named(spans, "attempt ")
    assert attempt.attributes["construct.attempt.number"] == 2
    assert attempt.attributes["construct.attempt.follows_orphan"] == 1
    assert attempt.attributes["construct.attempt.possible_duplicate_call"] is True
    assert attempt.attributes["construct.orphan.started_at"] == "2026-03-01T00:00:00+00:00"
    assert {s.trace_id for s in spans} == {TRACE_ID}


async def test_a_parallel_run_has_one_task_span_per_branch() -> None:
    with memory_spans() as exporter:
        runtime = make_runtime(worker=ScriptedWorker())
        head, _ = await runtime.start(
            StartRequest("q", chain="research", worker_backend="provider", traceparent=TRACEPARENT)
        )
        await runtime.drive(head.run_id)
        spans = finished(exporter)
    assert (await runtime.status(head.run_id)).status == RunStatus.COMPLETED
    [run] = named(spans, "run ")
    tasks = named(spans, "task ")
    assert len(tasks) == len(head.tasks) and all(t.parent_id == run.span_id for t in tasks)
    attempts = named(spans, "attempt ")
    assert sorted(a.parent_id or "" for a in attempts) == sorted(t.span_id for t in tasks)
    assert {s.trace_id for s in spans} == {TRACE_ID}


async def test_without_a_traceparent_each_drive_starts_a_trace_and_records_nothing() -> None:
    runtime = make_runtime(worker=ScriptedWorker())
    with memory_spans() as exporter:
        head, _ = await runtime.start(StartRequest("x", chain=("architect",), worker_backend="provider"))
        await runtime.drive(head.run_id)
        [run] = named(finished(exporter), "run ")
    assert head.traceparent is None and run.parent_id is None


async def test_without_an_sdk_the_spans_cost_nothing_and_change_nothing() -> None:
    """The API's no-op tracer: the run is driven exactly as with spans."""
    assert not trace.get_tracer("probe").start_span("probe").is_recording()
    runtime = make_runtime(worker=ScriptedWorker())
    head, _ = await runtime.start(
        StartRequest("x", chain=("architect", "engineer"), worker_backend="provider", traceparent=TRACEPARENT)
    )
    await runtime.drive(head.run_id)
    done = await runtime.status(head.run_id)
    assert done.status == RunStatus.COMPLETED and done.traceparent == TRACEPARENT


async def test_the_traceparent_is_recorded_with_the_run_and_read_back() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("x", traceparent=TRACEPARENT))
    created, *_ = await runtime.store.read_facts(head.run_id)
    assert isinstance(created, RunCreated) and created.traceparent == TRACEPARENT
    assert head.traceparent == TRACEPARENT
    # An older record (no field) reads as None; the field does not make a start another request.
    older = created.model_dump(mode="json")
    del older["traceparent"]
    assert parse_fact(RunCreated.model_validate(older).model_dump_json()).traceparent is None  # type: ignore[union-attr]
    stored_head = head.model_dump(mode="json")
    del stored_head["traceparent"]
    assert parse_head(json.dumps(stored_head)).traceparent is None
    again, created_again = await runtime.start(
        StartRequest("x", idempotency_key="k", traceparent=TRACEPARENT)
    )
    same, created_same = await runtime.start(StartRequest("x", idempotency_key="k"))
    assert created_again and not created_same and same.run_id == again.run_id


def test_a_stored_traceparent_names_the_parent_context() -> None:
    context = parent_context(TRACEPARENT)
    assert context is not None
    span_context = trace.get_current_span(context).get_span_context()
    assert format(span_context.trace_id, "032x") == TRACE_ID
    assert format(span_context.span_id, "016x") == CALLER_SPAN_ID
    assert parent_context(None) is None and parent_context("00-garbage") is None
    assert current_traceparent() is None


async def test_orchestrate_start_records_the_traceparent_of_its_meta(tmp_path: Path) -> None:
    app = ConstructApp(
        load_settings(env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_ORCHESTRATION_STORE": "memory"})
    )
    async with Client(app.build_server()) as client:
        result = await client.call_tool(
            "orchestrate_start", {"request": "traced", "wait_seconds": 0}, meta=META
        )
        assert not result.is_error and result.structured_content is not None
        run_id = result.structured_content["run_id"]
        plain = await client.call_tool("orchestrate_start", {"request": "plain", "wait_seconds": 0})
        assert plain.structured_content is not None
        services = app._services
        assert services is not None
        traced = await services.runtime.status(run_id)
        untraced = await services.runtime.status(plain.structured_content["run_id"])
    # No SDK here: the SDK's server span is the API's no-op one, carrying the caller's context.
    assert traced.traceparent == TRACEPARENT
    assert untraced.traceparent is None


async def test_with_an_sdk_the_run_nests_under_the_servers_span_of_the_call(tmp_path: Path) -> None:
    app = ConstructApp(
        load_settings(env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_ORCHESTRATION_STORE": "memory"})
    )
    with memory_spans() as exporter:
        async with Client(app.build_server()) as client:
            result = await client.call_tool(
                "orchestrate_start",
                {"request": "traced", "wait_seconds": 0},
                meta=META,
            )
            assert result.structured_content is not None
            services = app._services
            assert services is not None
            head = await services.runtime.status(result.structured_content["run_id"])
        spans = finished(exporter)
    [server_span] = [s for s in spans if s.name == "tools/call orchestrate_start"]
    assert server_span.trace_id == TRACE_ID and server_span.parent_id == CALLER_SPAN_ID
    assert head.traceparent == f"00-{TRACE_ID}-{server_span.span_id}-01"


async def test_a_later_call_in_another_trace_links_to_the_runs(tmp_path: Path) -> None:
    app = ConstructApp(
        load_settings(env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_ORCHESTRATION_STORE": "memory"})
    )
    other_trace = "0af7651916cd43dd8448eb211c80319c"
    later = cast(RequestParamsMeta, {"traceparent": f"00-{other_trace}-b7ad6b7169203331-01"})
    with memory_spans() as exporter:
        async with Client(app.build_server()) as client:
            started = await client.call_tool(
                "orchestrate_start", {"request": "x", "wait_seconds": 0}, meta=META
            )
            assert started.structured_content is not None
            run_id = started.structured_content["run_id"]
            await client.call_tool("run_status", {"run_id": run_id}, meta=later)
            services = app._services
            assert services is not None
            head = await services.runtime.status(run_id)
        with trace.get_tracer("t").start_as_current_span("x"):
            pass
        spans = exporter.get_finished_spans()
    [status] = [s for s in spans if s.name == "tools/call run_status"]
    assert status.attributes is not None and status.attributes["construct.run.id"] == run_id
    assert format(status.context.trace_id, "032x") == other_trace
    [link] = status.links
    assert head.traceparent is not None
    assert format(link.context.trace_id, "032x") == TRACE_ID
    assert format(link.context.span_id, "016x") == head.traceparent.split("-")[2]
    # The start call is in the run's trace already: no link to itself.
    [start] = [s for s in spans if s.name == "tools/call orchestrate_start"]
    assert not start.links


def test_exporting_is_opt_in_by_the_standard_variables(caplog: pytest.LogCaptureFixture) -> None:
    assert wanted_exporters({}) == ()
    assert wanted_exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) == ("otlp",)
    assert wanted_exporters({"OTEL_TRACES_EXPORTER": "console, otlp"}) == ("console", "otlp")
    assert wanted_exporters({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"}) == ()
    assert wanted_exporters({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}) == ()
    with fresh_globals():
        # Nothing asked: the global provider stays the API's no-op one.
        configure_tracing({})
        assert not isinstance(trace.get_tracer_provider(), TracerProvider)
        with caplog.at_level(logging.WARNING, "construct.server"):
            configure_tracing({"OTEL_TRACES_EXPORTER": "zipkin-or-so"})
        assert "unknown trace exporter 'zipkin-or-so'" in caplog.text
        assert not isinstance(trace.get_tracer_provider(), TracerProvider)


def test_the_console_exporter_writes_spans_to_stderr_never_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    outer = TracerProvider()
    with global_provider(outer):
        # A provider someone installed first (opentelemetry-instrument, a test) is left alone.
        configure_tracing({"OTEL_TRACES_EXPORTER": "console"})()
        assert trace.get_tracer_provider() is outer
    with fresh_globals():
        stop = configure_tracing({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "svc"})
        assert isinstance(trace.get_tracer_provider(), TracerProvider)
        with trace.get_tracer("t").start_as_current_span("probe"):
            pass
        stop()
    captured = capsys.readouterr()
    assert '"name": "probe"' in captured.err and '"service.name": "svc"' in captured.err
    assert captured.out == ""

"""Without tracing (no SDK: the API's no-op tracer), an attempt skips the span work
(orchestration.tracing.DriveTrace.attempt) and changes nothing else: during the worker's call the
current span is the one the no-op tracer would have made current (the run's span, carrying the
run's recorded traceparent), and the previous context is back afterwards. With a tracer provider
installed, the full path is taken again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

import orchestration.tracing as tracing
from orchestration.chains.prompts import TaskPrompt
from orchestration.core import StartRequest
from orchestration.core.models import ChainStep, ExecutionContract, TypedError
from orchestration.core.outcomes import AttemptOutcome
from orchestration.workers.port import DeltaSink
from tests.spans import TRACEPARENT, fresh_globals, global_provider
from tests.unit.helpers import ScriptedWorker, make_runtime


@dataclass
class SpanNotingWorker(ScriptedWorker):
    """Notes the current span during each call."""

    seen: list[trace.Span] = field(default_factory=list)

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        self.seen.append(trace.get_current_span())
        return await super().execute(contract, step, prompt, attempt, previous_errors)


async def spans_seen(traceparent: str | None) -> list[trace.Span]:
    worker = SpanNotingWorker()
    runtime = make_runtime(worker=worker)
    head, _ = await runtime.start(
        StartRequest("x", chain=("architect", "engineer"), worker_backend="provider", traceparent=traceparent)
    )
    before = trace.get_current_span()
    await runtime.drive(head.run_id)
    assert trace.get_current_span() is before
    assert len(worker.seen) == 2
    return worker.seen


@pytest.mark.parametrize("traceparent", [TRACEPARENT, None])
async def test_an_untraced_attempt_makes_current_what_the_no_op_tracer_would(
    traceparent: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []
    no_op = tracing._no_op

    def noting(tracer: trace.Tracer) -> bool:
        calls.append(no_op(tracer))
        return calls[-1]

    with fresh_globals():
        monkeypatch.setattr(tracing, "_no_op", noting)
        fast = await spans_seen(traceparent)
        assert calls and all(calls)
        monkeypatch.setattr(tracing, "_no_op", lambda tracer: False)
        full = await spans_seen(traceparent)
    for ours, theirs in zip(fast, full, strict=True):
        assert not ours.is_recording() and not theirs.is_recording()
        assert ours.get_span_context() == theirs.get_span_context()
    expected = trace.get_current_span(tracing.parent_context(traceparent)).get_span_context()
    assert fast[0].get_span_context() == expected


async def test_with_a_provider_the_attempt_is_traced() -> None:
    with global_provider(TracerProvider()):
        seen = await spans_seen(TRACEPARENT)
    # (ended since: an SDK span records until its end)
    assert [cast(ReadableSpan, span).name for span in seen] == ["attempt architect", "attempt engineer"]

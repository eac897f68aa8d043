"""OpenTelemetry spans for runs, tasks, attempts and model calls, through ``opentelemetry-api`` only
(a no-op until the composition root installs a provider).

Each drive of a run, or each write made without a drive, is one ``run`` span, child of the
``traceparent`` recorded on ``run_created``, so a run resumed by another process continues its
caller's trace. Spans carry ids, names, numbers, outcomes, error codes and token counts, never
prompts, outputs, keys or headers; and no decision reads a span. The tree: docs/operations.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from orchestration.core.facts import Fact, TaskCompleted, TaskFailed
from orchestration.core.models import RunHead, Telemetry, TypedError
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded
from orchestration.core.vocabulary import RunStatus

#: the instrumentation scope of every span here
TRACER_NAME = "construct-mcp"

# W3C Trace Context explicitly (not the global propagator, which OTEL_PROPAGATORS may change):
# the stored form must read the same in every process.
_W3C = TraceContextTextMapPropagator()


def _tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span (in a tool handler: the MCP SDK's span of the
    call, child of the ``_meta`` traceparent), or None when there is no valid one."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get("traceparent")


def parent_context(traceparent: str | None) -> Context | None:
    """The context a stored ``traceparent`` names; None (a new trace) when absent or malformed."""
    if not traceparent:
        return None
    context = _W3C.extract({"traceparent": traceparent})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def link_call_to_run(head: RunHead) -> None:
    """In a tool call about a run (resume, approve, status, ...): the current span, the MCP SDK's
    span of the call, names the run and, when the call is in another trace than the run's (a
    host's later turn), links to the run's recorded parent. The run's own trace never changes
    after its start: the calls that move it are linked to it, not moved into it."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("construct.run.id", head.run_id)
    context = parent_context(head.traceparent)
    if context is None:
        return
    run_parent = trace.get_current_span(context).get_span_context()
    if run_parent.trace_id != span.get_span_context().trace_id:
        span.add_link(run_parent, {"construct.link": "run_trace"})


def _error_attributes(span: Span, error: TypedError) -> None:
    span.set_attribute("error.type", error.code)
    span.set_attribute("construct.error.retryable", error.retryable)
    if error.http_status is not None:
        span.set_attribute("http.response.status_code", error.http_status)
    span.set_status(StatusCode.ERROR, error.code)


class AttemptTrace:
    """What :meth:`DriveTrace.attempt` yields: :meth:`ended` records the attempt's outcome."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self._outcome = False

    @property
    def has_outcome(self) -> bool:
        """Whether :meth:`ended` was called (an attempt without one was cancelled)."""
        return self._outcome

    def ended(self, outcome: AttemptOutcome) -> None:
        """The worker's outcome of the attempt (what is recorded of it is the drive's part)."""
        self._outcome = True
        if isinstance(outcome, AttemptSucceeded):
            self.span.set_attribute("construct.attempt.outcome", "succeeded")
            return
        self.span.set_attribute("construct.attempt.outcome", "failed")
        _error_attributes(self.span, outcome.error)


def _no_op(tracer: trace.Tracer) -> bool:
    """Whether ``tracer`` starts its spans with the API's no-op tracer now (a proxy tracer does
    until a tracer provider is installed, and then uses that provider's tracer: told here by the
    API's public ``get_tracer_provider``, which is the proxy provider until one is installed)."""
    if isinstance(tracer, trace.ProxyTracer):
        return _no_provider()
    return isinstance(tracer, trace.NoOpTracer)


def _no_provider() -> bool:
    """Whether no tracer provider is installed (the API's proxy provider, or its no-op one): every
    span started now, by any tracer, is a no-op one."""
    return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


class _NoAttemptTrace(AttemptTrace):
    """The :class:`AttemptTrace` of an attempt without tracing: its span records nothing."""

    def ended(self, outcome: AttemptOutcome) -> None:
        return None


class _Untraced:
    """An attempt without tracing: ``span`` (a span that records nothing) is current while the
    worker calls, as ``trace.use_span`` would make it, and that is all."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Span) -> None:
        self._span = span
        self._token: object = None

    def __enter__(self) -> AttemptTrace:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return _NoAttemptTrace(self._span)

    def __exit__(self, *exc: object) -> None:
        otel_context.detach(self._token)  # type: ignore[arg-type]


class DriveTrace:
    """The spans of one drive of one run (the tree: docs/operations.md, Traces). :meth:`saw` opens the run
    span at the drive's first read of the run; :meth:`recorded` ends the task spans whose task a
    write ended; :meth:`attempt` wraps a worker's call; :meth:`drive` ends what is still open."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._tracer = _tracer()
        self._run: Span | None = None
        self._tasks: dict[str, Span] = {}
        self._status: RunStatus | None = None

    def saw(self, head: RunHead) -> None:
        """The drive read ``head``: the run span starts now if it has not yet."""
        self._status = head.status
        if self._run is not None:
            return
        self._run = self._tracer.start_span(
            f"run {head.chain.name}",
            context=parent_context(head.traceparent),
            attributes={
                "construct.run.id": head.run_id,
                "construct.chain.name": head.chain.name,
                "construct.worker_backend": head.contract.worker_backend,
            },
        )

    def recorded(self, facts: Sequence[Fact], head: RunHead) -> None:
        """The drive recorded ``facts``, giving ``head``."""
        self._status = head.status
        if self._tasks:
            # (Only a task span that is open can end.)
            for fact in facts:
                if isinstance(fact, TaskCompleted | TaskFailed):
                    self._end_task(fact)

    def _end_task(self, fact: TaskCompleted | TaskFailed) -> None:
        span = self._tasks.pop(fact.task_id, None)
        if span is None:
            return
        if isinstance(fact, TaskFailed):
            span.set_attribute("construct.task.status", "failed")
            _error_attributes(span, fact.error)
        else:
            span.set_attribute("construct.task.status", "done")
            span.set_attribute("construct.task.attempts", fact.attempt)
        span.end()

    def _task_span(self, head: RunHead, task_id: str) -> Span:
        span = self._tasks.get(task_id)
        if span is None:
            run = self._run if self._run is not None else trace.INVALID_SPAN
            span = self._tasks[task_id] = self._tracer.start_span(
                f"task {task_id}",
                context=trace.set_span_in_context(run),
                attributes={
                    "construct.run.id": head.run_id,
                    "construct.task.id": task_id,
                    "construct.step": head.task(task_id).step_name,
                },
            )
        return span

    def attempt(
        self, head: RunHead, task_id: str, number: int, possible_duplicate_call: bool
    ) -> AbstractContextManager[AttemptTrace]:
        """The span of attempt ``number`` of ``task_id`` (recorded as started in ``head``), current
        while the worker calls, so that the model call's span is its child.

        Without tracing (the tracer is the API's no-op one, and the run span, if any, records
        nothing) the no-op tracer would hand out the run span itself as the task's and the
        attempt's span: that span is made current, and nothing else is done (no attributes)."""
        run = self._run
        if (
            (run is None or isinstance(run, NonRecordingSpan))
            and task_id not in self._tasks
            and _no_op(self._tracer)
        ):
            return _Untraced(run if run is not None else trace.INVALID_SPAN)
        return self._traced_attempt(head, task_id, number, possible_duplicate_call)

    @contextmanager
    def _traced_attempt(
        self, head: RunHead, task_id: str, number: int, possible_duplicate_call: bool
    ) -> Iterator[AttemptTrace]:
        task = head.task(task_id)
        attributes: dict[str, Any] = {
            "construct.run.id": head.run_id,
            "construct.task.id": task_id,
            "construct.attempt.number": number,
            "construct.executor": head.contract.executor_for(head.step_of(task_id)),
            "construct.attempt.possible_duplicate_call": possible_duplicate_call,
        }
        orphan = next(
            (
                a
                for a in task.attempts
                if a.number == number - 1 and a.error is not None and a.error.code == "orphaned"
            ),
            None,
        )
        if orphan is not None:
            # The attempt before died with its process: its span was lost with it.
            attributes["construct.attempt.follows_orphan"] = orphan.number
            attributes["construct.orphan.started_at"] = orphan.started_at.isoformat()
        parent = trace.set_span_in_context(self._task_span(head, task_id))
        span = self._tracer.start_span(f"attempt {task_id}", context=parent, attributes=attributes)
        traced = AttemptTrace(span)
        with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
            try:
                yield traced
            finally:
                if not traced.has_outcome:
                    # Cancelled (orchestrate_cancel, a deadline, a lost lease, a shutdown).
                    span.set_attribute("construct.attempt.outcome", "none")

    @contextmanager
    def drive(self) -> Iterator[None]:
        """Around a whole drive: ends the task spans still open and the run span, with the run's
        status as the drive last saw it and the error that stopped the drive, if one did."""
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            for span in self._tasks.values():
                span.set_attribute("construct.task.status", "unfinished")
                span.end()
            self._tasks.clear()
            if self._run is not None:
                if self._status is not None:
                    self._run.set_attribute("construct.run.status", self._status.value)
                if error is not None:
                    code = getattr(error, "code", None)
                    self._run.set_attribute("error.type", code or type(error).__qualname__)
                    self._run.set_status(StatusCode.ERROR, code or type(error).__qualname__)
                self._run.end()


def traced_write(head: RunHead) -> AbstractContextManager[DriveTrace]:
    """Around a write a call decides and records itself on ``head`` (the run as the call holds
    it; no lease, no drive): the ``run <chain>`` span of that write, as a drive's, child of the
    run's recorded ``traceparent``. Tell the trace what was written with
    :meth:`DriveTrace.recorded`; the span ends with the write (with its error, if one stopped it).
    While no tracer provider is installed (every span the API's no-op one), a trace that does
    nothing, made once: a host's answer pays no span objects (about 4 us of its boundary)."""
    if _no_provider():
        return _UNTRACED_WRITE
    return _traced_write(head)


@contextmanager
def _traced_write(head: RunHead) -> Iterator[DriveTrace]:
    traced = DriveTrace(head.run_id)
    with traced.drive():
        traced.saw(head)
        yield traced


class _NoDriveTrace(DriveTrace):
    """The :class:`DriveTrace` of a write without tracing: it keeps nothing (one serves all)."""

    def saw(self, head: RunHead) -> None:
        return None

    def recorded(self, facts: Sequence[Fact], head: RunHead) -> None:
        return None


_UNTRACED_WRITE = nullcontext(_NoDriveTrace(""))


@dataclass
class ModelCallTrace:
    """What :func:`model_call` yields: record the response's or the failure's telemetry."""

    span: Span

    def succeeded(self, telemetry: Telemetry, finish_reason: str | None) -> None:
        self._usage(telemetry)
        if finish_reason is not None:
            self.span.set_attribute("gen_ai.response.finish_reasons", (finish_reason,))

    def failed(self, error: TypedError, telemetry: Telemetry) -> None:
        self._usage(telemetry)
        _error_attributes(self.span, error)

    def _usage(self, telemetry: Telemetry) -> None:
        span = self.span
        if telemetry.input_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", telemetry.input_tokens)
        if telemetry.output_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", telemetry.output_tokens)
        if telemetry.http_status is not None:
            span.set_attribute("http.response.status_code", telemetry.http_status)
        if telemetry.provider_request_id is not None:
            span.set_attribute("construct.provider_request_id", telemetry.provider_request_id)
        if telemetry.first_token_ms is not None:
            span.set_attribute("construct.stream.first_token_ms", telemetry.first_token_ms)
        if telemetry.stream_ms is not None:
            span.set_attribute("construct.stream.duration_ms", telemetry.stream_ms)


@contextmanager
def model_call(
    provider: str, model: str, base_url: str | None, max_tokens: int, structured: bool
) -> Iterator[ModelCallTrace]:
    """A model call's span (GenAI semantic conventions, client kind): ``chat <model>``, with the
    provider, the model, the output limit and type, the server's host — never the prompts, the
    answer or the key. Current while the call runs."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        # the older name of the same attribute, still what many backends group by
        "gen_ai.system": provider,
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.output.type": "json" if structured else "text",
    }
    host = urlsplit(base_url).hostname if base_url else None
    if host:
        attributes["server.address"] = host
    with _tracer().start_as_current_span(
        f"chat {model}",
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield ModelCallTrace(span)


__all__ = [
    "TRACER_NAME",
    "AttemptTrace",
    "DriveTrace",
    "ModelCallTrace",
    "current_traceparent",
    "link_call_to_run",
    "model_call",
    "parent_context",
]

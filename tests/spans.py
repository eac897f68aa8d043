"""Spans for the tests: an OpenTelemetry SDK tracer provider installed as the global one for one
test (the global is put back afterwards, as OpenTelemetry's own test utilities do), and the
finished spans of a run read back as a tree."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from mcp.types import RequestParamsMeta
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once
from opentelemetry.util.types import Attributes

#: a caller's span context, as a host would send it in ``_meta``
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN_ID}-01"
#: a tool call's ``_meta`` carrying it (an open map; mypy does not read its extra_items yet)
META = cast(RequestParamsMeta, {"traceparent": TRACEPARENT})


@contextmanager
def fresh_globals() -> Iterator[None]:
    """No global tracer provider while the block runs (one may be set, once, as in a new
    process); afterwards the one set meanwhile is shut down and the previous one is back."""
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    try:
        yield
    finally:
        installed = trace._TRACER_PROVIDER
        if isinstance(installed, TracerProvider):
            installed.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


@contextmanager
def global_provider(provider: TracerProvider) -> Iterator[None]:
    """``provider`` as the global tracer provider while the block runs."""
    with fresh_globals():
        trace.set_tracer_provider(provider)
        yield


class _Switch(trace.TracerProvider):
    """The global tracer provider of a test process once a test asked for spans: it hands out
    tracers that use :attr:`inner` *at each span*, or act as the API's no-op tracer while it is
    None. Libraries keep the tracer they got first (the MCP SDK holds one from import time, and
    it binds to the first global provider), so a test cannot swap the global provider itself and
    leave the tests after it untouched; it swaps :attr:`inner`."""

    def __init__(self) -> None:
        self.inner: TracerProvider | None = None

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace.Tracer:
        return _SwitchTracer(self, instrumenting_module_name)


class _SwitchTracer(trace.Tracer):
    def __init__(self, switch: _Switch, name: str) -> None:
        self._switch = switch
        self._name = name

    def _current(self) -> trace.Tracer:
        inner = self._switch.inner
        return inner.get_tracer(self._name) if inner is not None else trace.NoOpTracer()

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._current().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._current().start_as_current_span(*args, **kwargs)


_SWITCH = _Switch()


@contextmanager
def memory_spans() -> Iterator[InMemorySpanExporter]:
    """An in-memory exporter of every span ended while the block runs; before and after, spans
    are the API's no-op ones again (see :class:`_Switch`)."""
    if trace._TRACER_PROVIDER is None:
        trace.set_tracer_provider(_SWITCH)
    assert trace._TRACER_PROVIDER is _SWITCH, "another global tracer provider is installed"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _SWITCH.inner = provider
    try:
        yield exporter
    finally:
        _SWITCH.inner = None
        provider.shutdown()


@dataclass(frozen=True)
class FinishedSpan:
    """What the tests check of an exported span (from the SDK, or from a span file)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: Mapping[str, Any]
    status: str

    @classmethod
    def of(cls, span: ReadableSpan) -> FinishedSpan:
        context = span.get_span_context()
        assert context is not None
        parent = span.parent
        return cls(
            name=span.name,
            trace_id=format(context.trace_id, "032x"),
            span_id=format(context.span_id, "016x"),
            parent_id=format(parent.span_id, "016x") if parent is not None else None,
            attributes=dict(span.attributes or {}),
            status=span.status.status_code.name,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_id": self.parent_id,
            "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in self.attributes.items()},
            "status": self.status,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FinishedSpan:
        return cls(
            name=data["name"],
            trace_id=data["trace_id"],
            span_id=data["span_id"],
            parent_id=data["parent_id"],
            attributes=data["attributes"],
            status=data["status"],
        )


def finished(exporter: InMemorySpanExporter) -> list[FinishedSpan]:
    return [FinishedSpan.of(span) for span in exporter.get_finished_spans()]


def named(spans: Sequence[FinishedSpan], prefix: str) -> list[FinishedSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def recorded_values(spans: Sequence[FinishedSpan]) -> str:
    """Every attribute value of ``spans`` as one text (to check what is never recorded)."""
    return "\n".join(str(v) for s in spans for v in s.attributes.values())

"""Exporting traces: opt-in. Nothing leaves the process unless the ``otel`` extra is installed and the
standard ``OTEL_*`` variables ask for traces; otherwise the global tracer provider stays the API's
no-op one, and one installed before the server (``opentelemetry-instrument``) is left as it is.
``console`` writes to stderr: stdout is the stdio transport. The variables: docs/operations.md.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping

from opentelemetry import trace

log = logging.getLogger("construct.server")

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def wanted_exporters(env: Mapping[str, str]) -> tuple[str, ...]:
    """The trace exporters ``env`` asks for (empty: tracing stays off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    named = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if named:
        return tuple(n for n in (part.strip().lower() for part in named.split(",")) if n and n != "none")
    return ("otlp",) if any(env.get(name, "").strip() for name in _ENDPOINTS) else ()


def _nothing() -> None:
    return None


def configure_tracing(env: Mapping[str, str]) -> Callable[[], None]:
    """Install an SDK tracer provider exporting what ``env`` asks for (see the module's
    docstring); returns what flushes and stops it at shutdown (a no-op when nothing was
    installed). A missing extra or an unknown exporter is a logged warning, never a failure."""
    exporters = wanted_exporters(env)
    if not exporters:
        return _nothing
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        log.warning(
            "OTEL_* asks for traces, but the OpenTelemetry SDK is not installed: "
            "pip install 'construct-mcp[otel]'; no spans are exported",
            extra={"action": "tracing_unavailable"},
        )
        return _nothing
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return _nothing
    service = env.get("OTEL_SERVICE_NAME") or None
    if service is None and "service.name=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        service = "construct-mcp"
    attributes = {"service.name": service} if service else {}
    provider = TracerProvider(resource=Resource.create(attributes))
    installed: list[str] = []
    for name in exporters:
        exporter: SpanExporter
        if name == "console":
            exporter = ConsoleSpanExporter(out=sys.stderr)
        elif name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                log.warning(
                    "OTEL_TRACES_EXPORTER asks for otlp, but the OTLP exporter is not installed: "
                    "pip install 'construct-mcp[otel]'",
                    extra={"action": "tracing_unavailable"},
                )
                continue
            exporter = OTLPSpanExporter()
        else:
            log.warning(
                "unknown trace exporter %r in OTEL_TRACES_EXPORTER (this server knows otlp, console, none)",
                name,
                extra={"action": "tracing_unavailable"},
            )
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
        installed.append(name)
    if not installed:
        return _nothing
    trace.set_tracer_provider(provider)
    log.info("exporting traces: %s", ",".join(installed), extra={"action": "tracing_enabled"})
    return provider.shutdown


__all__ = ["configure_tracing", "wanted_exporters"]

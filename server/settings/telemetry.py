"""Exporting traces: opt-in, with the ``otel`` extra and the standard ``OTEL_*`` variables.

The spans themselves come from :mod:`orchestration.tracing` (and the MCP SDK's own server spans),
through ``opentelemetry-api`` alone. Nothing leaves the process unless both hold:

* the ``otel`` extra is installed (``pip install 'construct-mcp[otel]'``: the OpenTelemetry SDK
  and the OTLP/HTTP exporter), and
* the environment asks for traces: ``OTEL_TRACES_EXPORTER`` names exporters (``otlp``,
  ``console``; ``none`` asks for nothing), or an OTLP endpoint is set
  (``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, which imply ``otlp``).
  ``OTEL_SDK_DISABLED=true`` switches everything off.

Otherwise the global tracer provider stays the API's no-op one. The server and the ``runs`` commands
pass the ``OTEL_*`` variables the settings read with the others (``Settings.otel``). The rest is the
SDK's own reading of the standard variables: the endpoint, headers and timeout of the OTLP exporter
(``OTEL_EXPORTER_OTLP_*``), the sampler (``OTEL_TRACES_SAMPLER``), the resource
(``OTEL_SERVICE_NAME``, default ``construct-mcp``; ``OTEL_RESOURCE_ATTRIBUTES``), the batch
processor's limits (``OTEL_BSP_*``). ``console`` writes to stderr: stdout is the stdio transport.

A provider installed before the server configures one (``opentelemetry-instrument``, a test's
wrapper) is left as it is.
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

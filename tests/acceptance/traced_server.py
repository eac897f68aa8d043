"""``python -m tests.acceptance.traced_server serve ...``: the server (``construct-mcp``'s own entry
point) with a test-only span exporter installed first, which appends every span to the file
``CONSTRUCT_TEST_SPAN_FILE`` (one JSON object a line) the moment it ends. A process killed with
SIGKILL leaves the spans that had ended in the file; the ones it held open are lost, as with any
exporter. :func:`server.settings.telemetry.configure_tracing` leaves a provider installed before it alone."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.spans import FinishedSpan


class SpanFile(SpanExporter):
    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps(FinishedSpan.of(span).to_json()) + "\n")
        return SpanExportResult.SUCCESS


def read_span_file(path: Path) -> list[FinishedSpan]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [FinishedSpan.from_json(json.loads(line)) for line in lines if line]


def main() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(SpanFile(Path(os.environ["CONSTRUCT_TEST_SPAN_FILE"]))))
    trace.set_tracer_provider(provider)
    from server.cli.main import main as serve

    serve()


if __name__ == "__main__":
    main()

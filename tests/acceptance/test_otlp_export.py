"""Exporting is switched on by the standard OTEL_* variables (issue 14, part 1): a real server
(``python -m server serve``, the console script's entry point) with ``OTEL_EXPORTER_OTLP_ENDPOINT``
sends its spans over OTLP/HTTP to a collector (here a fake one that keeps what it receives), and
stdout stays the MCP transport. Without the variables, nothing is sent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.acceptance.harness import read_log, server_env, stdio_client_for
from tests.fakes.fake_provider import FakeProvider
from tests.spans import META, TRACE_ID

pytestmark = pytest.mark.slow

SECRET = "[secret-request-text]"


@contextmanager
def collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """A fake OTLP/HTTP collector: its base URL and the (path, body) of every POST it got."""
    received: list[tuple[str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            received.append((self.path, self.rfile.read(length)))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


async def run_chain(env: dict[str, str], log: Path) -> None:
    with anyio.fail_after(60):
        async with stdio_client_for(env, log) as client:
            arguments = {"request": f"Build it {SECRET}", "worker_backend": "provider", "wait_seconds": 30}
            result = await client.call_tool("orchestrate_start", arguments, meta=META)
            assert result.structured_content is not None, result
            assert result.structured_content["status"] == "completed", result.structured_content


def spans_of(received: list[tuple[str, bytes]]) -> list[tuple[str, str, dict[str, Any], str]]:
    """(name, trace id, attributes, service name) of every exported span."""
    spans = []
    for path, body in received:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: a.value for a in span.attributes}
                    spans.append((span.name, span.trace_id.hex(), attributes, resource["service.name"]))
    return spans


async def test_the_otel_variables_switch_otlp_export_on(tmp_path: Path) -> None:
    scenario = {"default": [{"text": "fine [secret-output]"}]}
    with FakeProvider(scenario) as fake, collector() as (endpoint, received):
        provider_env = {
            "CONSTRUCT_MODEL": "claude-test-1",
            "CONSTRUCT_ANTHROPIC_BASE_URL": fake.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-test-otlp",
        }
        log = tmp_path / "server.log"
        for home in ("on", "off"):
            (tmp_path / home).mkdir()
        await run_chain(
            server_env(tmp_path / "on", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, **provider_env), log
        )
        spans = spans_of(received)
        assert "exporting traces: otlp" in read_log(log)

        await run_chain(server_env(tmp_path / "off", **provider_env), tmp_path / "off.log")
        assert len(spans_of(received)) == len(spans), "no variables: nothing is exported"

    ours = [s for s in spans if s[0].split(" ")[0] in ("run", "task", "attempt", "chat")]
    names = sorted(s[0] for s in ours)
    assert names == sorted(
        ["run default"]
        + [f"{kind} {task}" for kind in ("task", "attempt") for task in ("architect", "engineer", "reviewer")]
        + ["chat claude-test-1"] * 3
    )
    assert {s[1] for s in ours} == {TRACE_ID}
    assert {s[3] for s in spans} == {"construct-mcp"}
    chat = next(s for s in ours if s[0].startswith("chat "))
    assert chat[2]["gen_ai.request.model"].string_value == "claude-test-1"
    assert chat[2]["gen_ai.usage.output_tokens"].int_value > 0
    everything = b"".join(body for _, body in received)
    for secret in (SECRET.encode(), b"secret-output", b"sk-ant-test-otlp"):
        assert secret not in everything

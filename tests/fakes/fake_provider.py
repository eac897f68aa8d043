"""A fake model provider over real HTTP, speaking both APIs the provider worker uses.

Endpoints::

    POST /v1/messages              Anthropic Messages
    POST /v1/chat/completions      OpenAI Chat Completions (x-request-id, like OpenAI / vLLM)
    POST /api/v1/chat/completions  the same, OpenRouter-flavoured (X-Generation-Id, "gen-" ids);
                                   use base URL ``{fake.base_url}/api`` to get it
    GET  /_calls                   {"engineer": 2, "default": 1}: calls per task key
    GET  /_requests                every request seen: path, task key, headers (auth included:
                                   it is a fake, and tests check the auth headers), JSON body
    POST /_scenario                replace the scenario (body: a scenario) and reset counters
    POST /_reset                   reset counters and recorded requests, keep the scenario

**Scenarios.** A scenario maps a *task key* to a script: the replies to serve, in order; when a
script runs out its last reply repeats. The task key comes from a ``[task:NAME]`` marker in the
system prompt (else the user prompt); requests without one use the key ``default``. A key with no
script of its own plays the ``default`` script (with its own cursor); with no ``default`` either, it
gets a success. As JSON (also the ``--scenario-file`` format)::

    {"engineer": [{"error": "rate_limited", "retry_after": 1}, {"text": "the patch"}],
     "reviewer": [{"reset": true}, {"delay_seconds": 5, "text": "late"}],
     "default":  [{"text": "ok"}]}

A reply (:class:`Reply`) is a success by default; ``error`` names a realistic failure, rendered in
the dialect of the endpoint that was called (see :data:`ERRORS`); ``reset`` closes the connection
with a TCP RST and no response; ``delay_seconds`` waits before answering; ``status``, ``body``,
``raw``, ``headers``, ``retry_after``, ``retry_after_ms`` and ``should_retry`` override parts of the
answer.

**In process** (from sync or async tests; the server runs in a background thread with its own event
loop, so it keeps answering while the test's loop awaits)::

    with FakeProvider({"default": [{"text": "hi"}]}) as fake:
        client = AnthropicClient(http, api_key="k", base_url=fake.base_url)
        ...
        assert fake.calls() == {"default": 1}

**As a process** (acceptance tests that need a separate server)::

    python -m tests.fakes.fake_provider --port 0 --scenario-file scenario.json

prints the bound port on stdout's first line, then serves until SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import uvicorn
from pydantic import BaseModel, ConfigDict, RootModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

log = logging.getLogger("construct.fake_provider")

ErrorKind = Literal[
    "rate_limited",
    "quota_exhausted",
    "billing",
    "overloaded",
    "server_error",
    "bad_gateway",
    "timeout",
    "auth",
    "permission",
    "invalid_request",
    "not_found",
    "context_length_exceeded",
    "content_filtered",
    "refusal",
    "moderation",
    "truncated",
    "reasoning_only",
    "empty_response",
    "malformed_response",
    "missing_content",
    "error_in_body",
    "finish_error",
]

#: What each ``error`` kind looks like on the wire (Anthropic / OpenAI-compatible).
ERRORS: Mapping[str, str] = {
    "rate_limited": "429 rate_limit_error + retry-after / 429 rate_limit_exceeded + retry-after",
    "quota_exhausted": "429 enforced_spend_limit_reached, x-should-retry: false / 429 insufficient_quota",
    "billing": "402 billing_error / 402 OpenRouter insufficient credits",
    "overloaded": "529 overloaded_error / 503 no instances available + retry-after",
    "server_error": "500 api_error / 500 server_error",
    "bad_gateway": "502 HTML page / 502 provider returned error",
    "timeout": "504 timeout_error / 504 JSON",
    "auth": "401 authentication_error / 401 invalid_api_key",
    "permission": "403 permission_error / 403 unsupported_country_region_territory",
    "invalid_request": "400 invalid_request_error / 400 invalid_request_error",
    "not_found": "404 not_found_error / 404 model_not_found",
    "context_length_exceeded": "400 prompt is too long / 400 context_length_exceeded",
    "content_filtered": "200 stop_reason refusal / 200 finish_reason content_filter",
    "refusal": "200 stop_reason refusal / 200 message.refusal",
    "moderation": "200 stop_reason refusal / 403 OpenRouter moderation",
    "truncated": "200 text + max_tokens / 200 text + length",
    "reasoning_only": "200 thinking only + max_tokens / 200 reasoning only + length",
    "empty_response": "200 no content, end_turn / 200 empty content, stop",
    "malformed_response": "200 HTML body / 200 HTML body",
    "missing_content": "200 no content list / 200 no choices",
    "error_in_body": "200 error object (overloaded_error) / 200 error object, code in_body_code (502)",
    "finish_error": "200 error object (api_error) / 200 finish_reason error",
}

_TASK_MARKER = re.compile(r"\[task:([A-Za-z0-9_.:\-]+)\]")
_TRANSPORT_KEY = "fake_provider.transport"


class Reply(BaseModel):
    """One scripted answer. Defaults make a success whose text is ``text``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str | None = None
    error: ErrorKind | None = None
    status: int | None = None
    body: Any = None
    raw: str | None = None
    headers: dict[str, str] = {}
    retry_after: float | str | None = None
    retry_after_ms: int | None = None
    should_retry: bool | None = None
    delay_seconds: float = 0.0
    reset: bool = False
    in_body_code: int | str | None = None
    input_tokens: int = 11
    output_tokens: int = 7


class Scenario(RootModel[dict[str, list[Reply]]]):
    """Task key -> replies in order (the last one repeats)."""


ScenarioLike = Scenario | Mapping[str, Any] | None


def as_scenario(value: ScenarioLike) -> Scenario:
    if value is None:
        return Scenario({})
    if isinstance(value, Scenario):
        return value
    return Scenario.model_validate(dict(value))


def task_key(texts: list[str]) -> str:
    for text in texts:
        match = _TASK_MARKER.search(text)
        if match:
            return match.group(1)
    return "default"


def _texts(value: Any) -> list[str]:
    """Prompt texts from a string, a list of content blocks / parts, or messages."""
    if isinstance(value, str):
        return [value]
    out: list[str] = []
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                out += _texts(item.get("text")) + _texts(item.get("content"))
            else:
                out += _texts(item)
    return out


class _State:
    """Everything the server mutates; guarded by one lock (handlers run on the server's thread,
    accessors on the test's)."""

    def __init__(self, scenario: Scenario) -> None:
        self.lock = threading.Lock()
        self.scenario = scenario
        self.calls: dict[str, int] = {}
        self.requests: list[dict[str, Any]] = []

    def next_reply(self, key: str, record: dict[str, Any]) -> tuple[Reply, int]:
        with self.lock:
            n = self.calls.get(key, 0) + 1
            self.calls[key] = n
            self.requests.append(record)
            scripts = self.scenario.root
            script = scripts.get(key) or scripts.get("default") or [Reply(text=f"fake answer for {key}")]
            return script[min(n, len(script)) - 1], n

    def reset(self, scenario: Scenario | None = None) -> None:
        with self.lock:
            if scenario is not None:
                self.scenario = scenario
            self.calls.clear()
            self.requests.clear()


# --- wire formats ---------------------------------------------------------------------------------

Wire = tuple[int, dict[str, str], Any, str | None]  # status, headers, JSON body, raw body

_HTML_502 = "<html><head><title>502 Bad Gateway</title></head><body><center>nginx</center></body></html>"


def _anthropic(reply: Reply, model: str, n: int) -> Wire:
    rid = f"req_fake{n:016d}"
    headers = {"request-id": rid}
    text = reply.text if reply.text is not None else "fake answer"

    def error(status: int, etype: str, message: str, **details: str) -> Wire:
        err: dict[str, Any] = {"type": etype, "message": message}
        if details:
            err["details"] = details
        return status, headers, {"type": "error", "error": err, "request_id": rid}, None

    def message(content: list[dict[str, Any]], stop: str) -> Wire:
        body = {
            "id": f"msg_fake{n:016d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
        }
        return 200, headers, body, None

    thinking = {
        "type": "thinking",
        "thinking": "Let me think this through carefully...",
        "signature": "EqQBfake",
    }
    match reply.error:
        case None:
            return message([{"type": "text", "text": text}], "end_turn")
        case "rate_limited":
            headers["retry-after"] = "1"
            return error(
                429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"
            )
        case "quota_exhausted":
            headers["x-should-retry"] = "false"
            return error(
                429,
                "rate_limit_error",
                "You have reached your specified workspace API usage limits.",
                error_code="enforced_spend_limit_reached",
            )
        case "billing":
            return error(402, "billing_error", "Your credit balance is too low to access the API.")
        case "overloaded":
            return error(529, "overloaded_error", "Overloaded")
        case "server_error":
            return error(500, "api_error", "Internal server error")
        case "bad_gateway":
            return 502, {**headers, "content-type": "text/html"}, None, _HTML_502
        case "timeout":
            return error(504, "timeout_error", "Request timed out")
        case "auth":
            return error(401, "authentication_error", "invalid x-api-key")
        case "permission":
            return error(
                403,
                "permission_error",
                "Your API key does not have permission to use the specified resource.",
            )
        case "invalid_request":
            return error(400, "invalid_request_error", "messages: Field required")
        case "not_found":
            return error(404, "not_found_error", f"model: {model}")
        case "context_length_exceeded":
            return error(400, "invalid_request_error", "prompt is too long: 215000 tokens > 200000 maximum")
        case "content_filtered" | "refusal" | "moderation":
            return message([], "refusal")
        case "truncated":
            return message([{"type": "text", "text": text}], "max_tokens")
        case "reasoning_only":
            return message([thinking], "max_tokens")
        case "empty_response":
            return message([], "end_turn")
        case "malformed_response":
            return 200, {**headers, "content-type": "text/html"}, None, _HTML_502
        case "missing_content":
            return 200, headers, {"id": f"msg_fake{n:016d}", "type": "message", "role": "assistant"}, None
        case "error_in_body":
            return error(200, "overloaded_error", "Overloaded")
        case "finish_error":
            return error(200, "api_error", "Internal server error")
    raise AssertionError(reply.error)  # pragma: no cover - ErrorKind is exhaustive


def _openai(reply: Reply, model: str, n: int, *, openrouter: bool) -> Wire:
    rid = f"gen-fake-{n:010d}" if openrouter else f"req_fake{n:024d}"
    headers = {"x-generation-id": rid} if openrouter else {"x-request-id": rid}
    text = reply.text if reply.text is not None else "fake answer"

    def error(status: int, message: str, etype: str | None, code: Any) -> Wire:
        return (
            status,
            headers,
            {"error": {"message": message, "type": etype, "param": None, "code": code}},
            None,
        )

    def completion(content: str | None, finish: str, **extra: Any) -> Wire:
        body = {
            "id": rid if openrouter else f"chatcmpl-fake{n:010d}",
            "object": "chat.completion",
            "created": 1764417600,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None, **extra},
                    "finish_reason": finish,
                }
            ],
            "usage": {
                "prompt_tokens": reply.input_tokens,
                "completion_tokens": reply.output_tokens,
                "total_tokens": reply.input_tokens + reply.output_tokens,
            },
        }
        return 200, headers, body, None

    match reply.error:
        case None:
            return completion(text, "stop")
        case "rate_limited":
            headers["retry-after"] = "1"
            return error(
                429,
                f"Rate limit reached for {model} on tokens per min (TPM): Limit 30000, Used 29000, "
                "Requested 2000. Please try again in 1s.",
                "tokens",
                "rate_limit_exceeded",
            )
        case "quota_exhausted":
            return error(
                429,
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                "insufficient_quota",
            )
        case "billing":
            return 402, headers, {"error": {"code": 402, "message": "Insufficient credits."}}, None
        case "overloaded":
            headers["retry-after"] = "1"
            return 503, headers, {"error": {"code": 503, "message": "No instances available"}}, None
        case "server_error":
            return error(500, "The server had an error while processing your request.", "server_error", None)
        case "bad_gateway":
            return 502, headers, {"error": {"code": 502, "message": "Provider returned error"}}, None
        case "timeout":
            return error(504, "Gateway timeout.", "timeout", None)
        case "auth":
            return error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        case "permission":
            return error(
                403,
                "Country, region, or territory not supported",
                "request_forbidden",
                "unsupported_country_region_territory",
            )
        case "invalid_request":
            return error(400, "Unrecognized request argument supplied: foo", "invalid_request_error", None)
        case "not_found":
            return error(
                404, f"The model `{model}` does not exist", "invalid_request_error", "model_not_found"
            )
        case "context_length_exceeded":
            return error(
                400,
                "This model's maximum context length is 128000 tokens. However, your messages resulted "
                "in 130512 tokens. Please reduce the length of the messages.",
                "invalid_request_error",
                "context_length_exceeded",
            )
        case "content_filtered":
            return completion(None, "content_filter")
        case "refusal":
            status, hdrs, body, raw = completion(None, "stop")
            body["choices"][0]["message"]["refusal"] = "I'm sorry, but I can't help with that."
            return status, hdrs, body, raw
        case "moderation":
            body = {
                "error": {
                    "code": 403,
                    "message": f"{model} requires moderation. Your input was flagged for 'violence'.",
                    "metadata": {"reasons": ["violence"], "flagged_input": "...", "model_slug": model},
                }
            }
            return 403, headers, body, None
        case "truncated":
            return completion(text, "length")
        case "reasoning_only":
            return completion("", "length", reasoning="Let me think this through carefully...")
        case "empty_response":
            return completion("", "stop")
        case "malformed_response":
            return 200, {**headers, "content-type": "text/html"}, None, _HTML_502
        case "missing_content":
            return 200, headers, {"id": rid, "object": "chat.completion", "model": model}, None
        case "error_in_body":
            code = reply.in_body_code if reply.in_body_code is not None else 502
            body = {"error": {"code": code, "message": "Upstream error from provider: connection lost"}}
            return 200, headers, body, None
        case "finish_error":
            status, hdrs, body, raw = completion("partial", "error")
            body["choices"][0]["error"] = {"code": 502, "message": "Upstream stream interrupted"}
            return status, hdrs, body, raw
    raise AssertionError(reply.error)  # pragma: no cover


def _apply_overrides(reply: Reply, wire: Wire) -> Response:
    status, headers, body, raw = wire
    headers = dict(headers)
    if reply.retry_after is not None:
        headers["retry-after"] = str(reply.retry_after)
    if reply.retry_after_ms is not None:
        headers["retry-after-ms"] = str(reply.retry_after_ms)
    if reply.should_retry is not None:
        headers["x-should-retry"] = "true" if reply.should_retry else "false"
    headers.update(reply.headers)
    status = reply.status if reply.status is not None else status
    if reply.raw is not None:
        return Response(reply.raw, status_code=status, headers=headers, media_type="text/plain")
    if reply.body is not None:
        return JSONResponse(reply.body, status_code=status, headers=headers)
    if raw is not None:
        return Response(raw, status_code=status, headers=headers)
    return JSONResponse(body, status_code=status, headers=headers)


# --- the app --------------------------------------------------------------------------------------


def build_app(state: _State, stopping: threading.Event) -> Any:
    """The ASGI app: a Starlette router behind a thin wrapper that exposes the connection's
    transport, which is how a scripted ``reset`` aborts the socket (ASGI has no such verb)."""

    async def serve(request: Request, dialect: str) -> Response:
        try:
            payload = await request.json()
        except ValueError:
            return JSONResponse({"error": {"message": "body is not JSON"}}, status_code=400)
        model = str(payload.get("model", "fake-model")) if isinstance(payload, dict) else "fake-model"
        if dialect == "anthropic":
            texts = _texts(payload.get("system")) + _texts(payload.get("messages"))
        else:
            messages = payload.get("messages") or []
            system = [m for m in messages if isinstance(m, dict) and m.get("role") == "system"]
            texts = _texts(system) + _texts([m for m in messages if m not in system])
        key = task_key(texts)
        record = {"path": request.url.path, "task": key, "headers": dict(request.headers), "body": payload}
        reply, n = state.next_reply(key, record)

        if reply.delay_seconds > 0:
            # Waits on the stop flag rather than sleeping, so stopping the server never waits out
            # a long scripted delay.
            await asyncio.to_thread(stopping.wait, reply.delay_seconds)
        if reply.reset:
            await _reset_connection(request)
            return Response(status_code=500)  # never sent: the connection is gone
        if dialect == "anthropic":
            wire = _anthropic(reply, model, n)
        else:
            wire = _openai(reply, model, n, openrouter=dialect == "openrouter")
        return _apply_overrides(reply, wire)

    async def messages(request: Request) -> Response:
        return await serve(request, "anthropic")

    async def chat(request: Request) -> Response:
        return await serve(request, "openai")

    async def openrouter_chat(request: Request) -> Response:
        return await serve(request, "openrouter")

    async def calls(request: Request) -> Response:
        with state.lock:
            return JSONResponse(dict(state.calls))

    async def requests(request: Request) -> Response:
        with state.lock:
            return JSONResponse(list(state.requests))

    async def scenario(request: Request) -> Response:
        state.reset(as_scenario(await request.json()))
        return JSONResponse({"ok": True})

    async def reset(request: Request) -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    app = Starlette(
        routes=[
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/api/v1/chat/completions", openrouter_chat, methods=["POST"]),
            Route("/_calls", calls, methods=["GET"]),
            Route("/_requests", requests, methods=["GET"]),
            Route("/_scenario", scenario, methods=["POST"]),
            Route("/_reset", reset, methods=["POST"]),
        ]
    )

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # uvicorn's h11 protocol hands the app its RequestResponseCycle.send; the cycle holds
            # the asyncio transport. Looked up defensively: without it, a reset fails loudly.
            scope[_TRANSPORT_KEY] = getattr(getattr(send, "__self__", None), "transport", None)
        await app(scope, receive, send)

    return asgi


async def _reset_connection(request: Request) -> None:
    transport = request.scope.get(_TRANSPORT_KEY)
    if transport is None:
        raise RuntimeError("a scripted reset needs uvicorn's h11 protocol (its transport was not found)")
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # SO_LINGER with a zero timeout turns close() into a TCP RST: the client sees ECONNRESET.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
    # Let uvicorn notice the lost connection before the handler returns, so it sends nothing.
    await asyncio.sleep(0.01)


# --- the server -----------------------------------------------------------------------------------


class FakeProvider:
    """The fake on ``host:port`` (port 0: any free port), run by :meth:`start` on a background
    thread or by :meth:`serve_forever` on the calling one. Accessors are thread-safe."""

    def __init__(self, scenario: ScenarioLike = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._state = _State(as_scenario(scenario))
        self._stopping = threading.Event()
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
        # and without it every answer on a kept-alive connection waits ~40 ms for a delayed ACK.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        # Listening before uvicorn starts means the port is usable the moment it is known: early
        # connections wait in the backlog instead of being refused.
        self._socket.listen(128)
        self.host, self.port = self._socket.getsockname()[:2]
        config = uvicorn.Config(
            build_app(self._state, self._stopping),
            log_config=None,  # leave the host process's logging configuration alone
            log_level="warning",
            access_log=False,
            http="h11",  # _reset_connection relies on the h11 protocol's transport
            ws="none",
            lifespan="off",
            loop="asyncio",
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The base URL for both adapters (``{base_url}/api`` for the OpenRouter flavour)."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> Self:
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="fake-provider", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the fake provider failed to start")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError("the fake provider did not start in time")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._socket.close()

    def serve_forever(self) -> None:
        """Serve on the calling thread until SIGINT / SIGTERM (uvicorn handles the signals)."""
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self._socket.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def calls(self) -> dict[str, int]:
        """Calls served per task key (resets included)."""
        with self._state.lock:
            return dict(self._state.calls)

    def calls_for(self, key: str) -> int:
        with self._state.lock:
            return self._state.calls.get(key, 0)

    def requests(self) -> list[dict[str, Any]]:
        """Every request seen, oldest first: ``path``, ``task``, ``headers`` (lowercase), ``body``."""
        with self._state.lock:
            return list(self._state.requests)

    def set_scenario(self, scenario: ScenarioLike) -> None:
        """Replace the scenario; counters, cursors and recorded requests start again from zero."""
        self._state.reset(as_scenario(scenario))

    def reset(self) -> None:
        self._state.reset()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fakes.fake_provider", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--scenario-file", type=Path, help="a JSON scenario (see the module docstring)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    scenario = json.loads(args.scenario_file.read_text()) if args.scenario_file else None
    fake = FakeProvider(scenario, host=args.host, port=args.port)
    # The one print in the package: the port, first line of stdout, for the parent process to read.
    print(fake.port, flush=True)
    log.info("fake provider serving on %s", fake.base_url, extra={"action": "fake_provider.started"})
    fake.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

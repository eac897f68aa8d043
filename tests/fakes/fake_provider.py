"""A fake model provider over real HTTP, speaking both APIs the provider worker uses.

Endpoints::

    POST /v1/messages              Anthropic Messages
    POST /v1/chat/completions      OpenAI Chat Completions (x-request-id, like OpenAI / vLLM)
    POST /api/v1/chat/completions  the same, OpenRouter-flavoured (X-Generation-Id, "gen-" ids);
                                   use base URL ``{fake.base_url}/api`` to get it
    GET  /_calls                   {"engineer": 2, "default": 1}: calls per task key
    GET  /_stats                   {"in_flight": 3, "peak_in_flight": 8, "first_at": {"r7/architect":
                                   1767225600.25, ...}}: requests being answered now, the most at
                                   once, and when (wall clock) each task key was first called
    GET  /_requests                every request seen: path, task key, headers (auth included:
                                   it is a fake, and tests check the auth headers), JSON body
    POST /_scenario                replace the scenario (body: a scenario) and reset counters
    POST /_reset                   reset counters and recorded requests, keep the scenario

**Scenarios.** A scenario maps a *task key* to a script: the replies to serve, in order; when a
script runs out its last reply repeats. The task key comes from a ``[task:NAME]`` marker in the
system prompt (else the user prompt); requests without one use the key ``default``. A key with no
script of its own plays the ``default`` script (with its own cursor); with no ``default`` either, it
gets a success.

**Per run.** When the prompts also carry a ``[run:NAME]`` marker (put it in the run's request: every
task's prompt repeats the request), the key is ``NAME/<task key>``, so that many runs of one chain
are counted apart (``{"r7/architect": 1, ...}``); such a key plays the script of ``NAME/<task>``,
else of ``<task>``, else ``default``, each run with its own cursor. As JSON (also the
``--scenario-file`` format)::

    {"engineer": [{"error": "rate_limited", "retry_after": 1}, {"text": "the patch"}],
     "reviewer": [{"reset": true}, {"delay_seconds": 5, "text": "late"}],
     "default":  [{"text": "ok"}]}

A reply (:class:`Reply`) is a success by default; ``error`` names a realistic failure, rendered in
the dialect of the endpoint that was called (see :data:`ERRORS`; the rendering lives in
:mod:`tests.fakes.provider_wire`); ``reset`` closes the connection with a TCP RST and no response;
``delay_seconds`` waits before answering; ``status``, ``body``, ``raw``, ``headers``,
``retry_after``, ``retry_after_ms`` and ``should_retry`` override parts of the answer. A success
for an Anthropic request that forces a tool (a typed step) whose ``text`` is a JSON object answers
with that tool's ``tool_use`` block, as a model would; OpenAI-style answers are always the text.

**Streams.** A request with ``"stream": true`` gets each 2xx answer as server-sent events in its
dialect (Anthropic: ``message_start`` ... ``message_stop``, ``input_json_delta`` for a forced tool;
OpenAI: chunks, the usage chunk, ``[DONE]``); error statuses stay plain JSON, as at the real APIs.
A reply's ``chunk_chars`` / ``chunk_delay_seconds`` script the pieces and their timing, ``cut``
(``reset`` / ``end`` / ``error``) after ``cut_after`` text deltas breaks the stream,
``refuse_stream`` answers a stream request with a 400 naming ``stream`` and ``plain`` ignores it.

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
import contextlib
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
from typing import Any, Self

import uvicorn
from pydantic import RootModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tests.fakes.provider_wire import (
    ERRORS,
    ErrorKind,
    Reply,
    Wire,
    anthropic_events,
    anthropic_stream_error,
    anthropic_wire,
    openai_chunks,
    openai_stream_error,
    openai_wire,
    sse,
    stream_refusal,
    to_response,
)

__all__ = ["ERRORS", "ErrorKind", "FakeProvider", "Reply", "Scenario", "main"]

log = logging.getLogger("construct.fake_provider")

_TASK_MARKER = re.compile(r"\[task:([A-Za-z0-9_.:\-]+)\]")
_RUN_MARKER = re.compile(r"\[run:([A-Za-z0-9_.:\-]+)\]")
# construct-mcp's own user prompts open with 'You are step 2 of 3 ("engineer", ...': the step name is
# the task id, so chains run by the provider worker are keyed by task without any marker. A later
# visit of a step (a loop) says its task id: '("engineer", the engineer), round 2 (task engineer~2)',
# so each task instance has a key (and a script) of its own.
_STEP_LINE = re.compile(
    r'You are step \d+ of \d+ \("([A-Za-z0-9_.:\-]+)"[^)\n]*\)(?:, round \d+ \(task ([A-Za-z0-9_.:~\-]+)\))?'
)
_TRANSPORT_KEY = "fake_provider.transport"


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
    task = "default"
    for pattern in (_TASK_MARKER, _STEP_LINE):
        match = next((m for m in map(pattern.search, texts) if m), None)
        if match:
            task = match.group(match.lastindex or 1)
            break
    run = next((m for m in map(_RUN_MARKER.search, texts) if m), None)
    return f"{run.group(1)}/{task}" if run else task


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
        self.streams: list[dict[str, Any]] = []
        #: while set, every request waits before it is answered (:meth:`FakeProvider.hold`)
        self.held = False
        self.in_flight = 0
        self.peak_in_flight = 0
        #: set, on the server's loop, when the server stops: it ends the scripted delays
        self.stop_signal: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        #: task key -> when it was first called (``time.time()``: comparable across processes)
        self.first_at: dict[str, float] = {}

    def next_reply(self, key: str, record: dict[str, Any]) -> tuple[Reply, int]:
        with self.lock:
            n = self.calls.get(key, 0) + 1
            self.calls[key] = n
            self.first_at.setdefault(key, time.time())
            self.requests.append(record)
            scripts = self.scenario.root
            task = key.rsplit("/", 1)[-1]
            script = (
                scripts.get(key)
                or scripts.get(task)
                or scripts.get("default")
                or [Reply(text=f"fake answer for {key}")]
            )
            return script[min(n, len(script)) - 1], n

    async def sleep_unless_stopped(self, seconds: float) -> None:
        """Sleep ``seconds`` on the server's loop, or until :meth:`wake_sleepers`."""
        if self.stop_signal is None:
            self.stop_signal, self.loop = asyncio.Event(), asyncio.get_running_loop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop_signal.wait(), seconds)

    def wake_sleepers(self) -> None:
        """End every :meth:`sleep_unless_stopped` now and from now on (from any thread)."""
        if self.loop is not None and self.stop_signal is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.stop_signal.set)

    def reset(self, scenario: Scenario | None = None) -> None:
        with self.lock:
            if scenario is not None:
                self.scenario = scenario
            self.calls.clear()
            self.first_at.clear()
            self.requests.clear()
            self.streams.clear()


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
        with state.lock:
            state.in_flight += 1
            state.peak_in_flight = max(state.peak_in_flight, state.in_flight)
        try:
            while state.held and not stopping.is_set():  # noqa: ASYNC110 (set from another thread)
                await asyncio.sleep(0.02)
            return await answer(request, payload, (dialect, key), model, reply, n)
        finally:
            with state.lock:
                state.in_flight -= 1

    async def answer(
        request: Request, payload: Any, task: tuple[str, str], model: str, reply: Reply, n: int
    ) -> Response:
        dialect, key = task
        if reply.delay_seconds > 0 and not stopping.is_set():
            # One sleep per request, cut short when the server stops (so stopping it never waits
            # out a long scripted delay); not a thread per waiting request (the default executor
            # runs only a handful), nor a wake-up every few milliseconds: thousands of delayed
            # answers can be pending at once, as at a real provider.
            await state.sleep_unless_stopped(reply.delay_seconds)
        if reply.reset:
            await _reset_connection(request)
            return Response(status_code=500)  # never sent: the connection is gone
        streamed = isinstance(payload, dict) and payload.get("stream") is True and not reply.plain
        if streamed and reply.refuse_stream:
            return to_response(reply, stream_refusal(dialect))
        if dialect == "anthropic":
            choice = payload.get("tool_choice") if isinstance(payload, dict) else None
            forced = choice.get("name") if isinstance(choice, dict) and choice.get("type") == "tool" else None
            wire = anthropic_wire(reply, model, n, tool=forced if isinstance(forced, str) else None)
        else:
            wire = openai_wire(reply, model, n, openrouter=dialect == "openrouter")
        if streamed and wire[0] == 200 and wire[3] is None and reply.raw is None and reply.body is None:
            return _stream_response(request, reply, (dialect, key), wire, (state, stopping))
        return to_response(reply, wire)

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

    async def stats(request: Request) -> Response:
        with state.lock:
            return JSONResponse(
                {
                    "in_flight": state.in_flight,
                    "peak_in_flight": state.peak_in_flight,
                    "first_at": state.first_at,
                }
            )

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
            Route("/_stats", stats, methods=["GET"]),
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


def _stream_response(
    request: Request,
    reply: Reply,
    where: tuple[str, str],
    wire: Wire,
    server: tuple[_State, threading.Event],
) -> Response:
    """A 2xx answer as server-sent events, with the reply's chunk timing and cut (see
    :class:`Reply`). When the stream ends, for whatever reason, ``state.streams`` records how
    far it got (``FakeProvider.streams``)."""
    (dialect, key), (state, stopping) = where, server
    _, headers, body, _ = wire
    if dialect == "anthropic":
        events, failure = anthropic_events(reply, body), anthropic_stream_error()
    else:
        events, failure = openai_chunks(reply, body), openai_stream_error(reply)

    async def send() -> Any:
        deltas, sent, first_at = 0, 0, None
        try:
            for event in events:
                if reply.cut is not None and deltas >= reply.cut_after:
                    if reply.cut == "reset":
                        await _reset_connection(request)
                    elif reply.cut == "error":
                        yield sse(failure)
                    return
                if event[2] and reply.chunk_delay_seconds > 0 and not stopping.is_set():
                    await asyncio.sleep(reply.chunk_delay_seconds)
                deltas += event[2]
                if event[2] and first_at is None:
                    first_at = time.monotonic()
                yield sse(event)
                sent += 1
        finally:
            ended = {"finished": sent == len(events), "at": time.monotonic(), "first_at": first_at}
            with state.lock:
                state.streams.append({"task": key, "deltas": deltas, **ended})

    response = StreamingResponse(send(), status_code=200, media_type="text/event-stream")
    response.headers.update({**headers, **reply.headers})
    return response


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
        self._state.wake_sleepers()
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

    def streams(self) -> list[dict[str, Any]]:
        """Every stream that ended, oldest first: ``task``, the text ``deltas`` sent, whether all
        its events were sent (``finished``; False: cut, or the client went away), when it
        ended (``at``, this process's ``time.monotonic()``) and when its first text delta was
        sent (``first_at``; None: none was)."""
        with self._state.lock:
            return list(self._state.streams)

    def hold(self, held: bool = True) -> None:
        """While held, every request waits (before its scripted delay) until ``hold(False)``."""
        self._state.held = held

    def in_flight(self) -> tuple[int, int]:
        """``(now, peak)``: requests being answered now, and the most at once so far."""
        with self._state.lock:
            return self._state.in_flight, self._state.peak_in_flight

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

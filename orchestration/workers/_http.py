"""The HTTP edge shared by the provider adapters: base URLs, one POST, and the one place where
``httpx2`` exceptions become typed errors (:func:`map_transport_exception`).

Nothing here retries: the durable step is the only retry layer (``notes/providers.md``). The pooled
client itself is made by :func:`orchestration.workers.model_calls.make_http_client`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

import httpx2

from orchestration.workers._redact import Redactor
from orchestration.workers.classify import AttemptFacts
from orchestration.workers.model_calls import ProviderCallError, ProviderRequest, ProviderResponse
from orchestration.workers.model_calls import ProviderErrorCode as Code

if TYPE_CHECKING:
    from httpx2._client import UseClientDefault

log = logging.getLogger("construct.provider")

Monotonic = Callable[[], float]


def normalize_base_url(base_url: str) -> str:
    """The base URL without a trailing ``/`` or ``/v1``; the adapters append ``/v1/...``.

    The convention is "everything before ``/v1``": ``https://api.anthropic.com``,
    ``https://api.openai.com``, ``https://openrouter.ai/api``, ``http://127.0.0.1:8000``. Since most
    documentation quotes base URLs *with* ``/v1`` (``https://openrouter.ai/api/v1``), that form is
    accepted too and means the same endpoint.
    """
    try:
        url = httpx2.URL(base_url)
    except httpx2.InvalidURL as exc:
        raise ValueError(f"invalid provider base URL {base_url!r}: {exc}") from exc
    if url.userinfo or url.query or url.fragment:
        # Checked first, and the URL is not quoted: credentials in a base URL must not reach a
        # message, and parameters in it would end up in logs.
        raise ValueError("provider base URL must not carry credentials, a query or a fragment")
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"provider base URL must be http(s)://host[:port][/prefix], got {base_url!r}")
    text = str(url).rstrip("/")
    if text.endswith("/v1"):
        text = text[: -len("/v1")]
    return text


def request_timeout(
    http: httpx2.AsyncClient, timeout_seconds: float | None
) -> httpx2.Timeout | UseClientDefault:
    """The client's timeouts, with the read timeout replaced when the request sets its own."""
    if timeout_seconds is None:
        return httpx2.USE_CLIENT_DEFAULT
    base = http.timeout
    return httpx2.Timeout(connect=base.connect, read=timeout_seconds, write=base.write, pool=base.pool)


@dataclass(frozen=True, slots=True)
class StreamFacts:
    """What a streamed answer measured: whether its final event arrived (``complete``), the time
    from the request to the first output delta (None: no delta came) and from the response's
    headers to its last event."""

    complete: bool
    first_token_ms: float | None
    stream_ms: float


@dataclass(frozen=True, slots=True)
class HttpExchange:
    """A response that arrived: status, headers, the raw body and the time it took. A streamed
    answer has no raw body: ``stream`` says what the stream measured and ``streamed`` is the
    answer its events rebuilt, in the shape of the non-streamed body (see :class:`StreamReader`)."""

    status: int
    headers: httpx2.Headers
    content: bytes
    latency_ms: float
    stream: StreamFacts | None = None
    streamed: Any = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def payload(self) -> Any:
        """The decoded JSON body (the rebuilt answer of a stream), or :data:`NOT_JSON`."""
        return self.streamed if self.stream is not None else decode_json(self.content)


def map_transport_exception(exc: httpx2.HTTPError) -> tuple[Code, str, bool]:
    """``(code, what happened, possible duplicate)`` for an exception raised by the HTTP client.

    The only translation of ``httpx2`` exceptions in the package. "Possible duplicate" is true when
    the request may have reached the provider in full before the failure (a read-side timeout or a
    connection dropped while waiting for the answer): a retry can then be billed twice.
    """
    # Order matters: the specific classes first, their bases last.
    table: tuple[tuple[type[httpx2.HTTPError], Code, str, bool], ...] = (
        (httpx2.ConnectTimeout, Code.TIMEOUT, "timed out connecting", False),
        (httpx2.PoolTimeout, Code.TIMEOUT, "timed out waiting for a pooled connection", False),
        (httpx2.WriteTimeout, Code.TIMEOUT, "timed out sending the request", False),
        (httpx2.ReadTimeout, Code.TIMEOUT, "no response within the read timeout", True),
        (httpx2.TimeoutException, Code.TIMEOUT, "timed out", True),
        (httpx2.ConnectError, Code.TRANSPORT_ERROR, "could not connect", False),
        (httpx2.WriteError, Code.TRANSPORT_ERROR, "connection failed while sending", False),
        (httpx2.ReadError, Code.TRANSPORT_ERROR, "connection failed while waiting for the answer", True),
        (httpx2.RemoteProtocolError, Code.TRANSPORT_ERROR, "connection closed without a valid answer", True),
        (httpx2.LocalProtocolError, Code.INVALID_REQUEST, "the request could not be sent as HTTP", False),
        (httpx2.UnsupportedProtocol, Code.INVALID_REQUEST, "unsupported URL scheme", False),
        (httpx2.ProxyError, Code.TRANSPORT_ERROR, "the proxy refused the connection", False),
        (httpx2.TooManyRedirects, Code.INVALID_REQUEST, "too many redirects", False),
        (httpx2.DecodingError, Code.MALFORMED_RESPONSE, "the response body could not be decoded", False),
        (httpx2.NetworkError, Code.TRANSPORT_ERROR, "network error", True),
        (httpx2.TransportError, Code.TRANSPORT_ERROR, "transport error", True),
    )
    for cls, code, what, duplicate in table:
        if isinstance(exc, cls):
            return code, what, duplicate
    return Code.TRANSPORT_ERROR, "HTTP error", True


async def post_json(
    http: httpx2.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    timeout_seconds: float | None,
    monotonic: Monotonic,
    facts: AttemptFacts,
) -> HttpExchange:
    """POST ``body`` as JSON and return whatever answer arrived, whatever its status.

    Raises :class:`ProviderCallError` when no answer arrived (see :func:`map_transport_exception`).
    ``facts`` names the provider and holds the redactor; its timing fields are filled here.
    Cancellation is not intercepted: only ``httpx2.HTTPError`` is caught.
    """
    started = monotonic()
    try:
        response = await http.post(
            url, json=body, headers=dict(headers), timeout=request_timeout(http, timeout_seconds)
        )
    except httpx2.HTTPError as exc:
        raise _transport_failure(exc, facts, monotonic, started) from exc
    return HttpExchange(
        status=response.status_code,
        headers=response.headers,
        content=response.content,
        latency_ms=_elapsed_ms(monotonic, started),
    )


class NotJson:
    """The marker :func:`decode_json` returns for a body that is not JSON (``null`` is JSON)."""

    __slots__ = ()


NOT_JSON: Final = NotJson()


def decode_json(content: bytes) -> Any:
    """The decoded JSON body, or :data:`NOT_JSON`."""
    try:
        return json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return NOT_JSON


def body_snippet(content: bytes, redact: Redactor, limit: int = 160) -> str:
    """The start of a non-JSON body, for a message (an HTML error page says "502 Bad Gateway")."""
    text = content[: limit * 4].decode("utf-8", errors="replace")
    return redact(text, limit=limit) or "<empty body>"


def first_header(headers: httpx2.Headers, *names: str) -> str | None:
    for name in names:
        value = headers.get(name)
        if value:
            return value.strip()
    return None


async def complete_once(
    http: httpx2.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    request: ProviderRequest,
    monotonic: Monotonic,
    facts: AttemptFacts,
    interpret: Callable[[HttpExchange, ProviderRequest], ProviderResponse],
    reader: StreamReader | None = None,
) -> ProviderResponse:
    """One attempt of an adapter's ``complete``: POST ``body`` (streamed through ``reader`` when
    given, see :func:`post_stream`), turn the answer into a response or a typed failure with the
    adapter's ``interpret``, and log the outcome either way."""
    try:
        if reader is not None:
            exchange = await post_stream(
                http,
                url,
                headers=headers,
                body=body,
                request=request,
                monotonic=monotonic,
                facts=facts,
                reader=reader,
            )
        else:
            exchange = await post_json(
                http,
                url,
                headers=headers,
                body=body,
                timeout_seconds=request.timeout_seconds,
                monotonic=monotonic,
                facts=facts,
            )
        response = interpret(exchange, request)
    except ProviderCallError as exc:
        log_outcome(facts.provider, request.model, exc)
        raise
    log_outcome(facts.provider, request.model, response)
    return response


def log_outcome(
    provider: str,
    model: str,
    outcome: ProviderResponse | ProviderCallError,
) -> None:
    """One log line per attempt: ids, status, timing, usage, the typed error. Never prompts, bodies,
    headers or keys (the error message is already scrubbed)."""
    if isinstance(outcome, ProviderResponse):
        t = outcome.telemetry
        log.info(
            "%s call to %s succeeded (status %s, %.0f ms, request id %s)",
            provider,
            model,
            t.http_status,
            t.latency_ms or 0.0,
            t.provider_request_id,
            extra={
                "action": "provider.call_succeeded",
                "provider": provider,
                "model": model,
                "http_status": t.http_status,
                "latency_ms": t.latency_ms,
                "provider_request_id": t.provider_request_id,
                "input_tokens": t.input_tokens,
                "output_tokens": t.output_tokens,
            },
        )
        return
    e, t = outcome.error, outcome.telemetry
    log.warning(
        "call to %s failed: %s (retryable=%s)",
        model,
        e.message,
        e.retryable,
        extra={
            "action": "provider.call_failed",
            "provider": provider,
            "model": model,
            "code": e.code,
            "retryable": e.retryable,
            "http_status": e.http_status,
            "retry_after_seconds": e.retry_after_seconds,
            "latency_ms": t.latency_ms,
            "provider_request_id": e.provider_request_id,
        },
    )


def _elapsed_ms(monotonic: Monotonic, started: float) -> float:
    return max(0.0, (monotonic() - started) * 1000.0)


# --- streaming --------------------------------------------------------------------------------------


class StreamReader(Protocol):
    """A dialect's reading of a stream: :meth:`feed` takes one server-sent event and returns the
    output text it adds (None: none); :attr:`done` says nothing more is to be read (the final
    event, or an ``error`` event); :attr:`complete` says the answer's end arrived (else the stream
    was cut short: ``truncated``); :meth:`payload` is the answer rebuilt in the non-streamed shape,
    for the adapter's ordinary interpretation."""

    @property
    def done(self) -> bool: ...

    @property
    def complete(self) -> bool: ...

    def feed(self, event: str, data: str) -> str | None: ...

    def payload(self) -> Any: ...


class SseLines:
    """Server-sent events from lines (the WHATWG rules the two APIs use: ``event:`` and ``data:``
    fields, a blank line ends an event, ``:`` starts a comment, several ``data:`` lines join with
    a newline)."""

    __slots__ = ("_data", "_event")

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def line(self, line: str) -> tuple[str, str] | None:
        """The event that ``line`` ends, as ``(event name, data)``, or None."""
        if not line:
            if not self._data:
                self._event = ""
                return None
            event = (self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


async def post_stream(
    http: httpx2.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    request: ProviderRequest,
    monotonic: Monotonic,
    facts: AttemptFacts,
    reader: StreamReader,
) -> HttpExchange:
    """POST ``body`` (which asks for a stream) and read the answer: a ``text/event-stream`` 2xx
    through ``reader``, handing each output delta to ``request.on_delta``; any other answer (an
    error status, or a server that ignored ``stream``) whole, as :func:`post_json` returns it.

    The stream is read to its end, or until ``reader`` is done: the connection is closed when this
    returns, fails or is cancelled (the ``async with`` of the response), so a cancelled call stops
    reading at once. A connection lost mid-stream raises like a lost answer (retryable, possible
    duplicate). Deltas are only handed on; what is recorded is the rebuilt whole answer.
    """
    started = monotonic()
    try:
        async with http.stream(
            "POST",
            url,
            json=body,
            headers=dict(headers),
            timeout=request_timeout(http, request.timeout_seconds),
        ) as response:
            kind = response.headers.get("content-type", "")
            if not response.is_success or not kind.startswith("text/event-stream"):
                content = await response.aread()
                return HttpExchange(
                    response.status_code, response.headers, content, _elapsed_ms(monotonic, started)
                )
            stream = await _read_events(response, reader, request, monotonic, started)
            return HttpExchange(
                status=response.status_code,
                headers=response.headers,
                content=b"",
                latency_ms=_elapsed_ms(monotonic, started),
                stream=stream,
                streamed=reader.payload(),
            )
    except httpx2.HTTPError as exc:
        raise _transport_failure(exc, facts, monotonic, started) from exc


async def _read_events(
    response: httpx2.Response,
    reader: StreamReader,
    request: ProviderRequest,
    monotonic: Monotonic,
    started: float,
) -> StreamFacts:
    opened = monotonic()
    first: float | None = None
    sse = SseLines()
    async for line in response.aiter_lines():
        event = sse.line(line)
        if event is None:
            continue
        delta = reader.feed(*event)
        if delta:
            if first is None:
                first = _elapsed_ms(monotonic, started)
            if request.on_delta is not None:
                request.on_delta(delta)
        if reader.done:
            break
    return StreamFacts(
        complete=reader.complete, first_token_ms=first, stream_ms=_elapsed_ms(monotonic, opened)
    )


def _transport_failure(
    exc: httpx2.HTTPError, facts: AttemptFacts, monotonic: Monotonic, started: float
) -> ProviderCallError:
    code, what, duplicate = map_transport_exception(exc)
    detail = str(exc).strip()
    message = f"{what} ({type(exc).__name__}{': ' + detail if detail else ''})"
    failed = AttemptFacts(
        provider=facts.provider, redact=facts.redact, latency_ms=_elapsed_ms(monotonic, started)
    )
    return failed.failure(code, message, possible_duplicate_call=duplicate)


_STREAM_REFUSED = re.compile(r"\bstream", re.IGNORECASE)


def stream_refused(exc: ProviderCallError) -> bool:
    """The endpoint refused the request's ``stream`` (or ``stream_options``): a 400/422 naming it."""
    return exc.error.http_status in (400, 422) and bool(_STREAM_REFUSED.search(exc.error.message))


class StreamChoice:
    """Whether an adapter asks its endpoint for streamed answers: ``enabled`` at first, and off for
    the life of the process once the endpoint refuses a stream (a 400/422 naming ``stream``, see
    :func:`stream_refused`); the refused attempt is then made again, plainly, within the same
    call, as the structured-output fallback does."""

    __slots__ = ("enabled", "provider")

    def __init__(self, provider: str, *, enabled: bool) -> None:
        self.provider = provider
        self.enabled = enabled

    async def call(self, attempt: Callable[[bool], Awaitable[ProviderResponse]]) -> ProviderResponse:
        """``attempt(stream)``, streamed while streaming is enabled, plainly after a refusal."""
        if self.enabled:
            try:
                return await attempt(True)
            except ProviderCallError as exc:
                if not stream_refused(exc):
                    raise
                self.enabled = False
                log.info(
                    "%s refused a streamed call; calling it without streaming from now on",
                    self.provider,
                    extra={"action": "provider.stream_fallback", "provider": self.provider},
                )
        return await attempt(False)

"""The Anthropic Messages API adapter: ``POST {base}/v1/messages``, one HTTP attempt per call,
streamed or not, classified into the provider error codes (:mod:`orchestration.workers.model_calls`).
A typed answer is asked for with one forced tool, ``answer``, whose input schema is the step's
schema, or through the prompt alone (``structured_output="prompt"``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any, Final

import httpx2

from orchestration.core.clock import Clock, SystemClock
from orchestration.workers._http import (
    NOT_JSON,
    HttpExchange,
    Monotonic,
    NotJson,
    StreamChoice,
    body_snippet,
    complete_once,
    decode_json,
    first_header,
    normalize_base_url,
)
from orchestration.workers._redact import Redactor, check_api_key
from orchestration.workers.classify import (
    AttemptFacts,
    apply_retry_hint,
    as_int,
    code_for_status,
    is_context_length,
    is_quota_code,
    parse_retry_after,
    possible_duplicate_for,
    should_retry_hint,
)
from orchestration.workers.model_calls import (
    ANSWER_TOOL,
    RETRYABLE_BY_CODE,
    ProviderCallError,
    ProviderRequest,
    ProviderResponse,
    StructuredOutputMode,
)
from orchestration.workers.model_calls import ProviderErrorCode as Code

__all__ = [
    "ANTHROPIC_BASE_URL",
    "DEFAULT_ANTHROPIC_VERSION",
    "AnthropicClient",
]

ANTHROPIC_BASE_URL: Final = "https://api.anthropic.com"
#: Pinned: under ``2026-10-21`` the API rejects ``temperature`` with a 400.
DEFAULT_ANTHROPIC_VERSION: Final = "2023-06-01"

_PROVIDER: Final = "anthropic"

_ERROR_TYPES: Final[Mapping[str, Code]] = {
    "invalid_request_error": Code.INVALID_REQUEST,
    "authentication_error": Code.AUTH,
    "permission_error": Code.AUTH,
    "billing_error": Code.QUOTA_EXHAUSTED,
    "not_found_error": Code.INVALID_REQUEST,
    "request_too_large": Code.INVALID_REQUEST,
    "rate_limit_error": Code.RATE_LIMITED,
    "api_error": Code.SERVER_ERROR,
    "timeout_error": Code.TIMEOUT,
    "overloaded_error": Code.OVERLOADED,
}

# The API answers an empty prepaid balance with a plain 400 invalid_request_error.
_LOW_CREDIT = re.compile(r"credit balance is too low", re.IGNORECASE)

_THINKING_BLOCKS: Final = frozenset({"thinking", "redacted_thinking"})


class AnthropicClient:
    """A :class:`~orchestration.workers.model_calls.ProviderClient` for the Anthropic Messages API.

    ``http`` is shared and owned by the caller (see
    :func:`~orchestration.workers.model_calls.make_http_client`).
    Arguments after ``http`` are keyword-only so that a key can never be passed where a URL is
    expected (and end up in a log line). ``clock`` dates ``retry-after`` HTTP-dates; ``monotonic``
    measures latency; both are injectable for tests. ``structured_output``: ``auto`` (a forced
    tool) or ``prompt`` (see the module docstring).
    """

    def __init__(
        self,
        http: httpx2.AsyncClient,
        *,
        api_key: str,
        base_url: str = ANTHROPIC_BASE_URL,
        anthropic_version: str = DEFAULT_ANTHROPIC_VERSION,
        structured_output: StructuredOutputMode = "auto",
        stream: bool = True,
        clock: Clock | None = None,
        monotonic: Monotonic | None = None,
    ) -> None:
        check_api_key(api_key)
        if structured_output not in ("auto", "prompt"):
            raise ValueError(
                f"anthropic structured_output must be 'auto' or 'prompt', not {structured_output!r}"
            )
        self._tool = structured_output == "auto"
        self._http = http
        self._api_key = api_key
        self._base_url = normalize_base_url(base_url)
        self._url = f"{self._base_url}/v1/messages"
        self._version = anthropic_version
        self._clock: Clock = clock or SystemClock()
        self._monotonic: Monotonic = monotonic or time.monotonic
        self._redact = Redactor([api_key])
        self._stream = StreamChoice(_PROVIDER, enabled=stream)

    @property
    def base_url(self) -> str:
        return self._base_url

    @property
    def streaming(self) -> bool:
        """Whether the next call asks for a stream (off once the endpoint refused one)."""
        return self._stream.enabled

    def __repr__(self) -> str:
        return f"AnthropicClient(base_url={self._base_url!r}, anthropic_version={self._version!r})"

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        """One ``POST /v1/messages`` (two when the endpoint refuses a stream: see the module
        docstring); see :meth:`ProviderClient.complete` for the contract."""

        async def attempt(stream: bool) -> ProviderResponse:
            body = self._body(request)
            if stream:
                body["stream"] = True
            return await complete_once(
                self._http,
                self._url,
                headers=self._headers(stream),
                body=body,
                request=request,
                monotonic=self._monotonic,
                facts=AttemptFacts(provider=_PROVIDER, redact=self._redact),
                interpret=self._interpret,
                reader=_MessageStream() if stream else None,
            )

        return await self._stream.call(attempt)

    def _headers(self, stream: bool = False) -> dict[str, str]:
        return {
            "x-api-key": self._api_key,
            "anthropic-version": self._version,
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
        }

    def _body(self, request: ProviderRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": [{"role": "user", "content": request.user}],
        }
        if request.system:  # the API rejects an empty system text block; omit it instead
            body["system"] = request.system
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.output_schema is not None and self._tool:
            body["tools"] = [
                {
                    "name": ANSWER_TOOL,
                    "description": "Give your answer to the task. Its input is your whole answer.",
                    "input_schema": dict(request.output_schema),
                }
            ]
            body["tool_choice"] = {"type": "tool", "name": ANSWER_TOOL}
        return body

    def _interpret(self, exchange: HttpExchange, request: ProviderRequest) -> ProviderResponse:
        payload = exchange.payload()
        obj: Mapping[str, Any] = payload if isinstance(payload, dict) else {}
        stream = exchange.stream
        body_request_id = obj.get("request_id")
        usage = obj.get("usage")
        facts = AttemptFacts(
            provider=_PROVIDER,
            redact=self._redact,
            latency_ms=exchange.latency_ms,
            http_status=exchange.status,
            request_id=first_header(exchange.headers, "request-id")
            or (body_request_id if isinstance(body_request_id, str) else None),
            input_tokens=_input_tokens(usage),
            output_tokens=as_int(usage.get("output_tokens")) if isinstance(usage, dict) else None,
            first_token_ms=stream.first_token_ms if stream is not None else None,
            stream_ms=stream.stream_ms if stream is not None else None,
        )
        if not exchange.ok or obj.get("type") == "error":
            # A 2xx whose body is an error object (the streamed-error shape) is classified by its
            # error.type, exactly like an HTTP error.
            raise self._error(exchange, payload, facts)
        if stream is not None and not stream.complete:
            raise facts.failure(
                Code.TRUNCATED,
                "the stream ended before message_stop; the answer is incomplete",
                retryable=True,
                possible_duplicate_call=True,
            )
        if payload is NOT_JSON:
            snippet = body_snippet(exchange.content, self._redact)
            raise facts.failure(
                Code.MALFORMED_RESPONSE, f"HTTP {exchange.status} body is not JSON: {snippet}"
            )
        if not isinstance(payload, dict):
            raise facts.failure(Code.MALFORMED_RESPONSE, "the response body is not a JSON object")
        return _parse_message(payload, facts, request)

    def _error(self, exchange: HttpExchange, payload: Any, facts: AttemptFacts) -> ProviderCallError:
        status = exchange.status
        error = payload.get("error") if isinstance(payload, dict) else None
        error = error if isinstance(error, dict) else {}
        etype = error.get("type") if isinstance(error.get("type"), str) else None
        raw_message = error.get("message")
        if isinstance(raw_message, str):
            message = raw_message
        elif payload is NOT_JSON:
            message = body_snippet(exchange.content, self._redact)
        else:
            message = "no error message"
        details = error.get("details")
        detail_code = details.get("error_code") if isinstance(details, dict) else None

        if is_quota_code(detail_code) or _LOW_CREDIT.search(message):
            code = Code.QUOTA_EXHAUSTED
        elif etype is not None and etype in _ERROR_TYPES:
            code = _ERROR_TYPES[etype]
        elif exchange.ok:
            code = Code.SERVER_ERROR  # an unknown error object inside a 2xx: the upstream failed
        else:
            code = code_for_status(status)
        if code is Code.INVALID_REQUEST and status in (400, 413, 200) and is_context_length(None, message):
            code = Code.CONTEXT_LENGTH_EXCEEDED

        retryable = apply_retry_hint(code, RETRYABLE_BY_CODE[code], should_retry_hint(exchange.headers))
        label = f"HTTP {status}" + (f" {etype}" if etype else "")
        if detail_code:
            label += f" ({detail_code})"
        return facts.failure(
            code,
            f"{label}: {message}",
            retryable=retryable,
            retry_after_seconds=parse_retry_after(exchange.headers, self._clock.now()),
            possible_duplicate_call=possible_duplicate_for(code, exchange.status),
        )


def _input_tokens(usage: object) -> int | None:
    """All prompt tokens: ``input_tokens`` excludes the cached ones, which are billed too."""
    if not isinstance(usage, dict):
        return None
    base = as_int(usage.get("input_tokens"))
    if base is None:
        return None
    cached = (as_int(usage.get(k)) for k in ("cache_creation_input_tokens", "cache_read_input_tokens"))
    return base + sum(c for c in cached if c is not None)


def _read_blocks(content: list[Any], facts: AttemptFacts) -> tuple[str, bool, str | None]:
    """The answer's text, whether it thought, and the forced answer tool's input as JSON text (None:
    not used); a malformed block is ``malformed_response``."""
    texts: list[str] = []
    thinking = False
    answer: str | None = None
    for block in content:
        if not isinstance(block, dict):
            raise facts.failure(Code.MALFORMED_RESPONSE, "a content block is not a JSON object")
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise facts.failure(Code.MALFORMED_RESPONSE, "a text block has no 'text' string")
            texts.append(text)
        elif kind in _THINKING_BLOCKS:
            thinking = True
        elif kind == "tool_use" and block.get("name") == ANSWER_TOOL and answer is None:
            tool_input = block.get("input")
            if not isinstance(tool_input, dict):
                raise facts.failure(Code.MALFORMED_RESPONSE, "the tool_use block has no 'input' object")
            answer = json.dumps(tool_input, ensure_ascii=False)
    return "".join(texts), thinking, answer


def _refuse_stop(
    stop: str | None, has_text: bool, thinking: bool, facts: AttemptFacts, max_tokens: int
) -> None:
    """The stop reasons that end an attempt whatever it wrote: refusal, context window, max_tokens."""
    if stop == "refusal":
        raise facts.failure(Code.CONTENT_FILTERED, "the model declined to answer (stop_reason 'refusal')")
    if stop == "model_context_window_exceeded":
        raise facts.failure(
            Code.CONTEXT_LENGTH_EXCEEDED,
            "the prompt and answer exceed the model's context window "
            "(stop_reason 'model_context_window_exceeded'); shorten the input",
        )
    if stop == "max_tokens":
        if not has_text and thinking:
            raise facts.failure(
                Code.REASONING_ONLY,
                f"the model spent max_tokens={max_tokens} on thinking and wrote no text; raise max_tokens",
            )
        raise facts.failure(
            Code.TRUNCATED,
            f"the answer was cut at max_tokens={max_tokens}; raise max_tokens or narrow the task",
        )


def _parse_message(
    payload: Mapping[str, Any], facts: AttemptFacts, request: ProviderRequest
) -> ProviderResponse:
    content = payload.get("content")
    if not isinstance(content, list):
        raise facts.failure(Code.MALFORMED_RESPONSE, "the response has no 'content' list")
    raw_stop = payload.get("stop_reason")
    stop = raw_stop if isinstance(raw_stop, str) else None
    text, thinking, answer = _read_blocks(content, facts)
    has_text = bool(text.strip())
    _refuse_stop(stop, has_text, thinking, facts, request.max_tokens)
    if answer is not None and request.output_schema is not None:
        return ProviderResponse(text=answer, telemetry=facts.telemetry(), stop_reason=stop)
    if stop in ("pause_turn", "tool_use"):
        # No answer tool was used, so the turn is not a finished answer.
        raise facts.failure(Code.TRUNCATED, f"the turn did not complete (stop_reason {stop!r})")
    if not has_text:
        if thinking:
            raise facts.failure(
                Code.REASONING_ONLY, f"the model produced thinking but no text (stop_reason {stop!r})"
            )
        raise facts.failure(Code.EMPTY_RESPONSE, f"the model returned no text (stop_reason {stop!r})")
    return ProviderResponse(text=text, telemetry=facts.telemetry(), stop_reason=stop)


class _MessageStream:
    """The :class:`~orchestration.workers._http.StreamReader` of a Messages stream: rebuilds the
    message (its content blocks by index, the stop reason, the usage of ``message_start`` and
    ``message_delta``) and yields the text and tool-JSON deltas. An ``error`` event becomes the
    payload (the error body's shape); an event whose data is not JSON makes the payload
    :data:`NOT_JSON` (``malformed_response``)."""

    def __init__(self) -> None:
        self.done = False
        self._message: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._error: dict[str, Any] | None = None
        self._broken = False

    @property
    def complete(self) -> bool:
        return self.done

    def feed(self, event: str, data: str) -> str | None:
        value = decode_json(data.encode())
        if not isinstance(value, dict):
            self._broken = True
            return None
        kind = value.get("type", event)
        if kind == "message_start" and isinstance(value.get("message"), dict):
            self._message = dict(value["message"])
        elif kind == "content_block_start" and isinstance(value.get("content_block"), dict):
            self._blocks[_index(value)] = dict(value["content_block"])
        elif kind == "content_block_delta" and isinstance(value.get("delta"), dict):
            return self._delta(_index(value), value["delta"])
        elif kind == "message_delta":
            self._message_delta(value)
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self._error, self.done = value, True
        return None

    def _delta(self, index: int, delta: Mapping[str, Any]) -> str | None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        kind, text = delta.get("type"), None
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            text = delta["text"]
            block["text"] = str(block.get("text") or "") + text
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            text = delta["partial_json"]
            self._json.setdefault(index, []).append(text)
        elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
            block["thinking"] = str(block.get("thinking") or "") + delta["thinking"]
        return text

    def _message_delta(self, value: Mapping[str, Any]) -> None:
        delta = value.get("delta")
        if isinstance(delta, dict) and "stop_reason" in delta:
            self._message["stop_reason"] = delta["stop_reason"]
        usage = value.get("usage")
        if isinstance(usage, dict):
            before = self._message.get("usage")
            merged = dict(before) if isinstance(before, dict) else {}
            merged.update({k: v for k, v in usage.items() if v is not None})
            self._message["usage"] = merged

    def payload(self) -> dict[str, Any] | NotJson:
        if self._error is not None:
            return self._error
        if self._broken:
            return NOT_JSON
        message = dict(self._message)
        if "content" in message:
            message["content"] = [self._block(i) for i in sorted(self._blocks)]
        return message

    def _block(self, index: int) -> dict[str, Any]:
        block = dict(self._blocks[index])
        if block.get("type") == "tool_use":
            text = "".join(self._json.get(index, []))
            block["input"] = decode_json(text.encode()) if text.strip() else block.get("input") or {}
        return block


def _index(value: Mapping[str, Any]) -> int:
    index = value.get("index")
    return index if isinstance(index, int) and not isinstance(index, bool) else 0

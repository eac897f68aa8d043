"""The OpenAI-compatible Chat Completions adapter (``POST {base}/v1/chat/completions``): one adapter
for OpenAI, OpenRouter, vLLM, llama.cpp and Ollama, one HTTP attempt per call, streamed or not.

The output limit travels in exactly one body field (:func:`default_max_tokens_field`); error bodies
are read leniently, and an HTTP 200 carrying an ``error`` is an error. A typed answer is asked for
as ``json_schema``, ``json_object`` or through the prompt; in ``auto`` mode a refused mode moves on
to the next within the attempt, and the mode an endpoint took is remembered for the process.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any, Final, Literal

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
    code_for_in_body_status,
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
    STRUCTURED_OUTPUT_MODES,
    ProviderCallError,
    ProviderRequest,
    ProviderResponse,
    StructuredOutputMode,
)
from orchestration.workers.model_calls import ProviderErrorCode as Code

__all__ = [
    "MAX_TOKENS_FIELDS",
    "OPENAI_BASE_URL",
    "OPENROUTER_BASE_URL",
    "MaxTokensField",
    "OpenAICompatClient",
    "default_max_tokens_field",
]

log = logging.getLogger("construct.provider")

OPENAI_BASE_URL: Final = "https://api.openai.com"
OPENROUTER_BASE_URL: Final = "https://openrouter.ai/api"

#: The body field that carries the output limit: OpenAI takes ``max_completion_tokens``; most other
#: OpenAI-compatible servers (llama.cpp, vLLM, Ollama, OpenRouter) read ``max_tokens``.
MaxTokensField = Literal["max_completion_tokens", "max_tokens"]
MAX_TOKENS_FIELDS: Final[tuple[MaxTokensField, ...]] = ("max_completion_tokens", "max_tokens")

_CONTENT_FILTER_CODES: Final = frozenset({"content_filter", "content_policy_violation"})
_MODERATION_MESSAGE = re.compile(r"moderation|flagged", re.IGNORECASE)
# A refusal of the structured-output request itself (not of the prompt): try the next mode.
_FORMAT_REFUSED = re.compile(r"response_format|json_schema|json_object", re.IGNORECASE)
#: The structured-output modes ``auto`` tries, best first.
_AUTO_MODES: Final[tuple[StructuredOutputMode, ...]] = ("json_schema", "json_object", "prompt")
# Extra headers whose values are credentials (a gateway's own key header): redacted like the key.
_SENSITIVE_HEADER = re.compile(r"auth|key|token|secret|cookie", re.IGNORECASE)


class OpenAICompatClient:
    """A :class:`~orchestration.workers.model_calls.ProviderClient` for Chat Completions endpoints.

    ``api_key`` is optional because local servers (vLLM, llama.cpp, Ollama) usually need none; when
    given it is sent as ``Authorization: Bearer``. ``extra_headers`` carries e.g. OpenRouter's
    attribution headers (``HTTP-Referer``, ``X-Title``); it cannot override the auth header.
    ``max_tokens_field`` names the one body field that carries the output limit; None (the default)
    picks it from the base URL (:func:`default_max_tokens_field`). ``structured_output`` says how
    a typed answer is asked for (see the module docstring).
    Arguments after ``http`` are keyword-only so that a key cannot be passed where a URL belongs.
    """

    def __init__(
        self,
        http: httpx2.AsyncClient,
        *,
        base_url: str = OPENROUTER_BASE_URL,
        api_key: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        max_tokens_field: MaxTokensField | None = None,
        structured_output: StructuredOutputMode = "auto",
        stream: bool = True,
        clock: Clock | None = None,
        monotonic: Monotonic | None = None,
    ) -> None:
        if api_key is not None:
            check_api_key(api_key)
        self._http = http
        self._api_key = api_key or None
        self._base_url = normalize_base_url(base_url)
        self._url = f"{self._base_url}/v1/chat/completions"
        self._provider = _provider_label(self._base_url)
        self._extra_headers = dict(extra_headers or {})
        if max_tokens_field is not None and max_tokens_field not in MAX_TOKENS_FIELDS:
            raise ValueError(
                f"max_tokens_field {max_tokens_field!r} is not one of: {', '.join(MAX_TOKENS_FIELDS)}"
            )
        self._max_tokens_field: MaxTokensField = max_tokens_field or default_max_tokens_field(self._base_url)
        if structured_output not in STRUCTURED_OUTPUT_MODES:
            raise ValueError(
                f"structured_output {structured_output!r} is not one of: {', '.join(STRUCTURED_OUTPUT_MODES)}"
            )
        self._structured_output: StructuredOutputMode = structured_output
        #: auto: the mode to start with, learnt from the endpoint's refusals (in process only)
        self._auto_start = 0
        self._clock: Clock = clock or SystemClock()
        self._monotonic: Monotonic = monotonic or time.monotonic
        sensitive = [v for k, v in self._extra_headers.items() if _SENSITIVE_HEADER.search(k)]
        self._redact = Redactor([api_key, *sensitive])
        self._stream = StreamChoice(self._provider, enabled=stream)

    @property
    def base_url(self) -> str:
        return self._base_url

    @property
    def streaming(self) -> bool:
        """Whether the next call asks for a stream (off once the endpoint refused one)."""
        return self._stream.enabled

    @property
    def provider(self) -> str:
        """``openai``, ``openrouter`` or ``openai-compat``: the prefix of every error message."""
        return self._provider

    @property
    def max_tokens_field(self) -> MaxTokensField:
        """The body field that carries the output limit (the only one sent)."""
        return self._max_tokens_field

    @property
    def structured_output_mode(self) -> StructuredOutputMode:
        """The mode the next typed request starts with (``auto`` resolved to what the endpoint took)."""
        if self._structured_output != "auto":
            return self._structured_output
        return _AUTO_MODES[self._auto_start]

    def __repr__(self) -> str:
        return f"OpenAICompatClient(base_url={self._base_url!r})"

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        """One ``POST /v1/chat/completions``; see :meth:`ProviderClient.complete` for the contract.
        A typed request (``output_schema``) under ``auto`` may make up to three posts, one per
        mode, when the endpoint refuses the earlier modes (see the module docstring)."""
        if request.output_schema is None:
            return await self._post(request, None)
        if self._structured_output != "auto":
            return await self._post(request, self._structured_output)
        while True:
            mode = _AUTO_MODES[self._auto_start]
            try:
                return await self._post(request, mode)
            except ProviderCallError as exc:
                if mode == "prompt" or not _format_refused(exc):
                    raise
                log.info(
                    "%s refused response_format %s; trying %s",
                    self._provider,
                    mode,
                    _AUTO_MODES[self._auto_start + 1],
                    extra={"action": "provider.structured_output_fallback", "provider": self._provider},
                )
                self._auto_start = max(self._auto_start, _AUTO_MODES.index(mode) + 1)

    async def _post(self, request: ProviderRequest, mode: StructuredOutputMode | None) -> ProviderResponse:
        async def attempt(stream: bool) -> ProviderResponse:
            body = self._body(request, mode)
            if stream:
                body["stream"] = True
                body["stream_options"] = {"include_usage": True}
            return await complete_once(
                self._http,
                self._url,
                headers=self._headers(stream),
                body=body,
                request=request,
                monotonic=self._monotonic,
                facts=AttemptFacts(provider=self._provider, redact=self._redact),
                interpret=self._interpret,
                reader=_ChunkStream() if stream else None,
            )

        return await self._stream.call(attempt)

    def _headers(self, stream: bool = False) -> dict[str, str]:
        headers = {k: v for k, v in self._extra_headers.items() if k.lower() != "authorization"}
        headers["content-type"] = "application/json"
        headers["accept"] = "text/event-stream" if stream else "application/json"
        if self._api_key is not None:
            headers["authorization"] = f"Bearer {self._api_key}"
        return headers

    def _body(self, request: ProviderRequest, mode: StructuredOutputMode | None = None) -> dict[str, Any]:
        messages = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.append({"role": "user", "content": request.user})
        body: dict[str, Any] = {
            "model": request.model,
            "messages": messages,
            self._max_tokens_field: request.max_tokens,
        }
        if request.temperature is not None:
            body["temperature"] = request.temperature
        schema = dict(request.output_schema) if request.output_schema is not None else None
        if schema is not None and mode == "json_schema":
            body["response_format"] = {
                "type": "json_schema",
                # Not strict: strict mode refuses ordinary schemas without
                # ``additionalProperties: false`` everywhere.
                "json_schema": {"name": ANSWER_TOOL, "schema": schema, "strict": False},
            }
        elif schema is not None and mode == "json_object":
            body["response_format"] = {"type": "json_object", "schema": schema}
        return body

    def _interpret(self, exchange: HttpExchange, request: ProviderRequest) -> ProviderResponse:
        payload = exchange.payload()
        obj: Mapping[str, Any] = payload if isinstance(payload, dict) else {}
        stream = exchange.stream
        body_id = obj.get("id")
        usage = obj.get("usage")
        facts = AttemptFacts(
            provider=self._provider,
            redact=self._redact,
            latency_ms=exchange.latency_ms,
            http_status=exchange.status,
            # OpenAI and most servers: x-request-id; OpenRouter: X-Generation-Id, which is also
            # the body's "id" (the fallback when a proxy dropped the header).
            request_id=first_header(exchange.headers, "x-request-id", "x-generation-id")
            or (body_id if isinstance(body_id, str) and body_id else None),
            input_tokens=as_int(usage.get("prompt_tokens")) if isinstance(usage, dict) else None,
            output_tokens=as_int(usage.get("completion_tokens")) if isinstance(usage, dict) else None,
            first_token_ms=stream.first_token_ms if stream is not None else None,
            stream_ms=stream.stream_ms if stream is not None else None,
        )
        if not exchange.ok:
            raise self._http_error(exchange, payload, facts)
        if payload is NOT_JSON:
            snippet = body_snippet(exchange.content, self._redact)
            raise facts.failure(
                Code.MALFORMED_RESPONSE, f"HTTP {exchange.status} body is not JSON: {snippet}"
            )
        if not isinstance(payload, dict):
            raise facts.failure(Code.MALFORMED_RESPONSE, "the response body is not a JSON object")
        if payload.get("error") is not None:
            raise self._in_body_error(exchange, payload["error"], facts)
        if stream is not None and not stream.complete:
            raise facts.failure(
                Code.TRUNCATED,
                "the stream ended without a finish_reason; the answer is incomplete",
                retryable=True,
                possible_duplicate_call=True,
            )
        return _parse_completion(payload, facts, request)

    def _http_error(self, exchange: HttpExchange, payload: Any, facts: AttemptFacts) -> ProviderCallError:
        status = exchange.status
        error = _error_object(payload)
        message = _message(error, exchange, self._redact)
        etype = error.get("type") if isinstance(error.get("type"), str) else None
        ecode = error.get("code")

        if is_quota_code(ecode) or is_quota_code(etype):
            code = Code.QUOTA_EXHAUSTED
        elif (isinstance(ecode, str) and ecode in _CONTENT_FILTER_CODES) or (
            status == 403 and _is_moderation(error, message)
        ):
            code = Code.CONTENT_FILTERED
        elif status in (400, 413, 422) and (
            is_context_length(ecode, message) or is_context_length(etype, message)
        ):
            code = Code.CONTEXT_LENGTH_EXCEEDED
        else:
            code = code_for_status(status)

        retryable = apply_retry_hint(code, RETRYABLE_BY_CODE[code], should_retry_hint(exchange.headers))
        label = f"HTTP {status}" + (f" {ecode}" if isinstance(ecode, str) and ecode else "")
        return facts.failure(
            code,
            f"{label}: {message}",
            retryable=retryable,
            retry_after_seconds=parse_retry_after(exchange.headers, self._clock.now()),
            possible_duplicate_call=possible_duplicate_for(code, exchange.status),
        )

    def _in_body_error(self, exchange: HttpExchange, raw: Any, facts: AttemptFacts) -> ProviderCallError:
        error = raw if isinstance(raw, dict) else {"message": raw}
        ecode = error.get("code")
        code = code_for_in_body_status(ecode)
        message = _message(error, exchange, self._redact)
        return facts.failure(
            code,
            f"HTTP {exchange.status} with an error object (code {ecode!r}): {message}",
            retry_after_seconds=parse_retry_after(exchange.headers, self._clock.now()),
            possible_duplicate_call=possible_duplicate_for(code, exchange.status),
        )


def _format_refused(exc: ProviderCallError) -> bool:
    """The endpoint refused the request's ``response_format`` (a 400/422 naming it)."""
    return exc.error.http_status in (400, 422) and bool(_FORMAT_REFUSED.search(exc.error.message))


def default_max_tokens_field(base_url: str) -> MaxTokensField:
    """``max_completion_tokens`` for OpenAI's own API (``api.openai.com``), else ``max_tokens``: the
    field llama.cpp, vLLM, Ollama and OpenRouter read (llama.cpp ignores ``max_completion_tokens``)."""
    host = httpx2.URL(normalize_base_url(base_url)).host
    return "max_completion_tokens" if host == "api.openai.com" else "max_tokens"


def _provider_label(base_url: str) -> str:
    host = httpx2.URL(base_url).host
    if host == "openrouter.ai" or host.endswith(".openrouter.ai"):
        return "openrouter"
    if host == "api.openai.com":
        return "openai"
    return "openai-compat"


def _error_object(payload: Any) -> Mapping[str, Any]:
    if not isinstance(payload, dict):
        return {}
    error = payload.get("error")
    if isinstance(error, dict):
        return error
    if isinstance(error, str):
        return {"message": error}
    if "message" in payload:  # vLLM's flat {"object": "error", "message": ..., "code": 400}
        return payload
    return {}


def _message(error: Mapping[str, Any], exchange: HttpExchange, redact: Redactor) -> str:
    message = error.get("message")
    if isinstance(message, str) and message:
        return message
    if decode_json(exchange.content) is NOT_JSON:
        return body_snippet(exchange.content, redact)
    return "no error message"


def _is_moderation(error: Mapping[str, Any], message: str) -> bool:
    """OpenRouter's moderation 403 carries ``metadata.reasons`` / ``flagged_input``. Only the fact is
    used: the flagged input is part of the prompt and never enters a message."""
    metadata = error.get("metadata")
    if isinstance(metadata, dict) and ("reasons" in metadata or "flagged_input" in metadata):
        return True
    return bool(_MODERATION_MESSAGE.search(message))


def _text_of(content: Any) -> str | None:
    """``message.content`` as text: a string, null (None -> ""), or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(p for p in parts if isinstance(p, str))
    return None


def _has_reasoning(message: Mapping[str, Any]) -> bool:
    # OpenRouter: "reasoning" (+ "reasoning_details"); vLLM, llama.cpp, DeepSeek: "reasoning_content".
    for key in ("reasoning", "reasoning_content"):
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return True
    details = message.get("reasoning_details")
    return isinstance(details, list) and len(details) > 0


def _parse_completion(
    payload: Mapping[str, Any], facts: AttemptFacts, request: ProviderRequest
) -> ProviderResponse:
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        raise facts.failure(Code.MALFORMED_RESPONSE, "the response has no 'choices'")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or not isinstance(message, dict):
        raise facts.failure(Code.MALFORMED_RESPONSE, "the first choice has no 'message' object")
    raw_finish = choice.get("finish_reason")
    finish = raw_finish if isinstance(raw_finish, str) else None

    if finish == "error":
        choice_error = choice.get("error")
        detail = choice_error.get("message") if isinstance(choice_error, dict) else None
        raise facts.failure(
            Code.SERVER_ERROR,
            "the upstream model failed mid-answer (finish_reason 'error')"
            + (f": {detail}" if isinstance(detail, str) and detail else ""),
        )
    text = _text_of(message.get("content"))
    if text is None:
        raise facts.failure(
            Code.MALFORMED_RESPONSE, "message.content is neither text, null nor a list of parts"
        )
    has_text = bool(text.strip())
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal.strip():
        raise facts.failure(Code.CONTENT_FILTERED, f"the model refused: {refusal}")
    if finish == "content_filter":
        raise facts.failure(Code.CONTENT_FILTERED, "the answer was withheld by a content filter")
    reasoning = _has_reasoning(message)
    if finish == "length":
        if not has_text and reasoning:
            raise facts.failure(
                Code.REASONING_ONLY,
                f"reasoning used the whole budget ({request.max_tokens} tokens) and left no answer; "
                "raise max_tokens",
            )
        raise facts.failure(
            Code.TRUNCATED,
            f"the answer was cut at {request.max_tokens} tokens (finish_reason 'length'); "
            "raise max_tokens or narrow the task",
        )
    if not has_text:
        if reasoning:
            raise facts.failure(
                Code.REASONING_ONLY, f"the model produced reasoning but no answer (finish_reason {finish!r})"
            )
        raise facts.failure(Code.EMPTY_RESPONSE, f"the model returned no text (finish_reason {finish!r})")
    return ProviderResponse(text=text, telemetry=facts.telemetry(), stop_reason=finish)


class _ChunkStream:
    """The :class:`~orchestration.workers._http.StreamReader` of a Chat Completions stream:
    rebuilds ``choices[0]`` (content, refusal, reasoning, ``finish_reason``, a choice's ``error``)
    and the usage chunk into a completion, and yields the content deltas. An error object in a
    chunk becomes the payload (``{"error": ...}``, an in-body error); ``[DONE]`` ends the stream;
    a chunk that is not JSON makes the payload :data:`NOT_JSON`. The stream is complete once a
    ``finish_reason`` came (a server may omit the usage chunk or ``[DONE]``)."""

    def __init__(self) -> None:
        self._ended = False
        self._id: str | None = None
        self._parts: dict[str, list[str]] = {"content": [], "refusal": [], "reasoning": []}
        self._finish: str | None = None
        self._choice_error: Any = None
        self._usage: Any = None
        self._error: Any = None
        self._broken = False
        self._seen = False

    @property
    def done(self) -> bool:
        return self._ended or self._error is not None

    @property
    def complete(self) -> bool:
        # [DONE] after no choice at all: a malformed answer, not a cut one
        return self._finish is not None or self._error is not None or (self._ended and not self._seen)

    def feed(self, event: str, data: str) -> str | None:
        if data.strip() == "[DONE]":
            self._ended = True
            return None
        value = decode_json(data.encode())
        if not isinstance(value, dict):
            self._broken = True
            return None
        if value.get("error") is not None:
            self._error = value["error"]
            return None
        if isinstance(value.get("id"), str):
            self._id = value["id"]
        if isinstance(value.get("usage"), dict):
            self._usage = value["usage"]
        choices = value.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            return None
        self._seen = True
        return self._choice(choice)

    def _choice(self, choice: Mapping[str, Any]) -> str | None:
        if isinstance(choice.get("finish_reason"), str):
            self._finish = choice["finish_reason"]
        if choice.get("error") is not None:
            self._choice_error = choice["error"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return None
        for key, names in (("refusal", ("refusal",)), ("reasoning", ("reasoning", "reasoning_content"))):
            self._parts[key] += [delta[n] for n in names if isinstance(delta.get(n), str)]
        text = _text_of(delta.get("content"))
        if text:
            self._parts["content"].append(text)
        return text or None

    def payload(self) -> dict[str, Any] | NotJson:
        if self._error is not None:
            return {"error": self._error}
        if self._broken:
            return NOT_JSON
        if not self._seen:
            return {"object": "chat.completion", **({"id": self._id} if self._id else {})}
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._parts["content"])}
        message["refusal"] = "".join(self._parts["refusal"]) or None
        if self._parts["reasoning"]:
            message["reasoning"] = "".join(self._parts["reasoning"])
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self._finish}
        if self._choice_error is not None:
            choice["error"] = self._choice_error
        completion: dict[str, Any] = {"object": "chat.completion", "choices": [choice]}
        if self._id is not None:
            completion["id"] = self._id
        if self._usage is not None:
            completion["usage"] = self._usage
        return completion

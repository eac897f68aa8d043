"""What the fake provider sends: one scripted :class:`Reply`, rendered in the Anthropic or the
OpenAI-compatible dialect with realistic bodies and headers (``notes/providers.md``).

:data:`ERRORS` lists each ``error`` kind and what it looks like on the wire in both dialects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, Response

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
    # Streaming (a request with "stream": true): a 2xx answer is sent as server-sent events, its
    # text in pieces of ``chunk_chars`` characters, ``chunk_delay_seconds`` apart; ``refuse_stream``
    # answers a stream request with a 400 naming ``stream``, ``plain`` answers it with JSON.
    # ``cut`` after ``cut_after`` text deltas: ``reset`` (TCP RST), ``end`` (the body ends without
    # the final event) or ``error`` (an error event: overloaded_error / an error object).
    chunk_chars: int = 8
    chunk_delay_seconds: float = 0.0
    refuse_stream: bool = False
    plain: bool = False
    cut: Literal["reset", "end", "error"] | None = None
    cut_after: int = 1


Wire = tuple[int, dict[str, str], Any, str | None]  # status, headers, JSON body, raw body

_HTML_502 = "<html><head><title>502 Bad Gateway</title></head><body><center>nginx</center></body></html>"


def anthropic_wire(reply: Reply, model: str, n: int, tool: str | None = None) -> Wire:
    """``tool``: the tool the request forces (typed output); a success whose text is a JSON
    object then answers as that tool's ``tool_use`` block, as a model would."""
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
            tool_input = _json_object(text) if tool is not None else None
            if tool_input is not None:
                block = {"type": "tool_use", "id": f"toolu_fake{n:012d}", "name": tool, "input": tool_input}
                return message([block], "tool_use")
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


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def openai_wire(reply: Reply, model: str, n: int, *, openrouter: bool) -> Wire:
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


def to_response(reply: Reply, wire: Wire) -> Response:
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


#: One server-sent event: (event name or None, data, whether it carries output text).
Event = tuple[str | None, str, bool]


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), max(1, size))] or [""]


def stream_refusal(dialect: str) -> Wire:
    """A 400 naming ``stream``, as an endpoint that does not stream answers."""
    if dialect == "anthropic":
        body = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "stream: streaming is not supported"},
        }
        return 400, {}, body, None
    error = {"message": "Unrecognized request argument supplied: stream", "type": "invalid_request_error"}
    return 400, {}, {"error": {**error, "param": "stream", "code": None}}, None


def anthropic_events(reply: Reply, message: dict[str, Any]) -> list[Event]:
    """The Messages stream of a message body (an error body: one ``error`` event)."""
    if message.get("type") == "error":
        return [("error", json.dumps(message), False)]
    if "content" not in message:  # a malformed message: sent as it is
        return [_event("message_start", message=message), _event("message_stop")]
    start = {**message, "content": [], "stop_reason": None, "usage": {**message["usage"], "output_tokens": 1}}
    events: list[Event] = [("message_start", json.dumps({"type": "message_start", "message": start}), False)]
    events.append(("ping", json.dumps({"type": "ping"}), False))
    for index, block in enumerate(message.get("content") or []):
        kind = block["type"]
        empty: dict[str, Any] = {"text": {"text": ""}, "thinking": {"thinking": ""}}.get(kind, {"input": {}})
        opening = {**block, **empty}
        events.append(_event("content_block_start", index=index, content_block=opening))
        if kind == "text":
            pieces = [("text_delta", "text", p, True) for p in _pieces(block["text"], reply.chunk_chars)]
        elif kind == "thinking":
            pieces = [("thinking_delta", "thinking", block["thinking"], False)]
        else:
            text = json.dumps(block["input"])
            pieces = [("input_json_delta", "partial_json", p, True) for p in _pieces(text, reply.chunk_chars)]
        for dtype, field, piece, counts in pieces:
            data = json.dumps(
                {"type": "content_block_delta", "index": index, "delta": {"type": dtype, field: piece}}
            )
            events.append(("content_block_delta", data, counts))
        events.append(_event("content_block_stop", index=index))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append(
        _event("message_delta", delta=delta, usage={"output_tokens": message["usage"]["output_tokens"]})
    )
    events.append(_event("message_stop"))
    return events


def _event(kind: str, **fields: Any) -> Event:
    return kind, json.dumps({"type": kind, **fields}), False


def anthropic_stream_error() -> Event:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return "error", json.dumps(error), False


def openai_chunks(reply: Reply, completion: dict[str, Any]) -> list[Event]:
    """The Chat Completions stream of a completion body (an error body: one error chunk)."""
    if "choices" not in completion:
        return [(None, json.dumps(completion), False), (None, "[DONE]", False)]
    base = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        entry = {"index": 0, "delta": delta, "finish_reason": finish, **extra}
        return json.dumps({**base, "choices": [entry]})

    events: list[Event] = [(None, chunk({"role": "assistant", "content": ""}), False)]
    if message.get("reasoning"):
        events.append((None, chunk({"reasoning": message["reasoning"]}), False))
    if message.get("refusal"):
        events.append((None, chunk({"refusal": message["refusal"]}), False))
    if message.get("content"):
        events += [
            (None, chunk({"content": p}), True) for p in _pieces(message["content"], reply.chunk_chars)
        ]
    extra = {"error": choice["error"]} if "error" in choice else {}
    events.append((None, chunk({}, choice["finish_reason"], **extra), False))
    events.append((None, json.dumps({**base, "choices": [], "usage": completion["usage"]}), False))
    events.append((None, "[DONE]", False))
    return events


def openai_stream_error(reply: Reply) -> Event:
    code = reply.in_body_code if reply.in_body_code is not None else 502
    error = {"error": {"code": code, "message": "Upstream error from provider: stream interrupted"}}
    return None, json.dumps(error), False


def sse(event: Event) -> bytes:
    name, data, _ = event
    return ((f"event: {name}\n" if name else "") + f"data: {data}\n\n").encode()

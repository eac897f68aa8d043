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

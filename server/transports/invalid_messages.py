"""Answers for messages that are no JSON-RPC request the SDK can serve: the SDK drops some unanswered
(a request whose ``id`` is an object, a line that is not JSON, a batch) and answers others with its
validator's raw text. Both transports check each message first (:func:`refusals`) and answer such
a one as JSON-RPC 2.0 §5 says, with ``invalid_request`` in its message and ``data.code``; a response
is never answered.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

import anyio
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, JSONRPCError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestration.errors import InvalidRequest
from server.sdk import SendsMessages
from server.transports.auth import send_json

log = logging.getLogger("construct.server")

#: JSON-RPC 2.0's protocol version string, the one a message must carry.
JSONRPC = "2.0"


def refusals(message: str | bytes) -> list[dict[str, Any]] | None:
    """None when ``message`` is a JSON-RPC message the SDK may take as it is; otherwise the error
    answers to send instead of handing it on: for a line that is not JSON, ``-32700`` with
    ``id: null``; for a batch (MCP has none since 2025-06-18), a ``-32600`` for each request in it
    with a usable id, else one with ``id: null``; for anything else that is no request,
    notification or response, ``-32600`` with the message's id when it is a string or an integer,
    else ``id: null`` (an object id cannot be echoed)."""
    try:
        parsed = json.loads(message)
    except (ValueError, RecursionError) as exc:
        reason = str(exc).split(":")[0] if isinstance(exc, ValueError) else "nested too deeply"
        return [_error(None, f"the message is not JSON ({reason})", PARSE_ERROR)]
    if isinstance(parsed, list):
        return _batch(parsed)
    if not isinstance(parsed, dict):
        return [_error(None, "a JSON-RPC message is an object")]
    problem = _problem(parsed)
    if problem is None:
        return None
    request_id = parsed.get("id")
    return [_error(request_id if _usable_id(request_id) else None, problem)]


def _batch(items: list[Any]) -> list[dict[str, Any]]:
    said = "batches are not supported (MCP has none since 2025-06-18): send each message on its own"
    ids = [m["id"] for m in items if isinstance(m, dict) and "method" in m and _usable_id(m.get("id"))]
    return [_error(request_id, said) for request_id in ids[:100]] or [_error(None, said)]


def _problem(message: Mapping[str, Any]) -> str | None:
    """What makes ``message`` no request or notification, or None (a response is left alone)."""
    if "method" not in message and ("result" in message or "error" in message):
        return None
    if message.get("jsonrpc") != JSONRPC:
        return 'a JSON-RPC message says "jsonrpc": "2.0"'
    if "id" in message and not _usable_id(message["id"]):
        return "a request's id is a string or an integer (not an object, array, boolean, fraction or null)"
    if not isinstance(message.get("method"), str):
        return "a request's method is a string" if "method" in message else "the message has no method"
    if message.get("params") is not None and not isinstance(message["params"], dict):
        return "a request's params are an object"
    return None


def _usable_id(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _error(request_id: str | int | None, said: str, code: int = INVALID_REQUEST) -> dict[str, Any]:
    exc = InvalidRequest(said)
    return {
        "jsonrpc": JSONRPC,
        "id": request_id,
        "error": {"code": code, "message": f"{exc.code}: {exc.message}", "data": {"code": exc.code}},
    }


def log_refused(transport: str) -> None:
    log.info(
        "refused a message that is no JSON-RPC request (%s)",
        transport,
        extra={"action": "invalid_message", "code": InvalidRequest.code},
    )


#: What the stdio relay ends the part of an over-long line with that it passed on before cutting it
#: (:mod:`server.transports.stdio`): never in a JSON text (a raw control character), so that part is
#: dropped here, not answered as a parse error (the relay answers the request as too large).
CUT_MARK = "\x1e"


class CheckedLines:
    """The lines of the stdio input, each checked (:func:`refusals`) before the SDK's transport
    reads it: a refused line is answered on the transport's write stream (given to
    :meth:`answer_on`) and not passed on; a blank line and a cut one (:data:`CUT_MARK`) are dropped."""

    def __init__(self, source: AsyncIterable[str]) -> None:
        self._source = source
        self._write: SendsMessages | None = None
        self._ready = anyio.Event()

    def answer_on(self, write: SendsMessages) -> None:
        self._write = write
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        async for line in self._source:
            if not line.strip() or line.rstrip("\r\n").endswith(CUT_MARK):
                continue
            errors = refusals(line)
            if errors is None:
                yield line
                continue
            log_refused("stdio")
            await self._ready.wait()
            assert self._write is not None
            for error in errors:
                await self._write.send(SessionMessage(JSONRPCError.model_validate(error)))


class InvalidMessageRefusal:
    """ASGI middleware in front of the Streamable HTTP and SSE apps: a POST whose body :func:`refusals`
    refuses is answered ``400`` with the error (a list of them for a batch) and never reaches the
    app. The body is read up to ``max_bytes`` to be checked, then handed on (held once here); a
    longer one is handed on unchecked as it arrives, for the app's own bound to refuse. Only
    JSON bodies are checked (another content type gets the app's own answer)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self._app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        content_type = Headers(scope=scope).get("content-type", "") if scope["type"] == "http" else ""
        if scope.get("method") != "POST" or not content_type.startswith("application/json"):
            await self._app(scope, receive, send)  # the app's own answer (405, 415, ...)
            return
        chunks: list[Message] = []
        size = 0
        while True:
            message = await receive()
            chunks.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes or not message.get("more_body", False):
                break
        complete = chunks[-1]["type"] == "http.request" and not chunks[-1].get("more_body", False)
        if complete and size <= self.max_bytes:
            body = b"".join(m.get("body", b"") for m in chunks)
            chunks = [{"type": "http.request", "body": body, "more_body": False}]  # held once
            errors = refusals(body)
            if errors is not None:
                log_refused("http")
                await send_json(send, 400, errors if len(errors) > 1 else errors[0])
                return

        async def replayed() -> Message:
            return chunks.pop(0) if chunks else await receive()

        await self._app(scope, replayed, send)

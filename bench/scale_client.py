"""A thin MCP client for the scale bench (issue 24): tool calls over Streamable HTTP as plain
JSON-RPC POSTs on one initialized session, so that the bench's own clients, which share the
machine's two cores with the servers and Postgres, spend little CPU per call.

With the MCP SDK's ``Client`` the bench process spent 9 s of CPU starting 800 runs on one
server (``ps``; that includes its own observer, so at most about 11 ms per ``orchestrate_start``);
with this client, 6 s at the same point of the same scenario. It
initializes a session (``initialize`` +
``notifications/initialized``), then each :meth:`ThinClient.call_tool` is one POST answered with
one JSON-RPC message (JSON, or an SSE stream whose last ``data:`` line is the answer), parsed as
the SDK parses it (``CallToolResult``). A host on another machine costs the servers the same; the
bench says which client it used (``--client``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from types import TracebackType
from typing import Any, Self

import httpx2
from mcp.types import CallToolResult

from tests.acceptance.cluster import Server

PROTOCOL = "2025-11-25"
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


class CallFailed(Exception):
    """A JSON-RPC error answer, or an HTTP status that is not 200."""


class ThinClient:
    """One session on one server's ``/mcp``; calls may overlap (one connection each, up to 64)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._http = httpx2.AsyncClient(
            timeout=httpx2.Timeout(60.0),
            limits=httpx2.Limits(max_connections=64, max_keepalive_connections=64),
        )
        self._ids = itertools.count(1)
        self._headers = dict(HEADERS)

    async def __aenter__(self) -> Self:
        answer = await self._post(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "construct-scale-bench", "version": "1"},
                },
            }
        )
        self._headers["mcp-protocol-version"] = PROTOCOL
        session = answer.headers.get("mcp-session-id")
        if session is not None:
            self._headers["mcp-session-id"] = session
        await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"}, expect=202)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if "mcp-session-id" in self._headers:
            with suppress(httpx2.HTTPError):  # the server may be going away already
                await self._http.delete(self.url, headers=self._headers)
        await self._http.aclose()

    async def _post(self, message: dict[str, Any], expect: int = 200) -> httpx2.Response:
        body = json.dumps(message)
        try:
            response = await self._http.post(self.url, headers=self._headers, content=body)
        except (httpx2.ReadError, httpx2.RemoteProtocolError):
            # A kept-alive connection the server closed as it was reused: sent again on a new one,
            # as HTTP clients do (the bench's starts carry idempotency keys, so a repeat is safe).
            response = await self._http.post(self.url, headers=self._headers, content=body)
        if response.status_code != expect:
            raise CallFailed(f"{message.get('method')}: HTTP {response.status_code}: {response.text[:300]}")
        return response

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> CallToolResult:
        response = await self._post(
            {
                "jsonrpc": "2.0",
                "id": next(self._ids),
                "method": "tools/call",
                "params": {"name": name, "arguments": arguments or {}},
            }
        )
        message = answer_of(response)
        if "error" in message:
            raise CallFailed(f"{name}: {message['error']}")
        return CallToolResult.model_validate(message["result"])


def answer_of(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a POST: the JSON body, or the last ``data:`` of an SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        if not data:
            raise CallFailed("an event stream without an answer")
        message: dict[str, Any] = json.loads(data[-1])
        return message
    parsed: dict[str, Any] = response.json()
    return parsed


@asynccontextmanager
async def thin_clients(running: Sequence[Server]) -> AsyncIterator[list[ThinClient]]:
    """One thin client session per server in ``running`` (repeat a server for more sessions)."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(ThinClient(s.url)) for s in running]

"""What the server relies on in the MCP SDK beyond its public API (server/sdk.py), and the public
behaviours it builds on (the bound of the transports' bodies, the sealing of request_state, the
hooks of the strict tools): each test fails when an SDK upgrade changes what it pins."""

from __future__ import annotations

import inspect
import json
from contextlib import AsyncExitStack
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.server import MCPServer
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.server.request_state import RequestStateBoundary
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import ASGIApp, Message

from server import sdk
from server.app import ConstructApp
from server.sdk import validated_before, validated_once
from server.settings.config import load_settings
from server.transports.http import sse_app, streamable_http_app


def test_mcp_server_keeps_a_low_level_server_with_replaceable_handlers() -> None:
    server: MCPServer[Any] = MCPServer("t")
    assert isinstance(server._lowlevel_server, Server)
    assert list(inspect.signature(Server.add_request_handler).parameters) == [
        "self",
        "method",
        "params_type",
        "handler",
    ]
    assert isinstance(server._custom_starlette_routes, list)


async def test_a_request_handler_replaces_the_sdks_own_and_sees_one_connection_per_client() -> None:
    server: MCPServer[Any] = MCPServer("t")
    seen: list[ServerSession] = []
    closed: list[str] = []

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        seen.append(ctx.session)
        if len(seen) == 1:
            assert sdk.on_connection_closed(ctx.session, lambda: closed.append("closed"))
        return types.ListResourcesResult(resources=[types.Resource(uri="run://x", name="x")])

    sdk.set_request_handler(server, "resources/list", types.PaginatedRequestParams, list_resources)
    for mode in ("legacy", "modern"):
        seen.clear()
        closed.clear()
        kwargs: dict[str, Any] = {"mode": "legacy"} if mode == "legacy" else {}
        async with Client(server, **kwargs) as client:
            for _ in range(2):
                listed = await client.list_resources()
                assert [str(r.uri) for r in listed.resources] == ["run://x"], mode
            if mode == "legacy":
                # One connection per client behind the per-request sessions, and its end is hooked.
                connections = [sdk.connection_of(session) for session in seen]
                assert isinstance(connections[0], Connection) and connections[0] is connections[1]
                assert isinstance(connections[0].exit_stack, AsyncExitStack)
                assert closed == []
        if mode == "legacy":
            assert closed == ["closed"], "the callback ran when the client went away"
        assert all(isinstance(getattr(s, "_connection", None), Connection) for s in seen), mode


def _manager(max_sessions: int) -> sdk.EvictingSessionManager:
    return sdk.EvictingSessionManager(app=Server("t"), max_sessions=max_sessions, session_idle_timeout=60)


def test_the_session_manager_admits_through_a_private_table() -> None:
    assert list(inspect.signature(StreamableHTTPSessionManager._admit_session).parameters) == [
        "self",
        "requestor",
    ]
    manager = _manager(1)
    assert manager._server_instances == {} and manager._session_owners == {}
    transport = manager._admit_session(None)
    assert isinstance(transport, StreamableHTTPServerTransport)
    assert manager._server_instances == {transport.mcp_session_id: transport}
    assert transport._requests_in_flight == 0 and transport.idle_scope is None


async def test_a_new_session_over_the_cap_closes_the_idlest_and_none_in_flight() -> None:
    manager = _manager(2)
    first, second = manager._admit_session(None), manager._admit_session(None)
    assert first is not None and second is not None
    first.idle_scope, second.idle_scope = anyio.CancelScope(deadline=5), anyio.CancelScope(deadline=9)
    third = manager._admit_session(None)
    assert third is not None and first.idle_scope.cancel_called and not second.idle_scope.cancel_called
    assert set(manager._server_instances) == {second.mcp_session_id, third.mcp_session_id}
    # Every session with a request in flight (or not yet served): the SDK's refusal.
    second._requests_in_flight = 1
    assert manager._admit_session(None) is None
    assert not second.idle_scope.cancel_called


async def _post(app: ASGIApp, path: str, chunks: list[bytes]) -> list[Message]:
    """POST ``chunks`` (no declared length) to ``app`` at ``path``, on raw ASGI; what it sent."""
    pending: list[Message] = [
        {"type": "http.request", "body": c, "more_body": n < len(chunks) - 1} for n, c in enumerate(chunks)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"example.com"), (b"content-type", b"application/json")],
    }
    await app(scope, receive, send)
    return sent


async def test_the_sdks_transports_bound_their_bodies_and_the_answer_is_the_typed_one() -> None:
    """The SDK's own 413 (max_request_body_size) is what bounds the body behind TypedBodyLimit:
    without it, these bodies would reach the transports (and get another answer)."""
    server: MCPServer[Any] = MCPServer("t")
    apps = {
        "/mcp": streamable_http_app(
            server, host="0.0.0.0", max_body_bytes=100, max_sessions=5, idle_seconds=60
        ),
        "/messages/": sse_app(server, host="0.0.0.0", max_body_bytes=100),
    }
    for path, app in apps.items():
        sent = await _post(app, path, [b"x" * 60] * 3)
        assert sent[0]["status"] == 413, path
        error = json.loads(sent[1]["body"])
        assert error["error"]["message"].startswith("too_large: the request body is over 100 bytes"), path


def test_the_server_seals_request_state_with_the_sdks_boundary(tmp_path: Any) -> None:
    server = ConstructApp(load_settings(env={"CONSTRUCT_HOME": str(tmp_path)})).build_server()
    assert sum(isinstance(m, RequestStateBoundary) for m in server.middleware) == 1


def test_the_strict_tools_hooks_keep_their_signatures() -> None:
    """server/mcp/arguments.py subclasses Tool and FuncMetadata (public classes) and overrides
    these methods; the SDK calling them differently would bypass the strict checks."""
    assert list(inspect.signature(Tool.run).parameters) == ["self", "arguments", "context", "convert_result"]
    assert list(inspect.signature(FuncMetadata.pre_parse_json).parameters) == ["self", "data"]
    assert list(inspect.signature(FuncMetadata.validate_arguments).parameters) == [
        "self",
        "arguments_to_validate",
    ]
    assert {"arg_model", "output_schema", "output_model", "wrap_output"} <= set(FuncMetadata.model_fields)
    assert "self.fn_metadata.validate_arguments(arguments)" in inspect.getsource(Tool.run)


def test_the_stdio_transport_reads_the_lines_it_is_given() -> None:
    """server.sdk.run_stdio hands the SDK's stdio transport its lines (each checked first) and
    answers on its write stream: the transport iterates over ``stdin`` and writes what is sent."""
    assert "stdin" in inspect.signature(stdio_server).parameters
    assert "async for line in stdin" in inspect.getsource(stdio_server)
    assert list(inspect.signature(Server.run).parameters)[:4] == [
        "self",
        "read_stream",
        "write_stream",
        "initialization_options",
    ]


async def test_tool_run_validates_the_very_dict_it_is_given() -> None:
    """``Tool.run`` hands its ``arguments`` object itself to ``validate_arguments``: what
    ``validated_once`` keeps for that dict is what the tool function then receives (the SDK
    copying the dict first would validate the call's arguments a second time, silently)."""
    seen: list[dict[str, Any]] = []

    class Watching(FuncMetadata):
        def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
            seen.append(arguments_to_validate)
            return validated_before(arguments_to_validate) or super().validate_arguments(
                arguments_to_validate
            )

    def shout(text: str) -> str:
        return text.upper()

    tool = Tool.from_function(shout)
    meta = tool.fn_metadata
    tool.fn_metadata = Watching(
        arg_model=meta.arg_model,
        output_schema=meta.output_schema,
        output_model=meta.output_model,
        wrap_output=meta.wrap_output,
    )
    arguments = {"text": "sent"}
    with validated_once(arguments, {"text": "checked"}):
        result = await tool.run(arguments, None)  # type: ignore[arg-type]
    assert seen[0] is arguments and result == "CHECKED"
    assert validated_before(arguments) is None  # only while the call runs

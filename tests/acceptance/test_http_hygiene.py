"""Transport hygiene over HTTP (issue 9, part 4), against real ``serve --transport streamable-http``
processes: message size bound, session cap and idle timeout, IPv6 loopback, tokens kept out of the
logs, subscriptions ending with their session, and shutdown with many open sessions."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from tests.acceptance.harness import SERVER_COMMAND, call, free_port, read_log, server_env

pytestmark = pytest.mark.slow

TOKEN = "canary-token-" + "5b8e1d2c9a7f4e30"
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


@asynccontextmanager
async def server(
    home: Path, *, host: str = "127.0.0.1", probe: str = "127.0.0.1", **extra_env: str
) -> AsyncIterator[tuple[anyio.abc.Process, int]]:
    """A Streamable HTTP server bound to ``host``; yields the process and port once ``probe``
    accepts connections; stopped with SIGTERM at the end (it must exit with status 0)."""
    port = free_port()
    env = {**server_env(home), "PATH": os.environ.get("PATH", ""), **extra_env}
    log_path = home / "server.log"
    with log_path.open("wb") as errlog:
        process = await anyio.open_process(
            [*SERVER_COMMAND, "serve", "--transport", "streamable-http", "--host", host, "--port", str(port)],
            env=env,
            stdout=errlog,
            stderr=errlog,
        )
        try:
            with anyio.fail_after(30):
                while True:
                    if process.returncode is not None:
                        raise AssertionError(f"server exited early:\n{read_log(log_path)}")
                    try:
                        stream = await anyio.connect_tcp(probe, port)
                    except OSError:
                        await anyio.sleep(0.1)
                        continue
                    await stream.aclose()
                    break
            yield process, port
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            with anyio.fail_after(20):
                returncode = await process.wait()
            await process.aclose()
    assert returncode == 0, read_log(log_path)


def result_of(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC message of a response, JSON or a one-event SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        message: dict[str, Any] = json.loads(data[-1])
        return message
    parsed: dict[str, Any] = response.json()
    return parsed


async def open_session(http: httpx2.AsyncClient, url: str) -> str:
    """A raw handshake-era session (initialize + initialized); its id."""
    response = await http.post(url, headers=HEADERS, json=INITIALIZE)
    assert response.status_code == 200, response.text
    session = response.headers["mcp-session-id"]
    done = await http.post(
        url,
        headers={**HEADERS, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"},
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
    )
    assert done.status_code == 202, done.text
    return session


async def rpc(
    http: httpx2.AsyncClient, url: str, session: str, method: str, params: dict[str, Any], *, ascii_only: bool
) -> tuple[int, dict[str, Any]]:
    """One request on ``session``; ``ascii_only`` escapes every non-ASCII character (``\\uXXXX``,
    12 bytes for a character outside the BMP), as some clients' JSON encoders do."""
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, ensure_ascii=ascii_only
    )
    response = await http.post(
        url,
        headers={**HEADERS, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"},
        content=body.encode(),
    )
    return response.status_code, result_of(response)


# ------------------------------------------------------------------------------------------------
# Message size


async def test_an_output_within_the_limit_is_accepted_whatever_its_characters(tmp_path: Path) -> None:
    """1 M characters (CONSTRUCT_MAX_OUTPUT_CHARS) of astral characters escape to 12 MB of JSON, of
    control characters to 6 MB: both are accepted; one character more is the runtime's too_large."""
    async with server(tmp_path) as (_, port), httpx2.AsyncClient(timeout=60) as http:
        url = f"http://127.0.0.1:{port}/mcp"
        session = await open_session(http, url)
        for output in ("\U0001f600" * 1_000_000, "\x01" * 1_000_000, "\x01" * 1_000_001):
            _, started = await rpc(
                http,
                url,
                session,
                "tools/call",
                # new_run: a run for each output (the same start again would be the first run)
                {
                    "name": "orchestrate_start",
                    "arguments": {"request": "big output", "chain": ["writer"], "new_run": True},
                },
                ascii_only=True,
            )
            run_id = started["result"]["structuredContent"]["run_id"]
            arguments = {"run_id": run_id, "task_id": "writer", "output": output}
            status, answer = await rpc(
                http,
                url,
                session,
                "tools/call",
                {"name": "orchestrate_resume", "arguments": arguments},
                ascii_only=True,
            )
            assert status == 200, answer
            result = answer["result"]
            if len(output) <= 1_000_000:
                assert not result.get("isError"), result["content"][0]["text"][:300]
                assert result["structuredContent"]["status"] == "completed"
            else:
                assert result["isError"]
                assert "too_large" in result["content"][0]["text"]


async def test_a_body_over_the_bound_is_a_typed_too_large_error(tmp_path: Path) -> None:
    limits = {"CONSTRUCT_MAX_OUTPUT_CHARS": "1000", "CONSTRUCT_MAX_REQUEST_CHARS": "1000"}
    async with server(tmp_path, **limits) as (_, port):
        url = f"http://127.0.0.1:{port}/mcp"
        async with Client(url) as client:
            view = await call(client, "orchestrate_start", request="small limits", chain=["writer"])
            with pytest.raises(MCPError) as refused:
                await client.call_tool(
                    "orchestrate_resume",
                    {"run_id": view["run_id"], "task_id": "writer", "output": "\x01" * 400_000},
                )
            assert refused.value.error.message.startswith("too_large: the request body is over ")
            # Still usable afterwards, and an output just over the limit is the runtime's too_large.
            result = await client.call_tool(
                "orchestrate_resume", {"run_id": view["run_id"], "task_id": "writer", "output": "x" * 1001}
            )
            assert result.is_error
        async with httpx2.AsyncClient() as http:
            response = await http.post(url, headers=HEADERS, content=b" " * 2_000_000)
            assert response.status_code == 413
            error = response.json()["error"]
            assert error["message"].startswith("too_large: ")
    assert "action=body_too_large" in read_log(tmp_path / "server.log")


# ------------------------------------------------------------------------------------------------
# Sessions


async def test_a_new_client_closes_the_session_idle_the_longest_when_the_server_is_full(
    tmp_path: Path,
) -> None:
    async with (
        server(tmp_path, CONSTRUCT_HTTP_MAX_SESSIONS="3") as (_, port),
        httpx2.AsyncClient(timeout=30) as http,
    ):
        url = f"http://127.0.0.1:{port}/mcp"
        abandoned = [await open_session(http, url) for _ in range(3)]  # handshakes nobody uses again
        # The server is full: a new handshake-era session (2026-07-28 clients hold none) makes room
        # by closing the session idle the longest.
        async with Client(url, mode="legacy") as client:
            assert "orchestrate_start" in {t.name for t in (await client.list_tools()).tools}
        ping = {"jsonrpc": "2.0", "id": 9, "method": "ping"}
        statuses = []
        for session in abandoned:
            response = await http.post(
                url,
                headers={**HEADERS, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"},
                json=ping,
            )
            statuses.append(response.status_code)
        assert statuses == [404, 200, 200], "only the session idle the longest was closed"

        # Every session busy (each holds its GET stream open): a new one is refused with 503.
        async with AsyncExitStack() as streams:
            busy = [await open_session(http, url) for _ in range(3)]
            for session in busy:
                response = await streams.enter_async_context(
                    http.stream(
                        "GET",
                        url,
                        headers={
                            "Accept": "text/event-stream",
                            "mcp-session-id": session,
                            "mcp-protocol-version": "2025-11-25",
                        },
                    )
                )
                assert response.status_code == 200
            refused = await http.post(url, headers=HEADERS, json=INITIALIZE)
            assert refused.status_code == 503
            assert refused.json()["error"]["message"]


async def test_an_idle_session_is_closed(tmp_path: Path) -> None:
    async with (
        server(tmp_path, CONSTRUCT_HTTP_SESSION_IDLE_SECONDS="1") as (_, port),
        httpx2.AsyncClient(timeout=30) as http,
    ):
        url = f"http://127.0.0.1:{port}/mcp"
        session = await open_session(http, url)
        headers = {**HEADERS, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
        # Each request restarts the idle countdown: ask far less often than the timeout.
        with anyio.fail_after(30):
            while True:
                await anyio.sleep(3)
                response = await http.post(
                    url, headers=headers, json={"jsonrpc": "2.0", "id": 2, "method": "ping"}
                )
                if response.status_code == 404:
                    break
                assert response.status_code == 200


async def test_a_sessions_subscriptions_end_with_it_over_http(tmp_path: Path) -> None:
    async with server(tmp_path) as (_, port):
        url = f"http://127.0.0.1:{port}/mcp"
        async with Client(url, mode="legacy") as client:
            view = await call(client, "orchestrate_start", request="watch me", chain=["writer"])
            with pytest.warns(MCPDeprecationWarning):
                await client.subscribe_resource(f"run://{view['run_id']}")
                with pytest.raises(MCPError, match=r"^invalid_argument: "):
                    await client.subscribe_resource("run://../watched")
        # The client closed (DELETE): the server forgets the session's subscription.
        log_path = tmp_path / "server.log"
        with anyio.fail_after(10):
            while "action=subscriptions_dropped" not in read_log(log_path):  # noqa: ASYNC110
                await anyio.sleep(0.1)
        assert "dropped its 1 resource subscription(s)" in read_log(log_path)


async def test_shutdown_with_many_open_sessions(tmp_path: Path) -> None:
    """50 sessions, each holding its GET stream open, and SIGTERM: the server exits cleanly within a
    generous bound (the figure is printed; bench it for speed)."""
    async with (
        server(tmp_path) as (process, port),
        httpx2.AsyncClient(timeout=30, limits=httpx2.Limits(max_connections=200)) as http,
        AsyncExitStack() as streams,
    ):
        url = f"http://127.0.0.1:{port}/mcp"
        for _ in range(50):
            session = await open_session(http, url)
            response = await streams.enter_async_context(
                http.stream(
                    "GET",
                    url,
                    headers={
                        "Accept": "text/event-stream",
                        "mcp-session-id": session,
                        "mcp-protocol-version": "2025-11-25",
                    },
                )
            )
            assert response.status_code == 200
        started = anyio.current_time()
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(10):
            returncode = await process.wait()
        print(f"shutdown with 50 open sessions: {anyio.current_time() - started:.2f} s")
        assert returncode == 0, read_log(tmp_path / "server.log")


# ------------------------------------------------------------------------------------------------
# Addresses and tokens


def ipv6_loopback_unavailable() -> str | None:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError as exc:
        return f"IPv6 loopback is not available here: {exc}"
    return None


@pytest.mark.parametrize("host", ["::1", "[::1]"])
async def test_ipv6_loopback(tmp_path: Path, host: str) -> None:
    reason = ipv6_loopback_unavailable()
    if reason is not None:
        pytest.skip(reason)
    async with server(tmp_path, host=host, probe="::1") as (_, port):
        url = f"http://[::1]:{port}/mcp"
        async with Client(url) as client:
            assert "orchestrate_start" in {t.name for t in (await client.list_tools()).tools}
        async with httpx2.AsyncClient() as http:
            foreign = await http.post(url, headers={**HEADERS, "Host": "evil.example"}, json=INITIALIZE)
            assert foreign.status_code == 421, "DNS-rebinding protection is on for IPv6 loopback too"


async def test_a_token_never_reaches_the_log(tmp_path: Path) -> None:
    async with (
        server(tmp_path, CONSTRUCT_AUTH_TOKEN=TOKEN) as (_, port),
        httpx2.AsyncClient() as http,
    ):
        url = f"http://127.0.0.1:{port}/mcp"
        for headers in ({}, {"Authorization": f"bearer {TOKEN}"}):
            await http.post(f"{url}?token={TOKEN}", headers={**HEADERS, **headers}, json=INITIALIZE)
            await http.get(f"{url}?access_token={TOKEN}&x=1", headers=headers)
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"bearer {TOKEN}"}) as authed,
            Client(streamable_http_client(url, http_client=authed)) as client,
        ):
            assert "orchestrate_start" in {t.name for t in (await client.list_tools()).tools}
    log = read_log(tmp_path / "server.log")
    assert "uvicorn.access" in log and "?[redacted]" in log
    assert TOKEN not in log

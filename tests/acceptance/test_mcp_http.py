"""The MCP surface over HTTP: ``construct-mcp serve --transport streamable-http`` (and ``sse``) as
real subprocesses on a free port of 127.0.0.1, driven by the official client."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from tests.acceptance.harness import (
    SERVER_COMMAND,
    call,
    call_error,
    free_port,
    play_host,
    read_log,
    server_env,
)

pytestmark = pytest.mark.slow


@asynccontextmanager
async def http_server(
    home: Path, transport: str, *, host: str = "127.0.0.1", **extra_env: str
) -> AsyncIterator[int]:
    """A server subprocess on a free port (bound to ``host``, reached on loopback); yields the port
    once it accepts connections, and stops it with SIGTERM (the way a service manager would)."""
    async with http_server_on(free_port(), home, transport, host=host, env=extra_env) as port:
        yield port


@asynccontextmanager
async def http_server_on(
    port: int, home: Path, transport: str, *, host: str = "127.0.0.1", env: Mapping[str, str] | None = None
) -> AsyncIterator[int]:
    """:func:`http_server` on a port chosen beforehand (one the config file names)."""
    env = {**server_env(home), "PATH": os.environ.get("PATH", ""), **(env or {})}
    log_path = home / "server.log"
    with log_path.open("wb") as errlog:
        process = await anyio.open_process(
            [*SERVER_COMMAND, "serve", "--transport", transport, "--host", host, "--port", str(port)],
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
                        stream = await anyio.connect_tcp("127.0.0.1", port)
                    except OSError:
                        await anyio.sleep(0.1)
                        continue
                    await stream.aclose()
                    break
            yield port
        finally:
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(20):
                returncode = await process.wait()
            await process.aclose()
    assert returncode == 0, read_log(log_path)


async def test_a_gated_chain_over_streamable_http(tmp_path: Path) -> None:
    async with (
        http_server(tmp_path, "streamable-http") as port,
        Client(f"http://127.0.0.1:{port}/mcp") as client,
    ):
        tools = {t.name for t in (await client.list_tools()).tools}
        assert "orchestrate_start" in tools
        view = await call(
            client, "orchestrate_start", request="Over HTTP, please.", approve_before=["engineer"]
        )
        assert view["next_action"]["kind"] == "run_host_task"
        view = await play_host(client, view)
        assert view["next_action"]["kind"] == "approve"
        gate_id = view["next_action"]["gate_id"]
        view = await call(
            client, "orchestrate_approve", run_id=view["run_id"], decision="approve", gate_id=gate_id
        )
        view = await play_host(client, view)
        assert view["status"] == "completed"
        assert [t["status"] for t in view["tasks"]] == ["done", "done", "done"]
        text = await call_error(client, "run_status", run_id="../../etc")
        assert text.startswith("invalid_argument: ")
        listed = await call(client, "runs_list")
        assert [r["run_id"] for r in listed["runs"]] == [view["run_id"]]
    log = read_log(tmp_path / "server.log")
    assert "action=server_started" in log and "action=server_stopping" in log


async def test_http_refuses_a_foreign_host_header(tmp_path: Path) -> None:
    """Bound to loopback, the server turns DNS-rebinding protection on: a request whose Host is
    not a loopback name is refused before it reaches a tool."""
    async with http_server(tmp_path, "streamable-http") as port, httpx2.AsyncClient() as http:
        response = await http.post(
            f"http://127.0.0.1:{port}/mcp",
            headers={
                "Host": "evil.example",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
            content=b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
        )
        assert response.status_code == 421


async def test_sse_transport_serves_the_tools(tmp_path: Path) -> None:
    async with http_server(tmp_path, "sse") as port:
        for n in range(2):  # two connections share the process's store and dispatcher
            async with Client(sse_client(f"http://127.0.0.1:{port}/sse")) as client:
                # Two requests: the same one again would be the first run (the retry window).
                view = await call(client, "orchestrate_start", request=f"Over SSE, {n}.", chain=["writer"])
                assert view["next_action"]["kind"] == "run_host_task"
                view = await play_host(client, view)
                assert view["status"] == "completed"
    log = read_log(tmp_path / "server.log")
    assert log.count("action=server_started") == 1


# ------------------------------------------------------------------------------------------------
# The bearer token (server/transports/auth.py)

TOKEN = "canary-token-" + "7f3a9c2e4b1d8f60"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_with_a_token_only_requests_that_carry_it_reach_the_tools(tmp_path: Path) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
    json_headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    async with (
        http_server(tmp_path, "streamable-http", CONSTRUCT_AUTH_TOKEN=TOKEN) as port,
        httpx2.AsyncClient() as http,
    ):
        url = f"http://127.0.0.1:{port}/mcp"
        for headers in ({}, bearer("wrong-token-0000000000"), bearer(TOKEN + "x"), {"Authorization": TOKEN}):
            refused = await http.post(url, headers={**json_headers, **headers}, content=body)
            assert refused.status_code == 401, headers
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert "CONSTRUCT_AUTH_TOKEN" in refused.json()["message"]
            assert TOKEN not in refused.text
        async with (
            httpx2.AsyncClient(headers=bearer(TOKEN)) as authed,
            Client(streamable_http_client(url, http_client=authed)) as client,
        ):
            view = await call(client, "orchestrate_start", request="With a token.", chain=["writer"])
            assert view["next_action"]["kind"] == "run_host_task"
    log = read_log(tmp_path / "server.log")
    assert "action=auth_enabled" in log
    assert TOKEN not in log, "the token never reaches a log line"


async def test_sse_needs_the_token_too(tmp_path: Path) -> None:
    async with http_server(tmp_path, "sse", CONSTRUCT_AUTH_TOKEN=TOKEN) as port:
        async with (
            httpx2.AsyncClient() as http,
            http.stream("GET", f"http://127.0.0.1:{port}/sse") as response,
        ):
            assert response.status_code == 401
        async with Client(sse_client(f"http://127.0.0.1:{port}/sse", headers=bearer(TOKEN))) as client:
            view = await call(client, "orchestrate_start", request="SSE with a token.", chain=["writer"])
            assert view["next_action"]["kind"] == "run_host_task"


async def test_binding_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    env = {**server_env(tmp_path), "PATH": os.environ.get("PATH", "")}
    port = str(free_port())
    refused = await anyio.run_process(
        [*SERVER_COMMAND, "serve", "--transport", "streamable-http", "--host", "0.0.0.0", "--port", port],
        env=env,
        check=False,
    )
    assert refused.returncode == 2
    message = refused.stderr.decode()
    assert "0.0.0.0 would serve runs to the network without authentication" in message
    assert "CONSTRUCT_AUTH_TOKEN" in message
    assert refused.stdout == b""

    async with (
        http_server(tmp_path, "streamable-http", host="0.0.0.0", CONSTRUCT_AUTH_TOKEN=TOKEN) as port_number,
        httpx2.AsyncClient(headers=bearer(TOKEN)) as authed,
        Client(streamable_http_client(f"http://127.0.0.1:{port_number}/mcp", http_client=authed)) as client,
    ):
        assert "orchestrate_start" in {t.name for t in (await client.list_tools()).tools}


async def test_a_short_token_is_a_configuration_error(tmp_path: Path) -> None:
    env = {**server_env(tmp_path), "PATH": os.environ.get("PATH", ""), "CONSTRUCT_AUTH_TOKEN": "short"}
    refused = await anyio.run_process(
        [*SERVER_COMMAND, "serve", "--transport", "streamable-http", "--port", str(free_port())],
        env=env,
        check=False,
    )
    assert refused.returncode == 2
    assert "CONSTRUCT_AUTH_TOKEN" in refused.stderr.decode() and "16" in refused.stderr.decode()
    assert "short" not in refused.stderr.decode().replace("shorter", ""), "the value is not echoed"

"""Every JSON-RPC request gets an answer with a project code (issue 22, finding 10), over stdio,
Streamable HTTP and SSE, against real ``serve`` processes: a message that is no request (an object, array,
boolean, fraction or null id; a batch; not JSON; a bare value; a method that is no string; params
that are no object) is answered as JSON-RPC 2.0 §5 says (``id: null`` when its id cannot be
echoed), and so are a prompt or resource the server does not have and a method it does not serve;
none logs a traceback, and the session goes on."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from tests.acceptance.harness import REPO, SERVER_COMMAND, read_log, server_env
from tests.acceptance.processes import http_server
from tests.acceptance.test_http_hygiene import INITIALIZE, result_of
from tests.acceptance.test_mcp_http import http_server as sse_server

pytestmark = pytest.mark.slow

NOT_AN_ID = "invalid_request: a request's id is a string or an integer"

#: (the raw message, the id of its answer, the JSON-RPC code, how the message starts)
CASES: list[tuple[str, Any, int, str]] = [
    ('{"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}', None, -32600, NOT_AN_ID),
    ('{"jsonrpc": "2.0", "id": [1], "method": "tools/list"}', None, -32600, NOT_AN_ID),
    ('{"jsonrpc": "2.0", "id": true, "method": "tools/list"}', None, -32600, NOT_AN_ID),
    ('{"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}', None, -32600, NOT_AN_ID),
    ('{"jsonrpc": "2.0", "id": null, "method": "tools/list"}', None, -32600, NOT_AN_ID),
    ('[{"jsonrpc": "2.0", "id": 7, "method": "tools/list"}]', 7, -32600, "invalid_request: batches are not"),
    ("[]", None, -32600, "invalid_request: batches are not"),
    ("42", None, -32600, "invalid_request: a JSON-RPC message is an object"),
    ("{not json", None, -32700, "invalid_request: the message is not JSON"),
    (
        '{"jsonrpc": "2.0", "id": 8, "method": 5}',
        8,
        -32600,
        "invalid_request: a request's method is a string",
    ),
    ('{"jsonrpc": "2.0", "method": 5}', None, -32600, "invalid_request: a request's method is a string"),
    ('{"jsonrpc": "2.0", "id": 9}', 9, -32600, "invalid_request: the message has no method"),
    ('{"id": 10, "method": "tools/list"}', 10, -32600, 'invalid_request: a JSON-RPC message says "jsonrpc"'),
    (
        '{"jsonrpc": "2.0", "id": 11, "method": "tools/list", "params": 5}',
        11,
        -32600,
        "invalid_request: a request",
    ),
    (
        '{"jsonrpc": "2.0", "id": 12, "method": "nope/nope"}',
        12,
        -32601,
        "invalid_request: this server has no",
    ),
    (
        '{"jsonrpc": "2.0", "id": 13, "method": "prompts/get", "params": {"name": "nope"}}',
        13,
        -32602,
        "invalid_argument: unknown prompt 'nope'",
    ),
    (
        '{"jsonrpc":"2.0","id":14,"method":"prompts/get","params":{"name":"default","arguments":{}}}',
        14,
        -32602,
        "invalid_argument: request is required",
    ),
    (
        '{"jsonrpc": "2.0", "id": 15, "method": "resources/read", "params": {"uri": "foo://bar"}}',
        15,
        -32602,
        "invalid_argument: no resource has the URI 'foo://bar'",
    ),
    (
        '{"jsonrpc": "2.0", "id": 16, "method": "prompts/get", "params": {"arguments": {}}}',
        16,
        -32602,
        "invalid_argument: prompts/get: ",
    ),
]


def check(answer: dict[str, Any], request_id: Any, code: int, start: str) -> None:
    assert answer["jsonrpc"] == "2.0" and "id" in answer and answer["id"] == request_id, answer
    error = answer["error"]
    assert error["code"] == code and error["message"].startswith(start), error
    assert error["data"]["code"] == start.split(":")[0], error


async def read_message(stdout: BufferedByteReceiveStream) -> dict[str, Any]:
    with anyio.fail_after(20):
        line = await stdout.receive_until(b"\n", 10_000_000)
    message: dict[str, Any] = json.loads(line)
    return message


async def test_over_stdio(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as errlog:
        process: Process = await anyio.open_process(
            [*SERVER_COMMAND, "serve"],
            env={**server_env(tmp_path), "PATH": os.environ.get("PATH", "")},
            cwd=str(REPO),
            stderr=errlog,
        )
        async with process:
            assert process.stdin is not None and process.stdout is not None
            stdout = BufferedByteReceiveStream(process.stdout)

            async def send(line: str) -> None:
                assert process.stdin is not None
                await process.stdin.send(line.encode() + b"\n")

            await send('{"jsonrpc": "2.0", "id": "early", "method": "tools/list"}')  # before the handshake
            check(
                await read_message(stdout), "early", -32602, "invalid_state: the session is not initialized"
            )
            await send(json.dumps(INITIALIZE))
            assert (await read_message(stdout))["id"] == 0
            await send('{"jsonrpc": "2.0", "method": "notifications/initialized"}')
            await send("")  # a blank line is no message: nothing answers it
            for raw, request_id, code, start in CASES:
                await send(raw)
                check(await read_message(stdout), request_id, code, start)
            # the session goes on
            await send('{"jsonrpc": "2.0", "id": 99, "method": "tools/list"}')
            answer = await read_message(stdout)
            assert answer["id"] == 99 and answer["result"]["tools"], answer
            await process.stdin.aclose()
            with anyio.fail_after(20):
                assert await process.wait() == 0
    assert "Traceback" not in read_log(log_path), read_log(log_path)
    assert "action=invalid_message" in read_log(log_path)


async def test_over_streamable_http(tmp_path: Path) -> None:
    env = {**server_env(tmp_path), "PATH": os.environ.get("PATH", "")}
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    async with http_server(env, tmp_path / "server.log") as (_, port), httpx2.AsyncClient(timeout=20) as http:
        url = f"http://127.0.0.1:{port}/mcp"
        opened = await http.post(url, headers=headers, json=INITIALIZE)
        session = {
            **headers,
            "mcp-session-id": opened.headers["mcp-session-id"],
            "mcp-protocol-version": "2025-11-25",
        }
        await http.post(url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        for raw, request_id, code, start in CASES:
            response = await http.post(url, headers=session, content=raw.encode())
            check(result_of(response), request_id, code, start)
            if code == -32600 or code == -32700:
                assert response.status_code == 400, response.text
            assert "input_value" not in response.text and "pydantic" not in response.text, response.text
        # a batch of two requests: an answer for each
        batch = [{"jsonrpc": "2.0", "id": n, "method": "tools/list"} for n in (20, 21)]
        answers = (await http.post(url, headers=session, json=batch)).json()  # refused here: plain JSON
        assert [a["id"] for a in answers] == [20, 21]
        listed = result_of(
            await http.post(url, headers=session, json={"jsonrpc": "2.0", "id": 99, "method": "tools/list"})
        )
        assert listed["id"] == 99 and listed["result"]["tools"]
    assert "Traceback" not in read_log(tmp_path / "server.log")


async def test_over_sse(tmp_path: Path) -> None:
    async with (
        sse_server(tmp_path, "sse") as port,
        httpx2.AsyncClient(timeout=20) as http,
        http.stream("GET", f"http://127.0.0.1:{port}/sse") as stream,
    ):
        lines = stream.aiter_lines()
        with anyio.fail_after(20):
            endpoint = ""
            while not endpoint.startswith("/messages/"):
                endpoint = (await anext(lines)).removeprefix("data: ")
        url = f"http://127.0.0.1:{port}{endpoint}"
        as_json = {"Content-Type": "application/json"}
        for raw, request_id, code, start in CASES[:10]:  # what the transport checks
            response = await http.post(url, headers=as_json, content=raw.encode())
            assert response.status_code == 400, response.text
            check(response.json(), request_id, code, start)
        good = await http.post(url, json=INITIALIZE)
        assert good.status_code == 202, good.text

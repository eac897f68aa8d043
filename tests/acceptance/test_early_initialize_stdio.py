"""``construct-mcp serve`` on stdio answers ``initialize`` and the first ``tools/list`` before the SDK
is imported, then hands the same requests to the SDK and drops the SDK's answers
(``server/transports/handshake.py``). With real server processes: the session the SDK serves after
that is sound (tools listed and called, each request answered once, the SDK's answers the same as
the early ones), size limits that change the tools leave ``tools/list`` to the SDK, a first message
other than ``initialize`` is the SDK's to answer as before, and a server that never gets a message
stops in order."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from server.__main__ import inline_card
from server.transports.handshake import initialize_answer, tools_list_answer
from tests.acceptance.harness import REPO, SERVER_COMMAND, call, read_log, server_env, stdio_client_for

pytestmark = pytest.mark.slow

#: generous: an answer comes within a second or two on a busy machine
ANSWER_SECONDS = 60.0


def message(id_: object, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if id_ is not None:
        body["id"] = id_
    if params is not None:
        body["params"] = params
    return body


INITIALIZE = message(
    1,
    "initialize",
    {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw-host", "version": "1"}},
)
INITIALIZED = message(None, "notifications/initialized")


def line(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode() + b"\n"


def early_answer_line() -> bytes:
    answer = initialize_answer(line(INITIALIZE).rstrip(), inline_card())
    assert answer is not None
    return (answer.line + "\n").encode()


def early_tools_line(request: dict[str, Any]) -> bytes:
    tools = inline_card().tools_list
    assert tools is not None
    answer = tools_list_answer(line(request).rstrip(), tools)
    assert answer is not None
    return (answer.line + "\n").encode()


class RawServer:
    """``python -m server serve`` as a host spawns it, spoken to in raw JSON-RPC lines."""

    def __init__(self, home: Path, **env: str) -> None:
        self.log = home / "server.log"
        with self.log.open("ab") as errlog:
            self.proc = subprocess.Popen(
                [*SERVER_COMMAND, "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errlog,
                env={**os.environ, **server_env(home, **env)},
                cwd=REPO,
            )
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._buffer = b""
        self.lines: list[bytes] = []  # every line read from stdout, in order

    def send(self, *data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"".join(data))
        self.proc.stdin.flush()

    def answer(self, id_: object) -> tuple[bytes, dict[str, Any]]:
        """The line answering ``id_`` (as written) and the message; every line read is kept."""
        deadline = time.monotonic() + ANSWER_SECONDS
        while True:
            while b"\n" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\n", 1)
                self.lines.append(raw + b"\n")
                parsed = json.loads(raw)
                if parsed.get("id") == id_ and ("result" in parsed or "error" in parsed):
                    return raw + b"\n", parsed
            left = deadline - time.monotonic()
            assert left > 0 and self._selector.select(left), (
                f"no answer to {id_!r}; log:\n{read_log(self.log)}"
            )
            chunk = os.read(self._fd, 65536)
            assert chunk, f"the server exited before answering {id_!r}; log:\n{read_log(self.log)}"
            self._buffer += chunk

    def close(self) -> int:
        """Close stdin (as a host does) and wait for the exit; the rest of stdout is kept."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout=ANSWER_SECONDS)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._buffer += self.proc.stdout.read()
            self.lines += [raw + b"\n" for raw in self._buffer.split(b"\n") if raw]
            self._selector.close()
            self.proc.stdout.close()
        return code


def answers_to(lines: list[bytes], id_: object) -> int:
    return sum(1 for raw in lines if json.loads(raw).get("id") == id_ and "method" not in json.loads(raw))


def tool_result(answer: dict[str, Any]) -> dict[str, Any]:
    result = answer["result"]
    assert result.get("isError") is not True, result
    structured: dict[str, Any] = result["structuredContent"]
    return structured


def test_initialize_answered_early_then_the_sdk_serves_the_session(tmp_path: Path) -> None:
    server = RawServer(tmp_path)
    try:
        # Pipelined, as a host may write them: the whole lot is read before the SDK starts.
        tools_list = message(2, "tools/list", {})
        server.send(line(INITIALIZE), line(INITIALIZED), line(tools_list))
        raw, _ = server.answer(1)
        assert raw == early_answer_line()
        raw, listed = server.answer(2)
        assert raw == early_tools_line(tools_list)
        names = {tool["name"] for tool in listed["result"]["tools"]}
        assert {"orchestrate_start", "run_status"} <= names
        start = {"name": "orchestrate_start", "arguments": {"request": "early", "chain": ["writer"]}}
        server.send(line(message(3, "tools/call", start)))
        view = tool_result(server.answer(3)[1])
        status = {"name": "run_status", "arguments": {"run_id": view["run_id"]}}
        server.send(line(message(4, "tools/call", status)))
        assert tool_result(server.answer(4)[1])["run_id"] == view["run_id"]
    finally:
        code = server.close()
    assert code == 0
    # The SDK's answers to the replayed requests were dropped: each request answered once.
    assert [answers_to(server.lines, n) for n in (1, 2, 3, 4)] == [1, 1, 1, 1]
    log = read_log(server.log)
    assert "action=server_started" in log
    assert "early_initialize_differs" not in log and "ERROR" not in log


async def test_the_official_client_works_after_the_early_answer(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    async with stdio_client_for(server_env(tmp_path), log_path, mode="legacy") as client:
        assert client.server_info is not None and client.server_info.name == "construct-mcp"
        assert client.instructions == inline_card().instructions
        tools = await client.list_tools()
        assert "orchestrate_start" in {tool.name for tool in tools.tools}
        view = await call(client, "orchestrate_start", request="early", chain=["writer"])
        assert view["status"] == "awaiting_host"
    log = read_log(log_path)
    assert "early_initialize_differs" not in log and "ERROR" not in log


def test_limits_that_change_the_tools_leave_tools_list_to_the_sdk(tmp_path: Path) -> None:
    server = RawServer(tmp_path, CONSTRUCT_MAX_REQUEST_CHARS="1000")
    try:
        tools_list = message(2, "tools/list")
        server.send(line(INITIALIZE), line(INITIALIZED), line(tools_list))
        assert server.answer(1)[0] == early_answer_line()
        raw, listed = server.answer(2)
        assert raw != early_tools_line(tools_list)  # the server's own list, for its limits
        assert "orchestrate_start" in {tool["name"] for tool in listed["result"]["tools"]}
    finally:
        assert server.close() == 0
    assert [answers_to(server.lines, n) for n in (1, 2)] == [1, 1]
    assert "early_initialize_differs" not in read_log(server.log)


def test_a_first_message_other_than_initialize_is_left_to_the_sdk(tmp_path: Path) -> None:
    server = RawServer(tmp_path)
    try:
        server.send(line(message("probe", "ping")))
        assert server.answer("probe")[1] == {"jsonrpc": "2.0", "id": "probe", "result": {}}
        server.send(line(INITIALIZE))
        raw, _ = server.answer(1)
        # The SDK's own answer, the same as the early one would have been.
        assert raw == early_answer_line()
        server.send(line(INITIALIZED), line(message(2, "tools/list", {})))
        assert server.answer(2)[1]["result"]["tools"]
    finally:
        assert server.close() == 0
    assert answers_to(server.lines, 1) == 1


def test_a_first_line_that_is_not_json_is_refused_and_initialize_follows(tmp_path: Path) -> None:
    server = RawServer(tmp_path)
    try:
        server.send(b"hello\n", line(INITIALIZE))
        _, refused = server.answer(None)
        assert refused["error"]["code"] == -32700
        raw, _ = server.answer(1)
        assert raw == early_answer_line()
        server.send(line(INITIALIZED), line(message(2, "tools/list", {})))
        assert server.answer(2)[1]["result"]["tools"]
    finally:
        assert server.close() == 0


def test_the_end_of_input_before_any_message_stops_the_server(tmp_path: Path) -> None:
    server = RawServer(tmp_path)
    assert server.close() == 0
    assert server.lines == []
    assert "action=server_stopping" in read_log(server.log)


def test_sigterm_before_any_message_stops_the_server_in_order(tmp_path: Path) -> None:
    server = RawServer(tmp_path)
    pid_file = tmp_path / "server.pid"
    deadline = time.monotonic() + ANSWER_SECONDS
    while not pid_file.exists():  # started: the early reader still waits for a first message
        assert time.monotonic() < deadline, read_log(server.log)
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=ANSWER_SECONDS) == 0
    assert server.close() == 0
    assert server.lines == [] and not pid_file.exists()
    log = read_log(server.log)
    assert "action=shutdown_requested" in log and "action=server_stopping" in log

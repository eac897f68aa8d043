"""``notifications/cancelled`` for a request already answered changes nothing (opencode sends one
after every answered call): raw JSON-RPC over stdio to a real ``python -m server serve``.

After each answer the client cancels the request it answered, then goes on calling; the server
keeps answering every call, sends nothing for a notification (no response, no error), logs no
error, and the run is exactly as it was before the cancellation."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from tests.acceptance.harness import SERVER_COMMAND, server_env

pytestmark = pytest.mark.slow


class RawStdio:
    """One server subprocess spoken to in raw JSON-RPC lines; every message it sends is kept."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self.received: list[dict[str, Any]] = []
        self._buffer = b""
        self._next_id = 1

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send((json.dumps(message) + "\n").encode())

    async def request(self, method: str, params: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """Send a request; its id and its response (whatever else arrives first is kept too)."""
        request_id, self._next_id = self._next_id, self._next_id + 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        while True:
            received = await self._receive()
            if received.get("id") == request_id:
                return request_id, received

    async def call(self, tool: str, **arguments: Any) -> tuple[int, dict[str, Any]]:
        """A tool call that must succeed: its request id and structured content."""
        request_id, response = await self.request("tools/call", {"name": tool, "arguments": arguments})
        result = response["result"]
        assert not result.get("isError"), result
        return request_id, result["structuredContent"]

    async def cancel(self, request_id: int) -> None:
        params = {"requestId": request_id, "reason": "the call is over"}
        await self.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})

    async def _receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            self._buffer += await self.process.stdout.receive()
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        self.received.append(message)
        return message


async def test_cancelling_an_answered_request_changes_nothing(tmp_path: Path) -> None:
    env = {**server_env(tmp_path), "PATH": os.environ.get("PATH", "")}
    stderr_path = tmp_path / "stderr.log"
    with anyio.fail_after(60), stderr_path.open("wb") as errlog:
        async with await anyio.open_process([*SERVER_COMMAND, "serve"], env=env, stderr=errlog) as process:
            raw = RawStdio(process)
            init = {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "opencode-like", "version": "0"},
            }
            await raw.request("initialize", init)
            await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            started, view = await raw.call(
                "orchestrate_start", request="cancel after answer", chain=["writer", "writer"]
            )
            run_id = view["run_id"]
            before = (await raw.call("run_status", run_id=run_id, detail="full"))[1]
            events = (await raw.call("run_events", run_id=run_id, limit=500))[1]["events"]
            await raw.cancel(started)
            seen, after = await raw.call("run_status", run_id=run_id, detail="full")
            # The cancellation recorded nothing: the same view, the same events.
            assert after == before
            assert (await raw.call("run_events", run_id=run_id, limit=500))[1]["events"] == events
            await raw.cancel(seen)
            # The run goes on as usual, each call cancelled once it was answered.
            resumed, view = await raw.call(
                "orchestrate_resume", run_id=run_id, task_id="writer", output="first draft"
            )
            assert view["next_action"]["kind"] == "run_host_task"
            await raw.cancel(resumed)
            again = (await raw.call("run_status", run_id=run_id, detail="full"))[1]
            assert again["status"] == view["status"] and again["tasks"][0]["status"] == "done"
            last, pong = await raw.request("ping")
            assert pong["result"] == {}
            await raw.cancel(last)
            await raw.cancel(999)  # a request never sent: nothing either
            task_id = view["next_action"]["task_id"]
            final = (await raw.call("orchestrate_resume", run_id=run_id, task_id=task_id, output="done"))[1]
            assert final["status"] == "completed"
            assert process.stdin is not None
            await process.stdin.aclose()
            assert process.stdout is not None
            rest = b"".join([chunk async for chunk in process.stdout])
            returncode = await process.wait()
    stderr = stderr_path.read_text()
    assert returncode == 0, stderr
    assert rest.strip() == b"", rest
    # Every message the server sent answers a request, once; none answers a notification.
    ids = [m.get("id") for m in raw.received]
    assert None not in ids and len(ids) == len(set(ids)), raw.received
    assert all("error" not in m for m in raw.received), raw.received
    for line in stderr.splitlines():
        assert " ERROR " not in line and " WARNING " not in line and "Traceback" not in line, stderr

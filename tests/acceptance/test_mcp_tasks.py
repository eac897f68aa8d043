"""MCP Tasks across a server restart, with real processes over Streamable HTTP on every persistent
store: a task-aware client (the SDK's client declaring ``io.modelcontextprotocol/tasks`` and sending
``tasks/*`` as raw requests) and a plain client share one server; the server is SIGKILLed while the
task waits at a gate, another server process starts on the same store, and the task handle taken
before the kill is followed to its result after it (the gate answered with ``tasks/update``, the
host task through ``orchestrate_resume``)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from server.mcp.tasks import MISSING_CAPABILITY
from tests.acceptance.harness import call, read_log, server_env, stdio_client_for
from tests.acceptance.processes import http_server, until_gone
from tests.acceptance.store_targets import store_target
from tests.acceptance.task_client import (
    CreatedTask,
    TasksClient,
    cancel_task,
    get_task,
    start_task,
    update_task,
)
from tests.acceptance.test_identities import ALICE, BOB, CAROL, CONFIG, DAVE
from tests.acceptance.test_mcp_http import http_server as identities_server

pytestmark = pytest.mark.slow

GATED = {"request": "Write the release notes", "chain": ["writer"], "approve_before": ["writer"]}
GATE = "gate:before:writer"
APPROVE = {"action": "accept", "content": {"decision": "approve"}}


async def _until(client: Client, task_id: str, status: str, text: str = "") -> dict[str, Any]:
    with anyio.fail_after(30):
        while True:
            task = await get_task(client, task_id)
            if task["status"] == status and text in task.get("statusMessage", ""):
                return task
            await anyio.sleep(0.1)


@pytest.mark.parametrize(
    "backend", ["filesystem", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_task_taken_before_a_sigkill_is_followed_after_the_restart(
    backend: str, tmp_path: Path
) -> None:
    async with store_target(backend, tmp_path / backend) as target:
        env = target.env(tmp_path / "home")
        log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
        async with http_server(env, log_a) as (process, port):
            url = f"http://127.0.0.1:{port}/mcp"
            async with Client(url, extensions=[TasksClient()]) as aware, Client(url) as plain:
                created = await start_task(aware, "orchestrate_start", **GATED)
                assert isinstance(created, CreatedTask), created
                task_id = created.task_id
                # The plain client on the same server: today's answer, and no tasks/*.
                view = await call(plain, "orchestrate_start", **GATED)
                assert view["status"] == "awaiting_approval", view
                with pytest.raises(MCPError) as refused:
                    await get_task(plain, task_id)
                assert refused.value.error.code == MISSING_CAPABILITY
                before = await _until(aware, task_id, "input_required")
                assert set(before["inputRequests"]) == {GATE}
            process.kill()  # SIGKILL: no shutdown, no lease released
            await until_gone(process.pid)
        async with http_server(env, log_b) as (_process, port):
            url = f"http://127.0.0.1:{port}/mcp"
            async with Client(url, extensions=[TasksClient()]) as aware, Client(url) as plain:
                after = await get_task(aware, task_id)
                assert after["status"] == "input_required", read_log(log_b)
                assert after["inputRequests"] == before["inputRequests"]
                await update_task(aware, task_id, {GATE: APPROVE})
                host = await _until(aware, task_id, "input_required", "awaiting_host")
                assert "orchestrate_resume with {" in host["statusMessage"], host
                await call(aware, "orchestrate_resume", run_id=task_id, task_id="writer", output="v1 notes")
                done = await _until(aware, task_id, "completed")
                final = done["result"]["structuredContent"]
                assert (final["run_id"], final["status"]) == (task_id, "completed")
                assert final["gates"][0]["channel"] == "elicitation"
                # The plain client sees the same run, as a run view.
                assert (await call(plain, "run_status", run_id=task_id))["status"] == "completed"
        runs = {head.run_id: facts for head, facts in await target.runs()}
        decided = [f for f in runs[task_id] if type(f).__name__ == "ApprovalDecided"]
        assert len(decided) == 1


@asynccontextmanager
async def as_identity(port: int, token: str) -> AsyncIterator[Client]:
    """A task-aware client with a bearer token."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as authed,
        Client(
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=authed),
            extensions=[TasksClient()],
        ) as client,
    ):
        yield client


async def test_tasks_are_checked_like_the_tools_they_stand_for(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG)
    async with (
        identities_server(tmp_path, "streamable-http", BOB_TOKEN=BOB) as port,
        as_identity(port, ALICE) as alice,
        as_identity(port, BOB) as bob,
        as_identity(port, CAROL) as carol,
        as_identity(port, DAVE) as dave,
    ):
        created = await start_task(alice, "orchestrate_start", **GATED)
        assert isinstance(created, CreatedTask), created
        task_id = created.task_id
        # alice reads and operates: she sees the task, but is not asked at the gate nor may answer it.
        seen = await _until(alice, task_id, "input_required")
        assert seen["inputRequests"] == {} and "orchestrate_approve with {" in seen["statusMessage"]
        with pytest.raises(MCPError) as forbidden:
            await update_task(alice, task_id, {GATE: APPROVE})
        assert forbidden.value.error.message.startswith("forbidden:")
        # dave may approve but not read; carol sees only her own runs: to her it does not exist.
        with pytest.raises(MCPError) as unread:
            await get_task(dave, task_id)
        assert unread.value.error.message.startswith("forbidden:")
        with pytest.raises(MCPError) as unknown:
            await get_task(carol, task_id)
        assert unknown.value.error.message == "Failed to retrieve task: Task not found"
        # bob reads and approves: asked, and his answer is recorded as his, verified.
        asked = await get_task(bob, task_id)
        assert set(asked["inputRequests"]) == {GATE}
        with pytest.raises(MCPError) as no_cancel:
            await cancel_task(bob, task_id)  # cancelling needs operate
        assert no_cancel.value.error.message.startswith("forbidden:")
        await update_task(bob, task_id, {GATE: APPROVE})
        await _until(bob, task_id, "input_required", "awaiting_host")
        view = await call(alice, "run_status", run_id=task_id)
        gate = view["gates"][0]
        assert (gate.get("approver"), gate.get("verified", False), gate["channel"]) == (
            "bob",
            True,
            "elicitation",
        )


async def test_over_stdio_a_task_survives_a_sigkill_of_its_server(tmp_path: Path) -> None:
    """The same over stdio (2026-07-28, per-request capabilities on the pipe): the server is
    SIGKILLed (its pid file says which process) while the client still holds the pipe."""
    (tmp_path / "home").mkdir()
    env = server_env(tmp_path / "home")
    log = tmp_path / "stdio.log"
    pid_file = tmp_path / "home" / "server.pid"
    task_id = ""
    with pytest.raises(ExceptionGroup) as broken:  # the pipe breaks under the client
        async with stdio_client_for(env, log, extensions=[TasksClient()]) as aware:
            created = await start_task(aware, "orchestrate_start", **GATED)
            assert isinstance(created, CreatedTask), created
            task_id = created.task_id
            await _until(aware, task_id, "input_required")
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGKILL)
            await until_gone(pid)
            await get_task(aware, task_id)  # the server is gone: this fails
    assert task_id and broken.group_contains(MCPError, match="Connection closed"), read_log(log)
    async with (
        stdio_client_for(env, log, extensions=[TasksClient()]) as aware,
        stdio_client_for(env, log) as plain,
    ):
        assert set((await get_task(aware, task_id))["inputRequests"]) == {GATE}
        await update_task(aware, task_id, {GATE: APPROVE})
        await _until(aware, task_id, "input_required", "awaiting_host")
        result = await start_task(plain, "orchestrate_resume", run_id=task_id, task_id="writer", output="v1")
        assert isinstance(result, CallToolResult) and not result.is_error
        done = await _until(aware, task_id, "completed")
        assert done["result"]["structuredContent"]["status"] == "completed"

"""MCP Tasks across a server restart, with real processes over Streamable HTTP on every persistent
store: a task-aware client (the SDK's client declaring ``io.modelcontextprotocol/tasks`` and sending
``tasks/*`` as raw requests) and a plain client share one server; the server is SIGKILLed while the
task waits at a gate, another server process starts on the same store, and the task handle taken
before the kill is followed to its result after it (the gate answered with ``tasks/update``, the
step done by the provider: the fake provider over real HTTP). A task is what the client can carry
to its end, so the runs are provider runs and the task-aware clients declare elicitation (with a
callback that fails the test if the server ever asks mid-call: a task's forms are its
``inputRequests``)."""

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
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitRequestParams, ElicitResult, ErrorData

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
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

GATED = {"request": "Write the release notes", "chain": ["writer"], "approve_before": ["writer"]}
GATE = "gate:before:writer"
APPROVE = {"action": "accept", "content": {"decision": "approve"}}
#: A gate after a step the provider does (slowly enough that the start answers before it is done).
GATED_LATER = {
    "request": "Research, then write the release notes",
    "chain": ["researcher", "writer"],
    "approve_before": ["writer"],
}
SCENARIO = {
    "researcher": [{"delay_seconds": 0.5, "text": "the findings"}],
    "writer": [{"text": "v1 notes, from the model"}],
}


def provider_env(fake: FakeProvider) -> dict[str, str]:
    """What makes a server's runs provider runs on ``fake`` (its default backend)."""
    return {
        "CONSTRUCT_WORKER_BACKEND": "provider",
        "CONSTRUCT_MODEL": "claude-test-1",
        "CONSTRUCT_ANTHROPIC_BASE_URL": fake.base_url,
        "ANTHROPIC_API_KEY": "sk-ant-test-key",
    }


async def never_asked(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
    """Declares elicitation; a task's forms come in ``inputRequests``, never as a request mid-call."""
    raise AssertionError(f"the server asked mid-call: {params}")


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
    with FakeProvider(SCENARIO) as fake:
        await _http_task_across_a_sigkill(backend, tmp_path, fake)


async def _http_task_across_a_sigkill(backend: str, tmp_path: Path, fake: FakeProvider) -> None:
    async with store_target(backend, tmp_path / backend) as target:
        env = target.env(tmp_path / "home", **provider_env(fake))
        log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
        async with http_server(env, log_a) as (process, port):
            url = f"http://127.0.0.1:{port}/mcp"
            async with (
                Client(url, extensions=[TasksClient()], elicitation_callback=never_asked) as aware,
                Client(url) as plain,
            ):
                created = await start_task(aware, "orchestrate_start", **GATED)
                assert isinstance(created, CreatedTask), created
                task_id = created.task_id
                # The plain client on the same server: today's answer, and no tasks/*.
                view = await call(plain, "orchestrate_start", **GATED, new_run=True)
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
            async with (
                Client(url, extensions=[TasksClient()], elicitation_callback=never_asked) as aware,
                Client(url) as plain,
            ):
                after = await get_task(aware, task_id)
                assert after["status"] == "input_required", read_log(log_b)
                assert after["inputRequests"] == before["inputRequests"]
                await update_task(aware, task_id, {GATE: APPROVE})
                # The provider does the step; the task completes with the final view.
                done = await _until(aware, task_id, "completed")
                final = done["result"]["structuredContent"]
                assert (final["run_id"], final["status"]) == (task_id, "completed")
                assert final["tasks"][0]["output_preview"] == "v1 notes, from the model"
                assert final["gates"][0]["channel"] == "elicitation"
                # The plain client sees the same run, as a run view.
                assert (await call(plain, "run_status", run_id=task_id))["status"] == "completed"
        runs = {head.run_id: facts for head, facts in await target.runs()}
        decided = [f for f in runs[task_id] if type(f).__name__ == "ApprovalDecided"]
        assert len(decided) == 1


@asynccontextmanager
async def as_identity(port: int, token: str) -> AsyncIterator[Client]:
    """A task-aware client with a bearer token, declaring elicitation."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as authed,
        Client(
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=authed),
            extensions=[TasksClient()],
            elicitation_callback=never_asked,
        ) as client,
    ):
        yield client


async def test_tasks_are_checked_like_the_tools_they_stand_for(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG)
    with FakeProvider(SCENARIO) as fake:
        await _tasks_checked(tmp_path, fake)


async def _tasks_checked(tmp_path: Path, fake: FakeProvider) -> None:
    async with (
        identities_server(tmp_path, "streamable-http", BOB_TOKEN=BOB, **provider_env(fake)) as port,
        as_identity(port, ALICE) as alice,
        as_identity(port, BOB) as bob,
        as_identity(port, CAROL) as carol,
        as_identity(port, DAVE) as dave,
    ):
        # alice reads and operates: her start is a task while the provider works on the first step.
        created = await start_task(alice, "orchestrate_start", **GATED_LATER)
        assert isinstance(created, CreatedTask) and created.status == "working", created
        task_id = created.task_id
        # At the gate she is not asked (she may not decide it): her task is handed over, completed
        # with the view that names the orchestrate_approve call someone who may decide makes.
        seen = await _until(alice, task_id, "completed")
        assert "inputRequests" not in seen and "orchestrate_approve with {" in seen["statusMessage"]
        assert seen["result"]["structuredContent"]["status"] == "awaiting_approval"
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
        done = await _until(bob, task_id, "completed")
        assert done["result"]["structuredContent"]["status"] == "completed"
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
    with FakeProvider(SCENARIO) as fake:
        await _stdio_task_across_a_sigkill(tmp_path, server_env(tmp_path / "home", **provider_env(fake)))


async def _stdio_task_across_a_sigkill(tmp_path: Path, env: dict[str, str]) -> None:
    log = tmp_path / "stdio.log"
    pid_file = tmp_path / "home" / "server.pid"
    task_id = ""
    aware_kwargs: dict[str, Any] = {"extensions": [TasksClient()], "elicitation_callback": never_asked}
    with pytest.raises(ExceptionGroup) as broken:  # the pipe breaks under the client
        async with stdio_client_for(env, log, **aware_kwargs) as aware:
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
        stdio_client_for(env, log, **aware_kwargs) as aware,
        stdio_client_for(env, log) as plain,
    ):
        assert set((await get_task(aware, task_id))["inputRequests"]) == {GATE}
        await update_task(aware, task_id, {GATE: APPROVE})
        done = await _until(aware, task_id, "completed")
        assert done["result"]["structuredContent"]["status"] == "completed"
        assert (await call(plain, "run_status", run_id=task_id))["status"] == "completed"

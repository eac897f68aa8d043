"""A client that gives up on ``orchestrate_start`` after 1 s and retries it (issue 21 §1), against real
server processes with the provider backend and a slow fake model: one run, one model call per task,
also when the server is killed (SIGKILL) and started again on the same store between retries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.acceptance.harness import call, read_log, server_env, stdio_client_for
from tests.acceptance.processes import http_server, until_gone
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

#: each model call takes longer than the client waits for the start's answer
SLOW = {"default": [{"delay_seconds": 3, "text": "done, slowly"}]}
START: dict[str, Any] = {
    "request": "Design and build a rate limiter.",
    "chain": ["architect", "engineer"],
    "worker_backend": "provider",
}


def provider_env(home: Path, fake: FakeProvider, **extra: str) -> dict[str, str]:
    return server_env(
        home,
        CONSTRUCT_WORKER_BACKEND="provider",
        CONSTRUCT_MODEL="claude-test-1",
        CONSTRUCT_ANTHROPIC_BASE_URL=fake.base_url,
        ANTHROPIC_API_KEY="sk-ant-test-key",
        **extra,
    )


async def give_up_after(client: Client, seconds: float) -> bool:
    """Call orchestrate_start as an impatient client does: True when it gave up."""
    with anyio.move_on_after(seconds) as scope:
        await client.call_tool("orchestrate_start", START)
    return scope.cancelled_caught


async def finished(client: Client) -> dict[str, Any]:
    """The one run the store holds, once it ended."""
    runs = (await call(client, "runs_list"))["runs"]
    assert len(runs) == 1, runs
    view: dict[str, Any] = {}
    with anyio.fail_after(60):
        while view.get("status_kind") != "terminal":
            view = await call(client, "run_status", run_id=runs[0]["run_id"], wait_seconds=3)
    return view


async def test_three_retries_after_giving_up_make_one_run_and_one_call_per_task(tmp_path: Path) -> None:
    with FakeProvider(SLOW) as fake:
        log_path = tmp_path / "server.log"
        async with stdio_client_for(provider_env(tmp_path, fake), log_path) as client:
            gave_up = [await give_up_after(client, 1.0) for _ in range(3)]
            assert gave_up == [True, True, True], read_log(log_path)
            # The answer a patient retry gets: the run the first call started.
            view = await call(client, "orchestrate_start", **START, wait_seconds=0)
            assert view["existing_run"] is True
            done = await finished(client)
            assert done["run_id"] == view["run_id"] and done["status"] == "completed", done
        assert fake.calls() == {"architect": 1, "engineer": 1}


async def test_a_restart_between_retries_still_makes_one_run(tmp_path: Path) -> None:
    with FakeProvider(SLOW) as fake:
        env = provider_env(tmp_path, fake, CONSTRUCT_LEASE_TTL_SECONDS="2")
        log_path = tmp_path / "server.log"
        async with http_server(env, log_path) as (process, port):
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                assert await give_up_after(client, 1.0), read_log(log_path)
            process.kill()  # SIGKILL, the model call in flight
            await until_gone(process.pid)
        async with http_server(env, log_path) as (_, port), Client(f"http://127.0.0.1:{port}/mcp") as client:
            assert await give_up_after(client, 1.0), read_log(log_path)
            view = await call(client, "orchestrate_start", **START, wait_seconds=0)
            assert view["existing_run"] is True
            done = await finished(client)
            assert done["run_id"] == view["run_id"] and done["status"] == "completed", done
        calls = fake.calls()
        # One run; the architect's call the kill cut off may be made again (a possible duplicate,
        # recorded as such), never a second run's calls.
        assert calls.keys() == {"architect", "engineer"} and calls["engineer"] == 1, calls
        assert calls["architect"] <= 2, calls

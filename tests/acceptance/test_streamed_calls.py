"""Streamed provider calls with real server processes (issue 25): a SIGKILL mid-stream records no
partial output and the next attempt, on a restarted server, is marked ``possible_duplicate_call``
(on every store); ``construct-mcp runs tail --url`` prints the output of a call as it is written."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from orchestration.core.facts import AttemptStarted, TaskCompleted
from tests.acceptance.harness import REPO, SERVER_COMMAND, call, read_log
from tests.acceptance.processes import http_server, until_gone
from tests.acceptance.store_targets import BACKENDS, StoreTarget, store_target
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

LONG = "".join(f"line {i:03d} of the writer's answer, streamed slowly\n" for i in range(300))
FINAL = "The writer's answer, in full, from the second attempt."


def provider_env(target: StoreTarget, home: Path, fake: FakeProvider) -> dict[str, str]:
    return target.env(
        home,
        CONSTRUCT_WORKER_BACKEND="provider",
        CONSTRUCT_MODEL="claude-test-1",
        CONSTRUCT_ANTHROPIC_BASE_URL=fake.base_url,
        ANTHROPIC_API_KEY="sk-ant-test-streamed-calls",
        # An orphan's lease expires by the time a restarted server is up.
        CONSTRUCT_LEASE_TTL_SECONDS="1",
    )


@asynccontextmanager
async def client_at(port: int) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(timeout=60) as http,
        Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as client,
    ):
        yield client


async def until_writing(client: Client, run_id: str, chars: int) -> dict[str, Any]:
    """The first ``output_delta`` event past ``chars`` characters of the call in flight."""
    output_after = 0
    with anyio.fail_after(30):
        while True:
            page = await call(client, "run_events", run_id=run_id, output_after=output_after, wait_seconds=2)
            output_after = page["next_output_after"]
            for item in page["events"]:
                if item["type"] == "output_delta" and item["offset"] + len(item["text"]) >= chars:
                    return dict(item)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_sigkill_mid_stream_records_no_partial_output_and_the_retry_is_marked(
    backend: str, tmp_path: Path
) -> None:
    scenario = {"writer": [{"text": LONG, "chunk_chars": 40, "chunk_delay_seconds": 0.05}, {"text": FINAL}]}
    async with store_target(backend, tmp_path / "store") as target:
        with FakeProvider(scenario) as fake:
            env1 = provider_env(target, tmp_path / "s1", fake)
            async with http_server(env1, tmp_path / "s1.log") as (process, port), client_at(port) as client:
                view = await call(
                    client, "orchestrate_start", request="Write it.", chain=["writer"], wait_seconds=0
                )
                run_id = view["run_id"]
                delta = await until_writing(client, run_id, 400)  # well into the stream
                os.kill(process.pid, signal.SIGKILL)
                await until_gone(process.pid)
            assert delta["attempt"] == 1
            async with target.opened() as store:
                facts = await store.read_facts(run_id)
            assert not [f for f in facts if isinstance(f, TaskCompleted)]  # nothing of the stream
            assert fake.streams() == [] or not fake.streams()[0]["finished"]

            env2 = provider_env(target, tmp_path / "s2", fake)
            async with http_server(env2, tmp_path / "s2.log") as (_, port), client_at(port) as client:
                done = await call(client, "run_status", run_id=run_id, wait_seconds=60)
                assert done["status"] == "completed", read_log(tmp_path / "s2.log")
        async with target.opened() as store:
            facts = await store.read_facts(run_id)
    started = [f for f in facts if isinstance(f, AttemptStarted)]
    assert [(f.attempt, f.possible_duplicate_call) for f in started] == [(1, False), (2, True)]
    [completed] = [f for f in facts if isinstance(f, TaskCompleted)]
    assert (completed.attempt, completed.output) == (2, FINAL)
    assert fake.calls() == {"writer": 2}


async def test_runs_tail_with_a_url_prints_the_output_as_it_is_written(tmp_path: Path) -> None:
    # 50 chunks over 7.5 s: the tail (a new CLI process, ~2.5 s to start here) joins while it is written.
    scenario = {"writer": [{"text": LONG[:3000], "chunk_chars": 60, "chunk_delay_seconds": 0.15}]}
    async with store_target("filesystem", tmp_path / "store") as target:
        with FakeProvider(scenario) as fake:
            env = provider_env(target, tmp_path / "s1", fake)
            async with http_server(env, tmp_path / "s1.log") as (_, port), client_at(port) as client:
                view = await call(
                    client, "orchestrate_start", request="Tail it.", chain=["writer"], wait_seconds=0
                )
                await until_writing(client, view["run_id"], 1)
                command = [*SERVER_COMMAND, "runs", "tail", view["run_id"], "--from-start"]
                command += ["--url", f"http://127.0.0.1:{port}/mcp"]
                tailed = await anyio.to_thread.run_sync(
                    lambda: subprocess.run(
                        command,
                        env={**env, "PATH": os.environ.get("PATH", "")},
                        cwd=REPO,
                        capture_output=True,
                        text=True,
                        timeout=60,
                        check=False,
                    )
                )
    assert tailed.returncode == 0, tailed.stderr
    lines = tailed.stdout.splitlines()
    assert lines[-1] == f"run {view['run_id']} ended: completed"
    written = [line for line in lines if line.startswith("  writer> ")]
    assert written  # the text, as the call wrote it, before the run's end
    assert any("line 0" in line for line in lines)
    assert "task_completed" in tailed.stdout

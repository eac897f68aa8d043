"""The span tree of a run killed and resumed in between (issue 14, part 1), with real processes.

A provider chain (architect -> engineer -> reviewer, the fake provider over real HTTP) is started
with a W3C ``traceparent`` in the tool call's ``_meta``, on a server that writes every span to a
file as it ends (:mod:`tests.acceptance.traced_server`). The fake holds the engineer's first call;
while it is in flight the server gets SIGKILL. A second server on the same store finds the
orphaned attempt and retries it; the host's repeated start carries *another* traceparent, which
changes nothing: the run's trace was recorded at its creation.

Then: every attempt that finished (its outcome is a recorded fact) has its span, every span of the
run is in the trace the first start gave, the spans the killed process held open (its drive, the
engineer's task and attempt, the model call in flight) are not there, and the engineer's second
attempt names the orphan it follows.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import RequestParamsMeta

from orchestration.core.facts import AttemptFailed, AttemptStarted, TaskCompleted
from stores.filesystem import FilesystemStore
from tests.acceptance.harness import REPO, pid_alive, read_log, server_env
from tests.acceptance.traced_server import read_span_file
from tests.fakes.fake_provider import FakeProvider
from tests.spans import CALLER_SPAN_ID, META, TRACE_ID, FinishedSpan, named, recorded_values

pytestmark = pytest.mark.slow

HELD_SECONDS = 600  # longer than the test: the held call never answers server 1
REQUEST = "Design, build and review a rate limiter [secret-request-text]"
OTHER_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@asynccontextmanager
async def traced_client(env: dict[str, str], log: Path) -> AsyncIterator[Client]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tests.acceptance.traced_server", "serve"],
        env=env,
        cwd=str(REPO),
    )
    with log.open("a", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=60) as client:
            yield client


async def start(client: Client, meta: RequestParamsMeta) -> dict[str, Any]:
    arguments = {
        "request": REQUEST,
        "worker_backend": "provider",
        "idempotency_key": "traced",
        "wait_seconds": 0,
    }
    result = await client.call_tool("orchestrate_start", arguments, meta=meta)
    assert not result.is_error and result.structured_content is not None, result
    return dict(result.structured_content)


async def until_completed(client: Client, run_id: str) -> dict[str, Any]:
    for _ in range(30):
        result = await client.call_tool("run_status", {"run_id": run_id, "wait_seconds": 10})
        assert result.structured_content is not None
        if result.structured_content["status"] == "completed":
            return dict(result.structured_content)
    raise AssertionError("the run did not complete")


def env_for(home: Path, fake: FakeProvider, spans: Path) -> dict[str, str]:
    return server_env(
        home,
        CONSTRUCT_WORKER_BACKEND="provider",
        CONSTRUCT_MODEL="claude-test-1",
        CONSTRUCT_ANTHROPIC_BASE_URL=fake.base_url,
        ANTHROPIC_API_KEY="sk-ant-test-trace-restart",
        CONSTRUCT_LEASE_TTL_SECONDS="1",
        CONSTRUCT_TEST_SPAN_FILE=str(spans),
        PATH=os.environ.get("PATH", ""),
    )


async def test_a_run_killed_mid_attempt_and_resumed_is_one_trace(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    spans1, spans2 = tmp_path / "spans1.jsonl", tmp_path / "spans2.jsonl"
    log1, log2 = tmp_path / "server1.log", tmp_path / "server2.log"
    scenario = {
        "architect": [{"text": "the design"}],
        "engineer": [{"delay_seconds": HELD_SECONDS, "text": "late"}, {"text": "the patch"}],
        "reviewer": [{"text": "approved"}],
    }
    with FakeProvider(scenario) as fake:
        run_id = ""
        try:
            with anyio.fail_after(60):
                async with traced_client(env_for(home, fake, spans1), log1) as client:
                    run_id = (await start(client, META))["run_id"]
                    while fake.calls_for("engineer") < 1:  # noqa: ASYNC110 - another thread
                        await anyio.sleep(0.05)
                    os.kill(int((home / "server.pid").read_text()), signal.SIGKILL)
                    await client.call_tool("run_status", {"run_id": run_id, "wait_seconds": 5})
        except TimeoutError:
            raise
        except Exception:  # the client sees the dead server as a closed stream or an error
            pass
        assert run_id and not pid_alive(int((home / "server.pid").read_text())), read_log(log1)

        with anyio.fail_after(120):
            async with traced_client(env_for(home, fake, spans2), log2) as client:
                other = cast(RequestParamsMeta, {"traceparent": OTHER_TRACEPARENT})
                assert (await start(client, other))["run_id"] == run_id
                await until_completed(client, run_id)
        assert fake.calls() == {"architect": 1, "engineer": 2, "reviewer": 1}, read_log(log2)

    store = FilesystemStore(home)
    try:
        facts = await store.read_facts(run_id)
    finally:
        await store.close()
    ended = {(f.task_id, f.attempt) for f in facts if isinstance(f, TaskCompleted | AttemptFailed)}
    started = {(f.task_id, f.attempt) for f in facts if isinstance(f, AttemptStarted)}
    assert ended == {("architect", 1), ("engineer", 2), ("reviewer", 1)}
    assert started == ended | {("engineer", 1)}

    first, second = read_span_file(spans1), read_span_file(spans2)
    ours = [s for s in first + second if s.name.split(" ")[0] in ("run", "task", "attempt", "chat")]

    def attempts(spans: list[FinishedSpan]) -> set[tuple[str, int]]:
        return {
            (s.attributes["construct.task.id"], s.attributes["construct.attempt.number"])
            for s in named(spans, "attempt ")
        }

    # Every attempt that finished has its span; the one in flight at the kill is lost.
    assert attempts(first) == {("architect", 1)}
    assert attempts(second) == {("engineer", 2), ("reviewer", 1)}
    # One trace: the one the first start's _meta named (the second start's changes nothing).
    assert {s.trace_id for s in ours} == {TRACE_ID}
    # Server 1's span of the start call is the run's recorded parent; the drive it began (open at
    # the kill) is lost, and so are the engineer's task, attempt and model call there.
    [start_span] = [s for s in first if s.name == "tools/call orchestrate_start"]
    assert start_span.parent_id == CALLER_SPAN_ID
    assert named(first, "run ") == [] and {s.name for s in named(first, "task ")} == {"task architect"}
    assert len(named(first, "chat ")) == 1
    # Server 2 continues under that same parent.
    runs = named(second, "run ")
    assert runs and all(r.parent_id == start_span.span_id for r in runs)
    assert {r.attributes["construct.run.status"] for r in runs} >= {"completed"}
    tasks = {s.attributes["construct.task.id"]: s for s in named(second, "task ")}
    assert set(tasks) == {"engineer", "reviewer"}
    assert all(t.parent_id in {r.span_id for r in runs} for t in tasks.values())
    [engineer] = [s for s in named(second, "attempt ") if s.attributes["construct.task.id"] == "engineer"]
    assert engineer.parent_id == tasks["engineer"].span_id
    assert engineer.attributes["construct.attempt.follows_orphan"] == 1
    assert engineer.attributes["construct.attempt.possible_duplicate_call"] is True
    assert engineer.attributes["construct.attempt.outcome"] == "succeeded"
    # Each finished attempt made one model call, its child.
    chats = named(first + second, "chat ")
    assert sorted(c.parent_id or "" for c in chats) == sorted(s.span_id for s in named(ours, "attempt "))
    assert "secret-request-text" not in recorded_values(first + second)
    assert "sk-ant-test-trace-restart" not in recorded_values(first + second)

"""A parallel run killed while three provider calls are in flight (issue 10), on every persistent
store: the built-in ``research`` chain on the provider backend against the fake provider (real
HTTP). The fake holds each researcher's first call; once all three are in flight at once, the
server gets SIGKILL. A second server on the same store finds three orphaned attempts, retries each
once, marked as a possible duplicate call, and finishes the run: each branch's output is recorded
once, the writer runs once after all three.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestration.core.facts import AttemptStarted, TaskCompleted
from tests.acceptance.harness import call, pid_alive, read_log, stdio_client_for
from tests.acceptance.store_targets import BACKENDS, store_target
from tests.acceptance.test_kill_matrix import only_run, server_env
from tests.fakes.fake_provider import FakeProvider
from tests.unit.parallel import RESEARCHERS

pytestmark = pytest.mark.slow

HELD_SECONDS = 600  # longer than the test: a held call never answers server 1


def scenario() -> dict[str, Any]:
    held: dict[str, Any] = {
        name: [{"delay_seconds": HELD_SECONDS, "text": "late"}, {"text": f"findings of {name}"}]
        for name in RESEARCHERS
    }
    return held | {"writer": [{"text": "the report"}]}


async def host_research(env: dict[str, str], log: Path) -> dict[str, Any] | None:
    """Start (or, with the same idempotency key, find) the run and wait for its end; None when the
    server died under the client."""
    try:
        with anyio.fail_after(120):
            async with stdio_client_for(env, log) as client:
                view = await call(
                    client,
                    "orchestrate_start",
                    request="Should we adopt X?",
                    chain="research",
                    worker_backend="provider",
                    idempotency_key="research",
                    wait_seconds=30,
                )
                for _ in range(30):
                    if view["next_action"]["kind"] == "none":
                        return view
                    view = await call(client, "run_status", run_id=view["run_id"], wait_seconds=30)
                raise AssertionError(f"the run did not end: {view['status']}")
    except TimeoutError:
        raise
    except AssertionError:
        raise
    except Exception:
        return None


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_parallel_run_killed_with_three_calls_in_flight_finishes_once(
    backend: str, tmp_path: Path
) -> None:
    async with store_target(backend, tmp_path / "store") as target:
        with FakeProvider(scenario()) as fake:
            home1 = tmp_path / "s1"
            log1, log2 = tmp_path / "server1.log", tmp_path / "server2.log"

            async def kill_when_three_in_flight() -> None:
                with anyio.fail_after(60):
                    while any(fake.calls_for(name) < 1 for name in RESEARCHERS):  # noqa: ASYNC110 - another thread
                        await anyio.sleep(0.05)
                os.kill(int((home1 / "server.pid").read_text()), signal.SIGKILL)

            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_when_three_in_flight)
                first = await host_research(server_env(target, home1, fake), log1)
            assert first is None, "server 1 should have been killed"
            assert not pid_alive(int((home1 / "server.pid").read_text()))
            assert fake.calls() == dict.fromkeys(RESEARCHERS, 1), read_log(log1)

            second = await host_research(server_env(target, tmp_path / "s2", fake), log2)
            assert second is not None and second["status"] == "completed", read_log(log2)
            # Each researcher was called again exactly once (its orphan retried), the writer once.
            assert fake.calls() == dict.fromkeys(RESEARCHERS, 2) | {"writer": 1}
        got = await only_run(target)
    assert got.head.status == "completed"
    completed = [f for f in got.facts if isinstance(f, TaskCompleted)]
    assert sorted(f.task_id for f in completed) == sorted([*RESEARCHERS, "writer"])
    assert got.outputs == {name: f"findings of {name}" for name in RESEARCHERS} | {"writer": "the report"}
    # Three orphans (attempt 1 of each researcher), each retried once as attempt 2, marked.
    started = [f for f in got.facts if isinstance(f, AttemptStarted)]
    assert sorted((f.task_id, f.attempt) for f in started if f.task_id != "writer") == sorted(
        [(name, n) for name in RESEARCHERS for n in (1, 2)]
    )
    assert got.marked() == {name: [2] for name in RESEARCHERS}
    for fact in completed:
        assert fact.telemetry.possible_duplicate_call == (fact.task_id != "writer")
    # The writer started only after all three branches were recorded.
    writer_start = next(f.seq for f in started if f.task_id == "writer")
    assert all(f.seq < writer_start for f in completed if f.task_id != "writer")

"""Graceful shutdown (issue 5): SIGTERM or the end of stdin on a stdio server, SIGTERM on a
Streamable HTTP server.

Each case stops a real server while the fake provider holds one of its calls, and checks that it
stopped taking new work, let the write in progress finish, released the run's lease — a probe can
claim it at once, and a second server (with a 30 s lease TTL, so an expired lease cannot explain
it) finishes the run within seconds — and exited within a bounded time, which is measured. A call
the server was waiting on when the grace period ended is an orphaned attempt: the second server
retries it, marked as a possible duplicate provider call.
"""

from __future__ import annotations

import os
import signal
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from orchestration.core.facts import AttemptStarted, TaskCompleted
from orchestration.core.fold import fold
from tests.acceptance.harness import call, pid_alive, read_log, stdio_client_for
from tests.acceptance.processes import http_server, until_gone
from tests.acceptance.reliability import trial
from tests.acceptance.store_targets import BACKENDS, StoreTarget, store_target
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

#: Generous: the server's own grace period is about a second.
EXIT_BOUND_SECONDS = 15.0
#: The lease TTL of every server here: a takeover faster than this was not waiting for expiry.
LEASE_TTL = 30
CHAIN = ["architect", "engineer"]
LONG_CALL = 60.0
SHORT_CALL = 0.6


def answer(task: str) -> str:
    return f"{task}: the model's answer"


def scenario(architect_delay: float) -> dict[str, Any]:
    # Only the first architect call is slow: the retry after a shutdown answers at once.
    return {
        "architect": [
            {"text": answer("architect"), "delay_seconds": architect_delay},
            {"text": answer("architect")},
        ],
        "engineer": [{"text": answer("engineer")}],
    }


def provider_env(target: StoreTarget, home: Path, fake: FakeProvider) -> dict[str, str]:
    return target.env(
        home,
        CONSTRUCT_MODEL="claude-test-1",
        CONSTRUCT_ANTHROPIC_BASE_URL=fake.base_url,
        ANTHROPIC_API_KEY="sk-ant-test-shutdown",
        CONSTRUCT_LEASE_TTL_SECONDS=str(LEASE_TTL),
    )


async def start_run(client: Client) -> str:
    view = await call(
        client,
        "orchestrate_start",
        request="Design and build a rate limiter.",
        chain=CHAIN,
        worker_backend="provider",
        wait_seconds=0,
    )
    return str(view["run_id"])


async def until_called(fake: FakeProvider, task: str) -> None:
    with anyio.fail_after(30):
        # The fake counts on its own thread; there is no event to wait on.
        while fake.calls_for(task) < 1:  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def pid_of(home: Path) -> int:
    return int(await anyio.Path(home / "server.pid").read_text())


async def lease_is_free(target: StoreTarget, run_id: str) -> bool:
    """Whether another owner can claim the run's lease right now (it is released again at once)."""
    async with target.opened() as store:
        lease = await store.claim_lease(run_id, "shutdown-probe", 5, datetime.now(UTC))
        if lease is None:
            return False
        await store.release_lease(lease)
        return True


def assert_orderly_exit(log: str) -> None:
    assert "action=server_stopping" in log, log
    assert "action=store_closed" in log, log
    assert "Traceback" not in log, log


async def finish_on_a_second_server(
    target: StoreTarget, home: Path, fake: FakeProvider, run_id: str
) -> float:
    """Start another server on the store; return how long it took to finish the run."""
    started = anyio.current_time()
    async with stdio_client_for(provider_env(target, home, fake), home / "server.log") as client:
        view = await call(client, "run_status", run_id=run_id, wait_seconds=LEASE_TTL, detail="full")
    took = anyio.current_time() - started
    assert view["status"] == "completed", read_log(home / "server.log")
    assert [t["output"] for t in view["tasks"]] == [answer(t) for t in CHAIN]
    return took


async def check_record(target: StoreTarget, run_id: str, *, orphaned: bool) -> None:
    async with target.opened() as store:
        head = await store.load(run_id)
        facts = await store.read_facts(run_id)
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1))
    # The head is the fold of the log: no write was torn by the shutdown.
    assert fold(facts).model_dump(exclude={"version"}) == head.model_dump(exclude={"version"})
    started = [f for f in facts if isinstance(f, AttemptStarted) and f.task_id == "architect"]
    completed = [f for f in facts if isinstance(f, TaskCompleted)]
    assert len(completed) == len(CHAIN)
    if orphaned:
        assert [(a.attempt, a.possible_duplicate_call) for a in started] == [(1, False), (2, True)]
    else:
        assert [(a.attempt, a.possible_duplicate_call) for a in started] == [(1, False)]


async def pending_call(client: Client, run_id: str) -> None:
    """A call the server is still answering when it stops (it must not hold the shutdown up)."""
    # The connection goes away with the server: an error here is expected.
    with suppress(Exception):
        await client.call_tool("run_status", {"run_id": run_id, "wait_seconds": 120})


# ------------------------------------------------------------------------------------------------
# stdio


@pytest.mark.parametrize("backend", BACKENDS)
async def test_sigterm_on_stdio_during_a_long_call(backend: str, tmp_path: Path) -> None:
    """The call outlives the grace period: it is abandoned, the lease released, the server gone."""
    with trial("shutdown", transport="stdio", signal="SIGTERM", store=backend, call="long") as t:
        async with store_target(backend, tmp_path / "store") as target:
            with FakeProvider(scenario(LONG_CALL)) as fake:
                s1 = tmp_path / "s1"
                try:
                    async with stdio_client_for(
                        provider_env(target, s1, fake), tmp_path / "s1.log"
                    ) as client:
                        run_id = await start_run(client)
                        await until_called(fake, "architect")
                        pid = await pid_of(s1)
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(pending_call, client, run_id)
                            await anyio.sleep(0.2)
                            os.kill(pid, signal.SIGTERM)
                            exit_seconds = await until_gone(pid)
                            tg.cancel_scope.cancel()
                except Exception:
                    pass  # the client notices the server's exit on its way out
                log = read_log(tmp_path / "s1.log")
                assert exit_seconds < EXIT_BOUND_SECONDS, exit_seconds
                assert "action=shutdown_requested" in log
                assert_orderly_exit(log)
                assert not (s1 / "server.pid").exists()
                assert await lease_is_free(target, run_id)
                assert fake.calls() == {"architect": 1}
                takeover = await finish_on_a_second_server(target, tmp_path / "s2", fake, run_id)
                assert takeover < LEASE_TTL / 2, takeover
                assert fake.calls() == {"architect": 2, "engineer": 1}
            await check_record(target, run_id, orphaned=True)
        t.note(exit_seconds=round(exit_seconds, 2), takeover_seconds=round(takeover, 2))


async def test_sigterm_on_stdio_lets_a_call_finish_within_the_grace_period(tmp_path: Path) -> None:
    """The call ends within the grace period: its result is recorded, and nothing new starts."""
    with trial("shutdown", transport="stdio", signal="SIGTERM", store="filesystem", call="short") as t:
        async with store_target("filesystem", tmp_path / "store") as target:
            with FakeProvider(scenario(SHORT_CALL)) as fake:
                s1 = tmp_path / "s1"
                try:
                    async with stdio_client_for(
                        provider_env(target, s1, fake), tmp_path / "s1.log"
                    ) as client:
                        run_id = await start_run(client)
                        await until_called(fake, "architect")
                        pid = await pid_of(s1)
                        # SIGTERM mid-call; the call ends about 0.5 s later, within the grace period.
                        await anyio.sleep(0.1)
                        os.kill(pid, signal.SIGTERM)
                        exit_seconds = await until_gone(pid)
                except Exception:
                    pass
                assert exit_seconds < EXIT_BOUND_SECONDS, exit_seconds
                assert_orderly_exit(read_log(tmp_path / "s1.log"))
                # The architect's answer was recorded; the engineer was not started.
                assert fake.calls() == {"architect": 1}
                async with target.opened() as store:
                    head = await store.load(run_id)
                assert [t.status.value for t in head.tasks] == ["done", "pending"]
                assert await lease_is_free(target, run_id)
                takeover = await finish_on_a_second_server(target, tmp_path / "s2", fake, run_id)
                assert takeover < LEASE_TTL / 2, takeover
                assert fake.calls() == {"architect": 1, "engineer": 1}
            await check_record(target, run_id, orphaned=False)
        t.note(exit_seconds=round(exit_seconds, 2), takeover_seconds=round(takeover, 2))


async def test_end_of_stdin_stops_the_server_before_the_sdk_escalates(tmp_path: Path) -> None:
    """The official client closes stdin, waits 2 s, then sends SIGTERM (and SIGKILL 2 s later).
    The server must be gone before the SIGTERM: no ``shutdown_requested`` in its log."""
    with trial("shutdown", transport="stdio", signal="end of stdin", store="filesystem", call="long") as t:
        async with store_target("filesystem", tmp_path / "store") as target:
            with FakeProvider(scenario(LONG_CALL)) as fake:
                s1 = tmp_path / "s1"
                async with stdio_client_for(provider_env(target, s1, fake), tmp_path / "s1.log") as client:
                    run_id = await start_run(client)
                    await until_called(fake, "architect")
                    pid = await pid_of(s1)
                    closed_at = anyio.current_time()
                exit_seconds = anyio.current_time() - closed_at
                assert not pid_alive(pid)
                log = read_log(tmp_path / "s1.log")
                assert "action=shutdown_requested" not in log, "the SDK had to send SIGTERM"
                assert_orderly_exit(log)
                assert exit_seconds < EXIT_BOUND_SECONDS, exit_seconds
                assert await lease_is_free(target, run_id)
                takeover = await finish_on_a_second_server(target, tmp_path / "s2", fake, run_id)
                assert takeover < LEASE_TTL / 2, takeover
            await check_record(target, run_id, orphaned=True)
        t.note(exit_seconds=round(exit_seconds, 2), takeover_seconds=round(takeover, 2))


async def test_sigterm_on_an_idle_stdio_server(tmp_path: Path) -> None:
    with trial("shutdown", transport="stdio", signal="SIGTERM", store="filesystem", call="none") as t:
        async with store_target("filesystem", tmp_path / "store") as target:
            home = tmp_path / "s1"
            try:
                async with stdio_client_for(target.env(home), tmp_path / "s1.log") as client:
                    await call(client, "runs_list")
                    pid = await pid_of(home)
                    os.kill(pid, signal.SIGTERM)
                    exit_seconds = await until_gone(pid)
            except Exception:
                pass
        assert exit_seconds < 5.0, exit_seconds
        assert_orderly_exit(read_log(tmp_path / "s1.log"))
        assert not (home / "server.pid").exists()
        t.note(exit_seconds=round(exit_seconds, 2))


# ------------------------------------------------------------------------------------------------
# Streamable HTTP


@pytest.mark.parametrize("backend", ["filesystem", "postgres"])
async def test_sigterm_on_streamable_http_during_a_long_call(backend: str, tmp_path: Path) -> None:
    """With a client connected and waiting on a call, SIGTERM still stops the server in bounded
    time, exit status 0, lease released."""
    with trial("shutdown", transport="streamable-http", signal="SIGTERM", store=backend, call="long") as t:
        async with store_target(backend, tmp_path / "store") as target:
            with FakeProvider(scenario(LONG_CALL)) as fake:
                env = provider_env(target, tmp_path / "s1", fake)
                async with http_server(env, tmp_path / "s1.log") as (process, port):
                    try:
                        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                            run_id = await start_run(client)
                            await until_called(fake, "architect")
                            async with anyio.create_task_group() as tg:
                                tg.start_soon(pending_call, client, run_id)
                                await anyio.sleep(0.2)
                                signalled = anyio.current_time()
                                process.send_signal(signal.SIGTERM)
                                with anyio.fail_after(30):
                                    returncode = await process.wait()
                                exit_seconds = anyio.current_time() - signalled
                                tg.cancel_scope.cancel()
                    except Exception:
                        pass
                log = read_log(tmp_path / "s1.log")
                assert returncode == 0, log
                assert exit_seconds < EXIT_BOUND_SECONDS, exit_seconds
                assert_orderly_exit(log)
                assert await lease_is_free(target, run_id)
                takeover = await finish_on_a_second_server(target, tmp_path / "s2", fake, run_id)
                assert takeover < LEASE_TTL / 2, takeover
            await check_record(target, run_id, orphaned=True)
        t.note(exit_seconds=round(exit_seconds, 2), takeover_seconds=round(takeover, 2))

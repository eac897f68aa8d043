"""A lease is a fence, with real processes (issue 9): a server stopped with SIGSTOP in the middle of a
provider call for longer than its lease cannot record anything once another server took the run over.

Server A (alone on the store) starts a run; once A's architect call has reached the fake provider,
and right after one of A's lease renewals (so that A is not stopped inside a store transaction,
which would lock B out), A gets SIGSTOP. Server B starts on the same store, claims the run once A's
lease has expired, retries the architect call A left in flight (marked ``possible_duplicate_call``)
and, while B's call is still in flight, A gets SIGCONT. A wakes up holding a finished call, an
overdue renewal and an overdue cancel watch; whichever comes first, its drive stops with
``lease_lost`` and records nothing, and B finishes the run. Checked: the run is ``completed``, each
task's output is recorded once, no task reached the provider more than twice, the second call is
marked, and A logged the lost lease without a failure. The call counts are printed (``pytest -s``).
"""

from __future__ import annotations

import fcntl
import os
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path

import anyio
import asyncpg  # type: ignore[import-untyped]
import pytest
from mcp import Client

from orchestration.core.facts import TaskCompleted
from stores import parse_store_spec
from tests.acceptance.cluster import (
    TASKS,
    FakeProcess,
    Server,
    check_runs,
    fake_provider_process,
    records,
    server,
    server_env,
    start_arguments,
)
from tests.acceptance.harness import call, read_log
from tests.acceptance.reliability import trial
from tests.acceptance.store_targets import StoreTarget, store_target

pytestmark = pytest.mark.slow

LEASE_TTL = 2.0
#: A's call is answered while A is stopped (the answer waits in the socket); B's call is still in
#: flight when A resumes.
FIRST_CALL, SECOND_CALL = 1.0, 3.0
RUN = "s1"


def scenario() -> dict[str, object]:
    return {
        f"{RUN}/architect": [
            {"text": "architect done", "delay_seconds": FIRST_CALL},
            {"text": "architect done", "delay_seconds": SECOND_CALL},
        ],
        "default": [{"text": "done"}],
    }


async def lease_record(target: StoreTarget, run_id: str) -> object:
    """The run's stored lease as the store keeps it (it changes at every claim and renewal)."""
    spec = parse_store_spec(target.url, home=target.workdir)
    if target.backend == "filesystem":
        assert spec.path is not None
        path = anyio.Path(spec.path / "runs" / run_id / "lease.json")
        return await path.read_bytes() if await path.exists() else None
    if target.backend == "sqlite":
        assert spec.path is not None
        conn = sqlite3.connect(spec.path)
        try:
            return conn.execute("SELECT expires_at, token FROM leases WHERE run_id = ?", (run_id,)).fetchall()
        finally:
            conn.close()
    conn = await asyncpg.connect(spec.dsn, server_settings={"search_path": spec.schema})
    try:
        return [
            tuple(r)
            for r in await conn.fetch("SELECT expires_at, token FROM leases WHERE run_id = $1", run_id)
        ]
    finally:
        await conn.close()


async def wait_for_calls(fake: FakeProcess, key: str, count: int, within: float) -> None:
    with anyio.fail_after(within):
        # The fake provider counts requests as they arrive; the test can only look.
        while (await fake.calls()).get(key, 0) < count:  # noqa: ASYNC110
            await anyio.sleep(0.02)


async def stop_right_after_a_renewal(a: Server, target: StoreTarget, run_id: str) -> None:
    """SIGSTOP ``a`` just after its lease record changed (a renewal committed): its next renewal is
    a third of the TTL away, so it is not stopped holding the store's lock. On a busy machine ``a``
    may still be finishing that renewal (the filesystem store fsyncs the directory before it lets go
    of the run's lock): where the lock is the process's own (a file lock), the test takes the same
    lock first, so ``a`` cannot hold it at the moment it stops."""
    with anyio.fail_after(10):
        seen = await lease_record(target, run_id)
        # Another process's lease record: nothing signals its change but looking.
        while (now := await lease_record(target, run_id)) == seen or now in (None, []):  # noqa: ASYNC110
            await anyio.sleep(0.005)
    with anyio.fail_after(10):
        release = await hold_the_runs_write_lock(target, run_id)
    try:
        os.kill(a.pid, signal.SIGSTOP)
    finally:
        release()


async def hold_the_runs_write_lock(target: StoreTarget, run_id: str) -> Callable[[], None]:
    """Take the lock a write to ``run_id`` takes (filesystem: the run's flock; sqlite: the
    database's write lock) and return what gives it back. Postgres takes its locks in the server,
    for the statement a client is running: nothing to take here (a renewal is one statement)."""
    spec = parse_store_spec(target.url, home=target.workdir)
    if target.backend == "filesystem":
        assert spec.path is not None
        fd = os.open(spec.path / "runs" / run_id / "lock", os.O_RDWR)
        await anyio.to_thread.run_sync(fcntl.flock, fd, fcntl.LOCK_EX)
        return lambda: os.close(fd)
    if target.backend == "sqlite":
        assert spec.path is not None
        conn = sqlite3.connect(spec.path, timeout=10, isolation_level=None, check_same_thread=False)
        await anyio.to_thread.run_sync(conn.execute, "BEGIN IMMEDIATE")

        def release() -> None:
            conn.execute("ROLLBACK")
            conn.close()

        return release
    return lambda: None


@pytest.mark.parametrize(
    "backend", ["filesystem", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_server_stopped_past_its_lease_records_nothing_after_another_took_the_run(
    backend: str, tmp_path: Path
) -> None:
    async with (
        store_target(backend, tmp_path / backend) as target,
        fake_provider_process(scenario(), tmp_path / "fake") as fake,
    ):
        ttl = {"CONSTRUCT_LEASE_TTL_SECONDS": str(LEASE_TTL)}
        # A polls rarely, so that it is in no store transaction of its own while stopped (its drive
        # is started by the run's creation, not by a poll); B polls often, to take over soon.
        env_a = server_env(target, target.workdir / "a", fake, {**ttl, "CONSTRUCT_POLL_SECONDS": "30"})
        env_b = server_env(target, target.workdir / "b", fake, {**ttl, "CONSTRUCT_POLL_SECONDS": "0.2"})
        with trial("lease_sigstop", store=backend, lease_ttl=LEASE_TTL) as t:
            async with server("a", env_a, target.workdir / "a") as a:
                stopped = False
                try:
                    async with Client(a.url, read_timeout_seconds=60) as client:
                        view = await call(client, "orchestrate_start", **start_arguments(RUN))
                    run_id = view["run_id"]
                    await wait_for_calls(fake, f"{RUN}/architect", 1, within=30)
                    await stop_right_after_a_renewal(a, target, run_id)
                    stopped = True
                    async with server("b", env_b, target.workdir / "b") as b:
                        # B claims the run once A's lease expired and calls again (A is still stopped).
                        await wait_for_calls(fake, f"{RUN}/architect", 2, within=30)
                        os.kill(a.pid, signal.SIGCONT)
                        stopped = False
                        async with target.opened() as store:
                            with anyio.fail_after(30):
                                while not (await store.load(run_id)).status.is_terminal:  # noqa: ASYNC110
                                    await anyio.sleep(0.05)
                        with anyio.fail_after(10):
                            # A writes its log line when its drive has stopped; the test can only look.
                            while "action=drive_lease_lost" not in a.log():  # noqa: ASYNC110
                                await anyio.sleep(0.05)
                        assert a.process.returncode is None and b.process.returncode is None
                finally:
                    if stopped:
                        # Never leave a stopped process behind: it could not even be terminated.
                        os.kill(a.pid, signal.SIGCONT)
            calls = await fake.calls()
            runs = await records(target, {RUN: run_id})
            # Completed, each task's output recorded once, each task called once, except a task whose
            # call was in flight at the stop: twice, the second attempt marked.
            twice = check_runs(runs, calls, interrupted=True)
            assert twice == 1 and calls[f"{RUN}/architect"] == 2, calls
            assert runs[0].marked() == [("architect", 2)]
            outputs = [f.task_id for f in runs[0].facts if isinstance(f, TaskCompleted)]
            assert outputs == list(TASKS)
            log_a = read_log(a.log_path)
            assert "action=drive_failed" not in log_a and "action=drive_crashed" not in log_a
            per_task = {task: calls.get(f"{RUN}/{task}", 0) for task in TASKS}
            print(
                f"\nlease sigstop ({backend}): provider calls per task {per_task}; marked "
                f"possible_duplicate_call: {runs[0].marked()}"
            )
            t.note(calls_per_task=per_task, marked=runs[0].marked())

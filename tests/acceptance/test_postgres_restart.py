"""Store faults (issue 5): the PostgreSQL cluster is restarted, or stopped for a while, under a server
that is in the middle of runs (provider backend, fake provider, real processes).

* **Restart mid-run**: the server rides it out. No fact is lost or written twice (sequence numbers
  contiguous, one ``task_completed`` per task), every task is called once — the calls in flight go
  on, their outcomes wait for the database — and every run completes once it is back.
* **Down past the outage deadline** (``CONSTRUCT_STORE_OUTAGE_SECONDS``): the call in flight is
  cancelled and the drive stops cleanly; tool calls meanwhile answer ``store_unavailable``; the
  server stays up, and once the database is started again the run resumes from its facts (the
  cancelled attempt retried, marked ``possible_duplicate_call``) and completes.

The cluster is controlled with ``pg_ctlcluster`` (root; the newest cluster under /etc/postgresql,
named ``main``), or with the command in ``CONSTRUCT_TEST_POSTGRES_CTL`` (e.g. ``pg_ctlcluster
--skip-systemctl-redirect 15 main``; the test appends ``stop``, ``start``, ``restart``, ``status``).
Without either the tests skip locally and fail with ``CI=true``, like every postgres test. Whatever
happens, the cluster is running again when a test ends: other tests need it.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import asyncpg  # type: ignore[import-untyped]
import pytest

from tests.acceptance.cluster import (
    TASKS,
    Server,
    check_runs,
    clients,
    fake_provider_process,
    records,
    server,
    server_env,
    start_runs,
    wait_for_runs,
)
from tests.acceptance.harness import call, call_error
from tests.acceptance.reliability import trial
from tests.acceptance.store_targets import store_target
from tests.stores.sql_adapters import POSTGRES_DSN_ENV, _unavailable

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

CTL_ENV = "CONSTRUCT_TEST_POSTGRES_CTL"


def control_command() -> list[str] | None:
    if os.environ.get(CTL_ENV, "").strip():
        return shlex.split(os.environ[CTL_ENV])
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if shutil.which("pg_ctlcluster") and os.geteuid() == 0 and versions:
        return ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main"]
    return None


class Cluster:
    def __init__(self, command: list[str], dsn: str) -> None:
        self.command = command
        self.dsn = dsn

    async def ctl(self, action: str) -> None:
        with anyio.fail_after(60):
            await anyio.run_process([*self.command, action])

    async def running(self) -> bool:
        result = await anyio.run_process([*self.command, "status"], check=False)
        return result.returncode == 0

    async def answering(self) -> bool:
        try:
            conn = await asyncpg.connect(self.dsn, timeout=2)
        except (OSError, asyncpg.PostgresError):
            return False
        await conn.close()
        return True

    async def wait_answering(self) -> None:
        with anyio.fail_after(60):
            # Nothing signals that another process is up but trying it.
            while not await self.answering():  # noqa: ASYNC110
                await anyio.sleep(0.1)


@asynccontextmanager
async def controlled_cluster() -> AsyncIterator[Cluster]:
    """The cluster, started again on exit if a test left it stopped (whatever went wrong)."""
    command = control_command()
    if command is None:
        _unavailable(
            f"cannot stop and start PostgreSQL here: set {CTL_ENV} (or run as root with pg_ctlcluster)"
        )
        raise AssertionError("unreachable")
    cluster = Cluster(command, os.environ[POSTGRES_DSN_ENV])
    try:
        yield cluster
    finally:
        with anyio.CancelScope(shield=True):
            if not await cluster.running():
                await cluster.ctl("start")
            await cluster.wait_answering()


def log_has(s: Server, action: str) -> bool:
    """Whether the server logged the event (the tests poll for it: other processes have no events
    to wait on, hence the ASYNC110 exemptions below)."""
    return f"action={action}" in s.log()


# ------------------------------------------------------------------------------------------------


async def test_a_restart_mid_run_loses_nothing_and_every_run_completes(tmp_path: Path) -> None:
    names = [f"p{n}" for n in range(6)]
    async with (
        store_target("postgres", tmp_path / "pg") as target,
        controlled_cluster() as pg,
        fake_provider_process(
            {"default": [{"text": "done", "delay_seconds": 1.0}]}, tmp_path / "fake"
        ) as fake,
    ):
        env = server_env(
            target,
            tmp_path / "s",
            fake,
            {
                "CONSTRUCT_POLL_SECONDS": "0.5",
                # Longer than the restart: the leases outlive it, no other worker could take over.
                "CONSTRUCT_LEASE_TTL_SECONDS": "10",
                "CONSTRUCT_STORE_OUTAGE_SECONDS": "30",
            },
        )
        with trial("postgres_restart", store="postgres", runs=len(names)) as t:
            async with server("s", env, tmp_path / "s") as s, clients([s]) as via:
                run_ids = await start_runs(via, names)
                # Mid-run: calls in flight, some tasks done, some not started.
                with anyio.fail_after(30):
                    while sum((await fake.calls()).values()) < len(names) + 2:  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                restarted = anyio.current_time()
                await pg.ctl("restart")
                await pg.wait_answering()
                down_for = anyio.current_time() - restarted
                await wait_for_runs(target, len(names), within=60)
                finished = anyio.current_time() - restarted
                assert s.process.returncode is None, s.log()
                # The server did see the database go away, and is whole again: its tools answer
                # (the same MCP session as before the restart), and it listens for notifications.
                assert log_has(s, "drive_store_error") or log_has(s, "dispatch_store_unavailable"), s.log()
                for run_id in run_ids.values():
                    assert (await call(via[0], "run_status", run_id=run_id))["status"] == "completed"
                with anyio.fail_after(10):
                    while not log_has(s, "store.listen_restored"):  # noqa: ASYNC110
                        await anyio.sleep(0.1)
            calls = await fake.calls()
            check_runs(await records(target, run_ids), calls)
            assert sum(calls.values()) == len(names) * len(TASKS)
            print(
                f"\npostgres restart: down {down_for:.1f} s; {len(names)} runs completed {finished:.1f} s "
                "after the restart began; every task called once, no fact lost or written twice"
            )
            t.note(restart_seconds=round(down_for, 1), provider_calls=sum(calls.values()))


OUTAGE_SECONDS = 3.0
LONG_CALL = 8.0


async def test_down_past_the_outage_deadline_stops_cleanly_and_resumes_when_back(tmp_path: Path) -> None:
    scenario = {
        "default": [{"text": "done", "delay_seconds": 0.1}],
        # The first engineer call is in flight when the database goes; its retry answers at once.
        "engineer": [{"text": "late", "delay_seconds": LONG_CALL}, {"text": "done"}],
    }
    async with (
        store_target("postgres", tmp_path / "pg") as target,
        controlled_cluster() as pg,
        fake_provider_process(scenario, tmp_path / "fake") as fake,
    ):
        env = server_env(
            target,
            tmp_path / "s",
            fake,
            {
                "CONSTRUCT_POLL_SECONDS": "0.5",
                # Long: the run must resume because the server releases its lease, not because it expired.
                "CONSTRUCT_LEASE_TTL_SECONDS": "60",
                "CONSTRUCT_STORE_OUTAGE_SECONDS": str(OUTAGE_SECONDS),
            },
        )
        with trial("postgres_down", store="postgres", outage_seconds=OUTAGE_SECONDS) as t:
            async with server("s", env, tmp_path / "s") as s, clients([s]) as via:
                run_ids = await start_runs(via, ["d0"])
                with anyio.fail_after(30):
                    while (await fake.calls()).get("d0/engineer", 0) < 1:  # noqa: ASYNC110
                        await anyio.sleep(0.02)
                await pg.ctl("stop")
                stopped = anyio.current_time()

                # A tool call during the outage: a typed answer, not a crash.
                text = await call_error(via[0], "run_status", run_id=run_ids["d0"])
                assert text.startswith("store_unavailable: "), text

                # The drive gives up after the outage deadline, long before the call would end.
                with anyio.fail_after(OUTAGE_SECONDS + 10):
                    while not log_has(s, "drive_interrupted"):  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                gave_up = anyio.current_time() - stopped
                assert gave_up < LONG_CALL, gave_up
                assert log_has(s, "drive_store_outage"), s.log()
                assert s.process.returncode is None, s.log()

                await pg.ctl("start")
                back = anyio.current_time()
                await wait_for_runs(target, 1, within=30)
                resumed = anyio.current_time() - back
                # Lease ttl 60 s: it resumed because the server released its lease.
                assert resumed < 15, resumed
                view_text = await call_error(
                    via[0], "orchestrate_approve", run_id=run_ids["d0"], decision="approve"
                )
                assert view_text.startswith("invalid_state: "), view_text
            calls = await fake.calls()
            runs = await records(target, run_ids)
            assert check_runs(runs, calls, interrupted=True) == 1
            assert calls == {"d0/architect": 1, "d0/engineer": 2, "d0/reviewer": 1}
            assert runs[0].marked() == [("engineer", 2)]
            print(
                f"\npostgres down past the {OUTAGE_SECONDS:g} s outage deadline: the drive stopped "
                f"{gave_up:.1f} s after the database went (call cancelled), and the run completed "
                f"{resumed:.1f} s after it was started again"
            )
            t.note(stopped_after_seconds=round(gave_up, 1), resumed_after_seconds=round(resumed, 1))

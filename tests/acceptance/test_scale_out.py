"""Scale-out (issue 5): several ``construct-mcp serve`` processes on one store execute runs together.

* **Postgres, 3 servers, 200 runs of 3 tasks** started through the servers' MCP tools (spread over
  the three), run by the provider backend against one fake provider process: every run completes,
  every task is called exactly once (the fake counts calls per run and task), and every server did
  part of the work. The runs per second are printed (``pytest -s``; ``bench/scale_out.py`` prints
  the same figure outside pytest).
* **Then one server is SIGKILLed mid-way** through a second batch: the runs it held are finished by
  the other two once their leases expire (a short ``CONSTRUCT_LEASE_TTL_SECONDS``); a task whose
  call was in flight at the kill is called a second time, and that attempt is marked
  ``possible_duplicate_call``; every other task once.
* **An approval wakes the run on another server at once** (LISTEN/NOTIFY): with a 30 s poll, an
  approval recorded by another process (here the test itself, as the CLI or a third server would)
  is picked up by a server in well under a second.
* **SQLite and filesystem**: two servers on one store, no task executed twice.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import anyio
import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core.facts import ApprovalDecided, AttemptStarted
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from stores import parse_store_spec
from tests.acceptance.cluster import (
    TASKS,
    FakeProcess,
    Server,
    check_runs,
    clients,
    fake_provider_process,
    records,
    server_env,
    servers,
    start_runs,
    wait_for_runs,
)
from tests.acceptance.harness import call
from tests.acceptance.reliability import trial
from tests.acceptance.store_targets import StoreTarget, store_target

pytestmark = pytest.mark.slow

RUNS = 200
KILL_RUNS = 45
#: Per call: short in the throughput phase, longer in the kill phase so that calls are in flight.
FAST_CALL, SLOW_CALL = 0.02, 0.3
LEASE_TTL = 3.0


def scenario() -> dict[str, Any]:
    slow = {
        f"k{n}/{task}": [{"text": f"{task} done", "delay_seconds": SLOW_CALL}]
        for n in range(KILL_RUNS)
        for task in TASKS
    }
    return {"default": [{"text": "done", "delay_seconds": FAST_CALL}], **slow}


async def leases_of(target: StoreTarget, server: Server, *, live_only: bool) -> list[str]:
    """The runs whose lease ``server`` holds (owner ``host:pid:random``). After a SIGKILL its leases
    stay in the table, expired, until another server claims the run: ``live_only=False`` then lists
    exactly the runs it held when it died."""
    spec = parse_store_spec(target.url, home=target.workdir)
    conn = await asyncpg.connect(spec.dsn, server_settings={"search_path": spec.schema})
    try:
        rows = await conn.fetch(
            "SELECT run_id FROM leases WHERE split_part(owner, ':', 2) = $1 AND ($2 OR expires_at > now())",
            str(server.pid),
            not live_only,
        )
    finally:
        await conn.close()
    return [str(row[0]) for row in rows]


def tasks_completed_by(server: Server) -> int:
    return sum(
        1
        for line in server.log().splitlines()
        if "action=facts_recorded" in line and "task_completed" in line
    )


def cluster(
    target: StoreTarget, fake: FakeProcess, count: int, **extra: str
) -> list[tuple[str, dict[str, str], Path]]:
    homes = [target.workdir / f"s{n}" for n in range(count)]
    return [(f"s{n}", server_env(target, home, fake, extra), home) for n, home in enumerate(homes)]


# ------------------------------------------------------------------------------------------------
# Postgres: 3 servers, 200 runs, then a SIGKILL


@pytest.mark.postgres
async def test_three_servers_on_postgres_share_the_runs_and_take_over_a_killed_one(tmp_path: Path) -> None:
    async with (
        store_target("postgres", tmp_path / "pg") as target,
        fake_provider_process(scenario(), tmp_path / "fake") as fake,
    ):
        # A short lease, for a quick takeover after the kill; renewed every second, it still leaves
        # a server on a busy machine two seconds of slack before another may take its run.
        env = cluster(
            target, fake, 3, CONSTRUCT_LEASE_TTL_SECONDS=str(LEASE_TTL), CONSTRUCT_POLL_SECONDS="0.5"
        )
        async with servers(env) as running:
            # -- phase 1: throughput, every task exactly once -------------------------------------
            with trial("scale_out", store="postgres", servers=3, runs=RUNS) as t:
                async with clients(running) as via:
                    started = anyio.current_time()
                    run_ids = await start_runs(via, [f"r{n}" for n in range(RUNS)])
                    done = await wait_for_runs(target, RUNS, within=120)
                seconds = done - started
                calls = await fake.calls()
                check_runs(await records(target, run_ids), calls)
                shares = [tasks_completed_by(s) for s in running]
                assert sum(shares) == RUNS * len(TASKS) and min(shares) > 0, shares
                print(
                    f"\nscale-out: {RUNS} runs x {len(TASKS)} tasks on 3 servers (postgres) in "
                    f"{seconds:.1f} s: {RUNS / seconds:.1f} runs/s; tasks per server {shares}"
                )
                t.note(
                    runs_per_second=round(RUNS / seconds, 1),
                    tasks_per_server=shares,
                    provider_calls=sum(calls.values()),
                )

            # -- phase 2: one server SIGKILLed mid-way --------------------------------------------
            victim, survivors = running[0], running[1:]
            with trial("scale_out_kill", store="postgres", servers=3, runs=KILL_RUNS) as t:
                async with clients(running) as via:
                    kill_ids = await start_runs(via, [f"k{n}" for n in range(KILL_RUNS)])
                # Mid-way: the victim holds runs, and part of the batch is done.
                with anyio.fail_after(60):
                    while True:
                        holding = await leases_of(target, victim, live_only=True)
                        progress = sum(1 for k, n in (await fake.calls()).items() if k.startswith("k") and n)
                        if len(holding) >= 3 and progress >= KILL_RUNS // 2:
                            break
                        await anyio.sleep(0.05)
                victim.kill()
                killed_at = anyio.current_time()
                await victim.process.wait()
                # Read before the survivors' claims overwrite them (when the leases run out).
                held = await leases_of(target, victim, live_only=False)
                assert held, "the victim held runs when it died"
                await wait_for_runs(target, RUNS + KILL_RUNS, within=90)
                taken_over = anyio.current_time() - killed_at
                calls = {k: n for k, n in (await fake.calls()).items() if k.startswith("k")}
                runs = await records(target, kill_ids)
                twice = check_runs(runs, calls, interrupted=True)
                # Only the victim's runs can have been interrupted, once each at most.
                victims = {r.name for r in runs if r.head.run_id in held}
                assert all(r.name in victims for r in runs if r.marked()), [
                    r.name for r in runs if r.marked()
                ]
                assert twice <= len(held)
                assert all(s.process.returncode is None for s in survivors)
                print(
                    f"\nscale-out kill: SIGKILL of 1 of 3 servers holding {len(held)} runs; all "
                    f"{KILL_RUNS} runs done {taken_over:.1f} s later (lease ttl {LEASE_TTL:g} s); "
                    f"{twice} task(s) called twice, each marked possible_duplicate_call"
                )
                t.note(
                    runs_held_by_victim=len(held), called_twice=twice, seconds_to_finish=round(taken_over, 1)
                )


# ------------------------------------------------------------------------------------------------
# Postgres: an approval wakes the run through LISTEN/NOTIFY, not the poll


POLL = 30.0


@pytest.mark.postgres
async def test_an_approval_from_another_process_wakes_a_server_through_notify(tmp_path: Path) -> None:
    async with (
        store_target("postgres", tmp_path / "pg") as target,
        fake_provider_process({"default": [{"text": "done"}]}, tmp_path / "fake") as fake,
    ):
        env = cluster(target, fake, 2, CONSTRUCT_POLL_SECONDS=str(POLL))
        async with servers(env) as running, clients(running) as via:
            names = [f"n{n}" for n in range(4)]
            run_ids = await start_runs(via, names, approve_before=["engineer"])
            # Found without any poll: the start woke its own server, the NOTIFY the other one.
            await wait_for_runs(
                target, len(names), within=15, statuses=frozenset({RunStatus.AWAITING_APPROVAL})
            )

            # The approver is another process: a runtime on the store with no dispatcher (as the CLI
            # or a third server would be). Nothing but the NOTIFY tells the servers.
            latencies: list[float] = []
            with trial("notify_wakeup", store="postgres", servers=2, poll_seconds=POLL) as t:
                async with target.opened() as store:
                    approver = Runtime(store, Catalog.builtin(), settings=RuntimeSettings(owner="approver"))
                    for name in names:
                        await approver.approve(run_ids[name], "approve", "before:engineer", approver="test")
                        with anyio.fail_after(POLL / 3):
                            # The servers write; the test can only look.
                            while (await store.load(run_ids[name])).status != RunStatus.COMPLETED:  # noqa: ASYNC110
                                await anyio.sleep(0.02)
                        facts = await store.read_facts(run_ids[name])
                        approval = next(f for f in facts if isinstance(f, ApprovalDecided))
                        woke = next(
                            f for f in facts if f.seq > approval.seq and isinstance(f, AttemptStarted)
                        )
                        latencies.append((woke.at - approval.at).total_seconds())
                # Well under the poll interval: woken by the notification.
                assert max(latencies) < 2.0, latencies
                print(
                    "\nnotify wake-up: approval to next attempt median "
                    f"{statistics.median(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms "
                    f"(poll interval {POLL:g} s)"
                )
                t.note(latency_ms=[round(x * 1000) for x in latencies])

            # The same through a server's tool: the other server may be the one that runs it.
            run_id = (await start_runs(via[:1], ["n-tool"], approve_before=["engineer"]))["n-tool"]
            view = await call(via[0], "run_status", run_id=run_id, wait_seconds=15)
            assert view["status"] == "awaiting_approval", view["status"]
            view = await call(
                via[1],
                "orchestrate_approve",
                run_id=run_id,
                decision="approve",
                gate_id="before:engineer",
                wait_seconds=10,
            )
            assert view["status"] == "completed", view["status"]
            check_runs(await records(target, {**run_ids, "n-tool": run_id}), await fake.calls())


# ------------------------------------------------------------------------------------------------
# SQLite and filesystem: several processes on one machine


@pytest.mark.parametrize("backend", ["sqlite", "filesystem"])
async def test_two_servers_on_one_local_store_run_each_task_once(backend: str, tmp_path: Path) -> None:
    count = 40
    async with (
        store_target(backend, tmp_path / backend) as target,
        fake_provider_process(
            {"default": [{"text": "done", "delay_seconds": FAST_CALL}]}, tmp_path / "fake"
        ) as fake,
    ):
        env = cluster(target, fake, 2, CONSTRUCT_POLL_SECONDS="0.2")
        with trial("scale_out", store=backend, servers=2, runs=count) as t:
            async with servers(env) as running, clients(running) as via:
                started = anyio.current_time()
                run_ids = await start_runs(via, [f"r{n}" for n in range(count)])
                seconds = await wait_for_runs(target, count, within=120) - started
                shares = [tasks_completed_by(s) for s in running]
            calls = await fake.calls()
            check_runs(await records(target, run_ids), calls)
            assert sum(shares) == count * len(TASKS), shares
            print(
                f"\nscale-out {backend}: {count} runs on 2 servers in {seconds:.1f} s "
                f"({count / seconds:.1f} runs/s); tasks per server {shares}"
            )
            t.note(runs_per_second=round(count / seconds, 1), tasks_per_server=shares)

"""A cancel made by another process reaches the provider call in flight without the drive
reloading its run (issue 24, upkeep per server): within one ``cancel_poll_seconds`` through the
runtime's batched version check alone (no listener: here no dispatcher listens), and at once
through the store's notification alone (Postgres ``LISTEN``, the batched check pushed out to an
hour). While the call waits, its run's record is never read: only the versions of the runs with
calls in flight, one read per interval."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from orchestration.core.vocabulary import RunStatus
from orchestration.engine.dispatcher import Dispatcher
from orchestration.engine.runtime import Runtime
from tests.unit.engine.test_dispatcher import dispatching, runtime_on, shared_stores
from tests.unit.faulty import CountingWorker, FaultyStore, start_request

#: the default interval of the batched version check (Runtime's cancel_poll_seconds)
INTERVAL = 0.5
#: scheduling slack on a loaded 2-core machine, on top of the bound
SLACK = 0.75


async def _cancel_while_calling(
    driving: Runtime,
    other: Runtime,
    worker: CountingWorker,
    store: FaultyStore,
    drive: Callable[[str], object],
) -> float:
    """Start a run on ``driving`` and ``drive`` it, cancel it through ``other`` while its call is
    in flight; the seconds from the cancel's commit to the call's stop. Also checks that no record
    of the run was read while the call waited."""
    head, _ = await driving.start(start_request("c1"))
    drive(head.run_id)
    with anyio.fail_after(30):
        while not worker.in_flight:  # noqa: ASYNC110 (a counter, no event)
            await anyio.sleep(0.005)
    loads = store.calls["load"]
    await anyio.sleep(INTERVAL * 2.5)  # a few intervals with the call in flight
    assert store.calls["load"] == loads, "the run's record was read while its call waited"
    await other.cancel(head.run_id, "stop")
    cancelled_at = anyio.current_time()
    with anyio.fail_after(30):
        while not worker.cancelled:  # noqa: ASYNC110
            await anyio.sleep(0.005)
    elapsed = anyio.current_time() - cancelled_at
    with anyio.fail_after(30):
        while (await other.status(head.run_id)).status != RunStatus.CANCELLED:  # noqa: ASYNC110
            await anyio.sleep(0.05)
    return elapsed


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_the_batched_check_alone_stops_a_cancelled_call_within_one_interval(
    backend: str, tmp_path: Path
) -> None:
    async with shared_stores(backend, tmp_path, 2) as (mine, theirs):
        store, worker = FaultyStore(mine), CountingWorker(delay=3600)
        driving = runtime_on(store, worker, "driver")
        driving.settings = replace(driving.settings, cancel_poll_seconds=INTERVAL)
        other = runtime_on(theirs, CountingWorker(), "other")
        async with anyio.create_task_group() as tg:
            # No dispatcher: nothing listens; only the batched version check can see the cancel.
            elapsed = await _cancel_while_calling(
                driving, other, worker, store, lambda run_id: tg.start_soon(driving.drive, run_id)
            )
        assert store.calls["versions"] >= 2, "the call was watched by versions, once per interval"
        assert elapsed <= INTERVAL + SLACK


async def test_the_notification_alone_stops_a_cancelled_call_at_once(tmp_path: Path) -> None:
    async with shared_stores("postgres", tmp_path, 2) as (mine, theirs):
        store, worker = FaultyStore(mine), CountingWorker(delay=3600)
        driving = runtime_on(store, worker, "driver")
        driving.settings = replace(driving.settings, cancel_poll_seconds=3600)  # the batched check is off
        other = runtime_on(theirs, CountingWorker(), "other")
        dispatcher = Dispatcher(driving, concurrency=4, poll_seconds=1.0)
        async with dispatching(dispatcher):
            # The dispatcher claims the run (woken by the start) and listens.
            elapsed = await _cancel_while_calling(driving, other, worker, store, lambda _: None)
        assert elapsed <= SLACK

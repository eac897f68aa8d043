"""Back-pressure, not failure (issue 24): a call that waits for a local resource (an HTTP
connection of the server's pool, the provider's concurrency limit) is not a provider failure.

The server's wiring sizes the provider HTTP pool from the providers' ``max_concurrency``: with 64
allowed, 64 calls are at the provider at once, none queued behind a connection and none recorded
as a timed-out attempt. The fake holds every request until all of them arrived (or a bound passed:
then the test fails on the count, and the calls left waiting show what the old pool did to them).
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from pydantic import ValidationError

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.runtime import Runtime
from server.settings.config import ProviderTable, Settings
from server.wiring import runtime_for
from stores.memory import MemoryStore
from tests.fakes.fake_provider import FakeProvider

RUNS = 70
CONCURRENCY = 64


def provider_settings(tmp_path: Path, fake: FakeProvider) -> Settings:
    table = ProviderTable(base_url=fake.base_url, api_key="sk-test", max_concurrency=CONCURRENCY)
    return Settings(home=tmp_path, worker_backend="provider", model="fake-model", providers={"openai": table})


async def held_until_all_arrived(fake: FakeProvider, expected: int, bound_seconds: float) -> None:
    """Keep the fake holding its requests until ``expected`` are in flight, or ``bound_seconds``."""
    deadline = time.monotonic() + bound_seconds
    while fake.in_flight()[0] < expected and time.monotonic() < deadline:  # noqa: ASYNC110
        await anyio.sleep(0.05)  # the count changes on the fake's thread: no event to wait for
    fake.hold(False)


async def drive_all(runtime: Runtime, run_ids: list[str]) -> None:
    async with anyio.create_task_group() as tg:
        for run_id in run_ids:
            tg.start_soon(runtime.drive, run_id)


async def test_as_many_calls_as_max_concurrency_reach_the_provider_and_none_fails(tmp_path: Path) -> None:
    with FakeProvider({}) as fake:
        settings = provider_settings(tmp_path, fake)
        async with runtime_for(settings, MemoryStore(), Catalog.builtin()) as runtime:
            run_ids = [
                (await runtime.start(StartRequest(f"task {i} [run:r{i}]")))[0].run_id for i in range(RUNS)
            ]
            fake.hold()
            async with anyio.create_task_group() as tg:
                tg.start_soon(held_until_all_arrived, fake, CONCURRENCY, 45.0)
                await drive_all(runtime, run_ids)
            statuses = [await runtime.status(run_id) for run_id in run_ids]
        _now, peak = fake.in_flight()
        calls = fake.calls()
    assert peak == CONCURRENCY
    assert [s.status for s in statuses] == [RunStatus.COMPLETED] * RUNS
    # every task was called once: no attempt failed for waiting
    assert sorted(set(calls.values())) == [1]
    assert len(calls) == 3 * RUNS


def test_concurrency_is_bounded_by_memory_not_by_256(tmp_path: Path) -> None:
    # ~110-135 KiB of server memory per live run (bench/live_run_memory.py): 10,000 is ~1.3 GiB
    settings = Settings(
        home=tmp_path,
        dispatch_concurrency=1000,
        providers={"anthropic": ProviderTable(max_concurrency=2000)},
    )
    assert settings.dispatch_concurrency == 1000
    with pytest.raises(ValidationError):
        Settings(home=tmp_path, dispatch_concurrency=10_001)

"""The postgres store's pool is the server's ``store_pool_size`` (issue 24), and more runs being
driven than the pool has connections wait for one: none fails for it.

Opened through the server's own door (:func:`server.settings.storage.open_run_store`), a pool of 2
connections serves 8 runs driven at once whose tasks overlap (each call holds for a moment, so
the drives want connections together); every run completes, every task called once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from orchestration.chains.catalog import Catalog
from orchestration.chains.prompts import TaskPrompt
from orchestration.core import StartRequest
from orchestration.core.clock import SystemClock
from orchestration.core.models import ChainStep, ExecutionContract, Telemetry, TypedError
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.runtime import Runtime
from orchestration.workers.port import DeltaSink
from server.settings.config import Settings
from server.settings.storage import open_run_store
from stores import migrate
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url
from tests.unit.helpers import provider_contract, sequential_ids

RUNS = 8
POOL = 2


@dataclass
class OverlappingWorker:
    """Each call holds briefly; counts the calls made at once and per task."""

    in_flight: int = 0
    peak: int = 0
    calls: dict[str, int] = field(default_factory=dict)

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        marker = re.search(r"\[run:(\w+)\]", prompt.user)
        key = f"{marker.group(1) if marker else None}/{step.name}"
        self.calls[key] = self.calls.get(key, 0) + 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await anyio.sleep(0.2)
        finally:
            self.in_flight -= 1
        return AttemptSucceeded(f"{step.name} output", Telemetry(output_tokens=1))


async def test_more_drives_than_connections_wait_for_one_and_all_complete(tmp_path: Path) -> None:
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        url = schema_url(dsn, schema)
        await migrate(url, home=tmp_path)
        settings = Settings(home=tmp_path, store=url, store_fallback=False, store_pool_size=POOL)
        opened = await open_run_store(settings)
        worker = OverlappingWorker()
        runtime = Runtime(
            opened.store,
            Catalog.builtin(),
            clock=SystemClock(),
            new_id=sequential_ids(),
            resolve_contract=provider_contract,
            worker=worker,
        )
        try:
            run_ids = [
                (await runtime.start(StartRequest(f"run [run:r{i}]", worker_backend="provider")))[0].run_id
                for i in range(RUNS)
            ]
            async with anyio.create_task_group() as tg:
                for run_id in run_ids:
                    tg.start_soon(runtime.drive, run_id)
            statuses = [(await runtime.status(run_id)).status for run_id in run_ids]
        finally:
            await opened.store.close()
    assert statuses == [RunStatus.COMPLETED] * RUNS
    assert worker.peak > POOL  # the drives did want connections together
    assert len(worker.calls) == 3 * RUNS
    assert set(worker.calls.values()) == {1}

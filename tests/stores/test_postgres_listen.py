"""The postgres adapter's notification connection under faults: ``listen`` is idempotent per
callback, a dropped connection is reported through ``on_lost``, and listening again reconnects so
that wake-ups resume (the dispatcher relies on all three after a PostgreSQL restart). A create
unannounced is heard by nobody; a runtime creates so while its dispatcher has a free slot."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core.inputs import StartRequest
from orchestration.core.models import ExecutionContract, Telemetry
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.dispatcher import Dispatcher
from orchestration.engine.runtime import Runtime
from stores import migrate, parse_store_spec
from stores.postgres import PostgresStore
from tests.stores.builders import new_run, run_id
from tests.stores.sql_adapters import postgres_dsn, postgres_schema, schema_url

pytestmark = pytest.mark.postgres


class Heard:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lost = 0
        self.event = anyio.Event()

    def __call__(self, run_id: str) -> None:
        self.ids.append(run_id)
        self.event.set()

    def on_lost(self) -> None:
        self.lost += 1
        self.event.set()

    async def wait(self) -> None:
        with anyio.fail_after(5):
            await self.event.wait()
        self.event = anyio.Event()


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[PostgresStore, PostgresStore, str]]:
    dsn = await postgres_dsn()
    async with postgres_schema(dsn) as schema:
        await migrate(schema_url(dsn, schema), home=tmp_path)
        plain = parse_store_spec(dsn, home=tmp_path).dsn or dsn
        listener = await PostgresStore.open(plain, schema=schema)
        writer = await PostgresStore.open(plain, schema=schema)
        try:
            yield listener, writer, plain
        finally:
            await listener.close()
            await writer.close()


async def _terminate_listener(dsn: str, store: PostgresStore) -> None:
    """Kill the backend of the store's LISTEN session (only this test's channel), as a server
    restart would."""
    conn = await asyncpg.connect(dsn)
    try:
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE query = 'LISTEN \"' || $1 || '\"' AND pid <> pg_backend_pid()",
            store.channel,
        )
        assert killed >= 1
    finally:
        await conn.close()


async def test_listen_twice_with_one_callback_calls_it_once(
    stores: tuple[PostgresStore, PostgresStore, str],
) -> None:
    listener, writer, _ = stores
    heard = Heard()
    await listener.listen(heard, heard.on_lost)
    await listener.listen(heard, heard.on_lost)
    await writer.create(*new_run(run_id(1)))
    await heard.wait()
    await anyio.sleep(0.2)
    assert heard.ids == [run_id(1)]


async def test_a_dropped_connection_is_reported_and_listening_again_reconnects(
    stores: tuple[PostgresStore, PostgresStore, str],
) -> None:
    listener, writer, dsn = stores
    heard = Heard()
    await listener.listen(heard, heard.on_lost)
    assert listener.listening

    await _terminate_listener(dsn, listener)
    await heard.wait()
    assert heard.lost == 1 and not listener.listening
    # Nothing is heard while the connection is down (a hint, not a queue).
    await writer.create(*new_run(run_id(1)))
    await anyio.sleep(0.3)
    assert heard.ids == []

    await listener.listen(heard, heard.on_lost)
    assert listener.listening
    await writer.create(*new_run(run_id(2)))
    await heard.wait()
    assert heard.ids == [run_id(2)]


async def test_closing_the_store_is_not_reported_as_a_lost_connection(
    stores: tuple[PostgresStore, PostgresStore, str],
) -> None:
    listener, _, _ = stores
    heard = Heard()
    await listener.listen(heard, heard.on_lost)
    await listener.unlisten(heard)
    await listener.listen(heard, heard.on_lost)
    await listener.close()
    await anyio.sleep(0.1)
    assert heard.lost == 0


async def test_an_unannounced_create_is_heard_by_no_listener(
    stores: tuple[PostgresStore, PostgresStore, str],
) -> None:
    listener, writer, _ = stores
    heard = Heard()
    await listener.listen(heard, heard.on_lost)
    assert (await writer.create_unannounced(*new_run(run_id(1)))).created
    await writer.create(*new_run(run_id(2)))
    await heard.wait()
    await anyio.sleep(0.2)
    assert heard.ids == [run_id(2)]
    assert await writer.load(run_id(1)) is not None


class HeldWorker:
    """A provider worker whose calls wait until :attr:`release` is set; counts the calls."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.calls = 0

    async def execute(self, *_: object) -> AttemptOutcome:
        self.calls += 1
        await self.release.wait()
        return AttemptSucceeded("done", Telemetry())


async def test_a_runtime_creates_unannounced_only_while_its_dispatcher_has_a_free_slot(
    stores: tuple[PostgresStore, PostgresStore, str],
) -> None:
    listener, writer, _ = stores
    heard = Heard()
    await listener.listen(heard, heard.on_lost)
    worker = HeldWorker()
    runtime = Runtime(
        writer,
        Catalog.builtin(),
        resolve_contract=lambda _r, _c: ExecutionContract(worker_backend="provider", provider="p", model="m"),
        worker=worker,
        owner="here",
    )
    dispatcher = Dispatcher(runtime, concurrency=1, poll_seconds=30)
    request = StartRequest(request="build", chain=("architect",), worker_backend="provider")
    async with anyio.create_task_group() as tg:
        await tg.start(dispatcher.run)
        first, _ = await runtime.start(request)
        with anyio.fail_after(5):
            while worker.calls < 1:  # noqa: ASYNC110 (the dispatcher claimed it at once)
                await anyio.sleep(0.01)
        # The only slot is taken: the next run is announced, for the other servers to claim.
        second, _ = await runtime.start(request)
        await heard.wait()
        assert heard.ids == [second.run_id] and first.run_id not in heard.ids
        worker.release.set()
        with anyio.fail_after(10):
            while (await runtime.status(second.run_id)).status != RunStatus.COMPLETED:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        dispatcher.stop()
    assert (await runtime.status(first.run_id)).status == RunStatus.COMPLETED

"""RunSubscriptions: which runs have subscribers, and which changes written elsewhere to announce."""

from __future__ import annotations

import anyio

from orchestration.core import StartRequest
from orchestration.core.models import RunHead
from orchestration.engine.runtime import Runtime
from server.mcp.subscriptions import RunSubscriptions, run_id_of
from stores.memory import MemoryStore
from tests.unit.helpers import make_runtime


def uri(run_id: str) -> str:
    return f"run://{run_id}"


async def two_runtimes() -> tuple[Runtime, Runtime, str]:
    """``here`` (this process) and ``elsewhere`` (another process) on one store, and a run."""
    store = MemoryStore()
    here, elsewhere = make_runtime(store), make_runtime(store)
    head, _ = await here.start(StartRequest("Make a game"))
    await here.drive(head.run_id)  # awaiting the host's architect
    return here, elsewhere, head.run_id


async def answer(runtime: Runtime, run_id: str) -> None:
    snapshot = await runtime.snapshot(run_id)
    assert snapshot.host_task is not None
    await runtime.submit_host_output(run_id, snapshot.host_task.task_id, "an answer")


def test_run_id_of_accepts_only_run_uris_with_valid_ids() -> None:
    assert run_id_of("run://run-abc") == "run-abc"
    assert run_id_of("run://../../etc") is None
    assert run_id_of("file:///etc/passwd") is None


async def test_a_change_written_elsewhere_is_announced_once() -> None:
    here, elsewhere, run_id = await two_runtimes()
    subs = RunSubscriptions(lambda: [])
    subs.attach(here.status)
    await subs.add([uri(run_id), "run://../bad", "other://x"], listening=True)
    assert subs.watched() == {run_id}
    assert await subs.changed() == [], "what was there at subscription time is not news"

    await answer(elsewhere, run_id)
    changed = await subs.changed()
    assert [h.run_id for h in changed] == [run_id]
    assert changed[0].version == (await here.status(run_id)).version
    assert await subs.changed() == [], "announced once"


async def test_a_change_this_process_announced_is_not_announced_again() -> None:
    here, _, run_id = await two_runtimes()
    subs = RunSubscriptions(lambda: [])
    subs.attach(here.status)
    await subs.add([uri(run_id)], listening=True)
    await answer(here, run_id)
    subs.announced(await here.status(run_id))
    assert await subs.changed() == []


async def test_streams_are_counted_and_legacy_sessions_are_watched_too() -> None:
    here, elsewhere, run_id = await two_runtimes()
    legacy: list[str] = []
    subs = RunSubscriptions(lambda: legacy)
    subs.attach(here.status)
    await subs.add([uri(run_id)], listening=True)
    await subs.add([uri(run_id)], listening=True)
    subs.remove([uri(run_id)])
    assert subs.watched() == {run_id}, "one stream is still open"
    subs.remove([uri(run_id)])
    assert subs.watched() == set()
    assert await subs.changed() == []

    legacy.append(uri(run_id))
    await subs.add([uri(run_id)], listening=False)
    assert subs.watched() == {run_id}
    await answer(elsewhere, run_id)
    assert [h.run_id for h in await subs.changed()] == [run_id]
    legacy.clear()
    assert subs.watched() == set()


async def test_the_poll_loop_publishes_what_changed_elsewhere() -> None:
    here, elsewhere, run_id = await two_runtimes()
    subs = RunSubscriptions(lambda: [])
    subs.attach(here.status)
    await subs.add([uri(run_id)], listening=True)
    published: list[int] = []
    got = anyio.Event()

    async def publish(head: RunHead) -> None:
        published.append(head.version)
        got.set()

    async with anyio.create_task_group() as tg:
        await tg.start(subs.run, publish, 0.01)
        await answer(elsewhere, run_id)
        with anyio.fail_after(5):
            await got.wait()
        tg.cancel_scope.cancel()
    assert published == [(await here.status(run_id)).version]


async def test_a_run_that_cannot_be_read_is_skipped() -> None:
    here, _, _ = await two_runtimes()
    subs = RunSubscriptions(lambda: [])
    subs.attach(here.status)
    await subs.add([uri("run-does-not-exist")], listening=True)
    assert await subs.changed() == []


async def test_a_terminal_run_is_announced_and_then_not_read_again() -> None:
    here, elsewhere, run_id = await two_runtimes()
    reads: list[str] = []

    async def load(rid: str) -> RunHead:
        reads.append(rid)
        return await here.status(rid)

    subs = RunSubscriptions(lambda: [])
    subs.attach(load)
    await subs.add([uri(run_id)], listening=True)
    await elsewhere.cancel(run_id, reason="elsewhere")
    assert [h.status.value for h in await subs.changed()] == ["cancelled"]
    reads.clear()
    assert await subs.changed() == []
    assert reads == [], "a terminal run never changes again"

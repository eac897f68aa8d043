"""Output as it is written (issue 25): the per-process buffer of the calls in flight, its bounds,
the seam a drive opens for the provider worker, and a cancel that closes the stream at once. The
recorded output stays the whole answer, recorded once."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import SystemClock
from orchestration.core.facts import TaskCompleted
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import OutputDeltas, OutputPiece, Runtime, TaskText
from orchestration.workers.model_calls import make_http_client
from orchestration.workers.provider_worker import (
    ProviderEndpoint,
    ProviderSettings,
    ProviderWorker,
    contract_resolver,
)
from stores.memory import MemoryStore
from tests.fakes.fake_provider import FakeProvider
from tests.unit.helpers import sequential_ids

CANARY = "sk-canary-" + secrets.token_hex(16)
REVIEW = "The reviewer's verdict, written slowly: the patch is sound and the tests cover it. " * 3


# --- the buffer ------------------------------------------------------------------------------------


async def test_a_task_holds_its_latest_attempt_capped_and_says_what_a_late_reader_missed() -> None:
    deltas = OutputDeltas(max_task_chars=10)
    deltas.begin("r1", "reviewer", 1)
    for piece in ("abcd", "efgh", "ijkl"):
        deltas.write("r1", "reviewer", 1, piece)
    [held] = deltas.held("r1")
    assert (held.attempt, held.start, held.text, held.end, held.ended) == (1, 2, "cdefghijkl", 12, False)
    assert held.since(1, 0) == ("cdefghijkl", 2)  # a late reader: two characters are gone
    assert held.since(1, 8) == ("ijkl", 0)
    deltas.write("r1", "reviewer", 2, "another attempt's text is not this one's")
    deltas.end("r1", "reviewer", 1)
    deltas.write("r1", "reviewer", 1, "after the end")
    assert deltas.held("r1") == [TaskText("r1", "reviewer", 1, 2, "cdefghijkl", True)]
    # The next attempt starts again from nothing; a cursor on the old attempt reads it from 0.
    deltas.begin("r1", "reviewer", 2)
    deltas.write("r1", "reviewer", 2, "xy")
    [again] = deltas.held("r1")
    assert (again.attempt, again.since(1, 12)) == (2, ("xy", 0))
    assert deltas.held("r2") == []


def of_a(pieces: list[OutputPiece]) -> OutputPiece:
    [piece] = [p for p in pieces if p.task_id == "a"]
    return piece


async def test_a_reader_follows_calls_in_flight_by_position_and_learns_what_it_missed() -> None:
    clock = iter([100, 100, 500, 501])
    deltas = OutputDeltas(max_task_chars=6, now_us=lambda: next(clock))
    deltas.begin("r1", "a", 1)
    deltas.begin("r1", "b", 1)
    deltas.write("r1", "a", 1, "abc")  # position 100
    deltas.write("r1", "b", 1, "xy")  # 101: the clock did not move, the position still grows
    assert deltas.position == 101
    [a, b] = deltas.after("r1", 0)
    assert (a.task_id, a.offset, a.text, a.missed, a.position) == ("a", 0, "abc", 0, 100)
    assert (b.task_id, b.text, b.position) == ("b", "xy", 101)
    assert deltas.after("r1", 101) == []
    deltas.write("r1", "a", 1, "defg")  # 500: "a" holds "bcdefg" now, "a" (1 char) was dropped
    deltas.write("r1", "a", 1, "hij")  # 501: holds "efghij"
    late = of_a(deltas.after("r1", 0))  # a late reader: what is held, and how much is gone
    assert (late.offset, late.text, late.missed) == (4, "efghij", 4)
    behind = of_a(deltas.after("r1", 100))  # read "abc" before: "d" is gone
    assert (behind.offset, behind.text, behind.missed, behind.position) == (4, "efghij", 1, 501)
    newest = of_a(deltas.after("r1", 500))
    assert (newest.offset, newest.text, newest.missed) == (7, "hij", 0)
    capped = of_a(deltas.after("r1", 100, limit_chars=2))
    assert (capped.offset, capped.text, capped.missed) == (8, "ij", 5)
    deltas.end("r1", "a", 1)  # an ended call is no longer "in flight": its output is recorded
    assert [p.task_id for p in deltas.after("r1", 0)] == ["b"]


async def test_the_process_holds_a_bounded_number_of_tasks_ended_ones_go_first() -> None:
    deltas = OutputDeltas(max_tasks=2)
    deltas.begin("r1", "a", 1)
    deltas.begin("r1", "b", 1)
    deltas.end("r1", "b", 1)
    deltas.begin("r2", "c", 1)
    assert [(t.run_id, t.task_id) for t in deltas.held("r1") + deltas.held("r2")] == [
        ("r1", "a"),
        ("r2", "c"),
    ]
    deltas.begin("r3", "d", 1)  # none ended: the oldest goes
    assert deltas.held("r1") == [] and [t.task_id for t in deltas.held("r3")] == ["d"]


async def test_the_task_whose_call_ended_first_goes_first_and_each_run_keeps_its_own() -> None:
    deltas = OutputDeltas(max_tasks=3)
    for run_id, task_id in (("r1", "a"), ("r2", "b"), ("r1", "c")):
        deltas.begin(run_id, task_id, 1)
    deltas.end("r1", "c", 1)
    deltas.end("r2", "b", 1)
    deltas.begin("r3", "d", 1)  # c ended before b: c goes, though b began earlier
    assert [t.task_id for t in deltas.held("r1")] == ["a"] and [t.task_id for t in deltas.held("r2")] == ["b"]
    deltas.begin("r1", "a", 2)  # a new attempt: a is the newest call now, and not ended
    deltas.begin("r4", "e", 1)  # b goes (ended), then none ended: the oldest, d
    deltas.begin("r5", "f", 1)
    assert deltas.held("r2") == [] and deltas.held("r3") == []
    assert [(t.run_id, t.task_id, t.attempt) for t in deltas.held("r1")] == [("r1", "a", 2)]
    deltas.write("r1", "a", 2, "x")
    assert [p.text for p in deltas.after("r1", 0)] == ["x"]


async def test_a_change_sets_the_runs_event() -> None:
    deltas = OutputDeltas()
    event = deltas.changed("r1")
    assert not event.is_set()
    deltas.begin("r1", "a", 1)
    assert event.is_set() and not deltas.changed("r1").is_set()


async def test_waiters_on_runs_never_written_here_do_not_pile_up() -> None:
    deltas = OutputDeltas(max_tasks=1)
    events = [deltas.changed(f"inline-{i}") for i in range(4)]
    assert not any(e.is_set() for e in events)
    deltas.changed("one-more")  # past 4 x max_tasks: everyone is woken to look again
    assert all(e.is_set() for e in events)


async def test_a_runs_sink_writes_into_what_is_held_for_that_run() -> None:
    deltas = OutputDeltas()
    sink = deltas.sink("r1")
    write = sink.writer("architect", 1)
    write("design")
    assert deltas.held("r1") == [TaskText("r1", "architect", 1, 0, "design", False)]
    sink.ended("architect", 1)
    assert deltas.held("r1") == [TaskText("r1", "architect", 1, 0, "design", True)]
    assert deltas.held("r2") == []


# --- through a provider run ------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider({}) as provider:
        yield provider


@pytest.fixture
async def runtime(fake: FakeProvider) -> AsyncIterator[Runtime]:
    settings = ProviderSettings(
        endpoints={"anthropic": ProviderEndpoint("anthropic", fake.base_url, CANARY, "ANTHROPIC_API_KEY")},
        default_model="claude-test-1",
        max_attempts=3,
    )
    async with make_http_client(trust_env=False) as http:
        yield Runtime(
            MemoryStore(),
            Catalog.builtin(),
            clock=SystemClock(),
            new_id=sequential_ids(),
            resolve_contract=contract_resolver("provider", settings),
            worker=ProviderWorker(settings, http),
        )


async def wait_for_text(runtime: Runtime, run_id: str, task_id: str, chars: int) -> TaskText:
    with anyio.fail_after(10):
        while True:
            changed = runtime.deltas.changed(run_id)
            held = next((t for t in runtime.deltas.held(run_id) if t.task_id == task_id), None)
            if held is not None and held.end >= chars:
                return held
            await changed.wait()


async def test_a_drive_streams_each_task_into_memory_and_records_the_whole_output_once(
    fake: FakeProvider, runtime: Runtime
) -> None:
    fake.set_scenario({"default": [{"text": REVIEW, "chunk_chars": 7, "chunk_delay_seconds": 0.01}]})
    head, _ = await runtime.start(StartRequest("Review the parser"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.drive, head.run_id)
        growing = await wait_for_text(runtime, head.run_id, "architect", 14)
        assert REVIEW.startswith(growing.text) and not growing.ended
        # Nothing of it is recorded while it is written.
        assert not [f for f in await runtime.read_facts(head.run_id) if isinstance(f, TaskCompleted)]
    assert (await runtime.status(head.run_id)).status == RunStatus.COMPLETED
    held = {t.task_id: t for t in runtime.deltas.held(head.run_id)}
    assert set(held) == {"architect", "engineer", "reviewer"}
    assert all(t.text == REVIEW and t.ended for t in held.values())
    completed = [f for f in await runtime.read_facts(head.run_id) if isinstance(f, TaskCompleted)]
    assert [f.output for f in completed] == [REVIEW] * 3


async def test_a_cancel_mid_stream_closes_the_stream_and_records_no_output(
    fake: FakeProvider, runtime: Runtime
) -> None:
    fake.set_scenario({"default": [{"text": REVIEW * 10, "chunk_chars": 5, "chunk_delay_seconds": 0.05}]})
    head, _ = await runtime.start(StartRequest("Review the parser"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.drive, head.run_id)
        await wait_for_text(runtime, head.run_id, "architect", 10)
        await runtime.cancel(head.run_id, reason="not needed")
        with anyio.fail_after(5):
            while not fake.streams():  # noqa: ASYNC110 - the fake answers on another thread
                await anyio.sleep(0.01)
    [stream] = fake.streams()
    assert not stream["finished"] and stream["deltas"] < 20
    done = await runtime.status(head.run_id)
    assert done.status == RunStatus.CANCELLED
    assert not [f for f in await runtime.read_facts(head.run_id) if isinstance(f, TaskCompleted)]
    [held] = runtime.deltas.held(head.run_id)
    assert held.ended and len(held.text) < len(REVIEW * 10)

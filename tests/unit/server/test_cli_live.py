"""``runs tail`` follows a run live, in process: the events printed as the run records them."""

from __future__ import annotations

import io
import re
from typing import Any

import anyio

from orchestration.core import StartRequest
from orchestration.core.vocabulary import RunStatus
from server.cli.live import TAIL_BACKLOG, follow, render_watch, tail
from tests.unit.helpers import make_runtime, play


def seqs(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"^#(\d+) ", text, re.MULTILINE)]


async def test_tail_prints_each_event_as_it_is_recorded_and_ends_with_the_run() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("Follow me.", chain=("architect", "engineer", "reviewer")))
    await runtime.drive(head.run_id)
    assert (await runtime.status(head.run_id)).status == RunStatus.AWAITING_HOST
    out = io.StringIO()
    code: list[int] = []

    async def follow() -> None:
        code.append(await tail(runtime, head.run_id, out, from_start=True, wait_seconds=60))

    with anyio.fail_after(60):  # generous: tail returns as soon as the run's last event is printed
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await anyio.wait_all_tasks_blocked()
            assert seqs(out.getvalue()) == [1, 2]  # created, first host task prepared; tail waits
            assert not code
            done = await play(runtime, head.run_id)
    assert done.status == RunStatus.COMPLETED and code == [0]
    text = out.getvalue()
    assert seqs(text) == list(range(1, done.last_seq + 1))  # every event once, in order
    assert text.splitlines()[-1] == f"run {head.run_id} ended: completed"
    assert "task_completed" in text and f"run://{head.run_id}/tasks/engineer/output" in text

    # Without --from-start: the newest events only, then (the run has ended) it exits.
    recent = io.StringIO()
    assert await tail(runtime, head.run_id, recent) == 0
    assert seqs(recent.getvalue()) == list(range(done.last_seq - TAIL_BACKLOG + 1, done.last_seq + 1))


async def test_watch_says_what_each_live_run_waits_for() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("Queued.", chain=("writer",), worker_backend="provider"))
    text = render_watch([head], runtime.clock.now())
    assert f"{head.run_id}  custom" in text and "queued" in text
    assert "tasks 0/1  waits for a worker to pick it up" in text
    # An inline run's first host task is prepared as it starts.
    head, _ = await runtime.start(StartRequest("Inline.", chain=("writer",)))
    text = render_watch([await runtime.status(head.run_id)], runtime.clock.now(), more=True)
    assert text.startswith("1+ live runs at ")
    assert "waits for host output for task writer" in text and "--limit N" in text


async def test_tail_prints_output_deltas_as_the_text_continuing_its_line() -> None:
    """A feed with output_delta events (what ``tail --url`` reads from a server running the call):
    the text continues its task's line, a note says what a late reader missed, and a recorded
    event starts a line of its own."""
    at = "2026-12-01T10:00:00Z"

    def delta(task: str, offset: int, text: str, missed: int = 0) -> dict[str, Any]:
        return {
            "seq": 2,
            "at": at,
            "type": "output_delta",
            "task_id": task,
            "summary": "s",
            "attempt": 1,
            "offset": offset,
            "missed": missed,
            "text": text,
        }

    recorded = {"seq": 3, "at": at, "type": "run_finished", "summary": "completed"}
    pages = [
        {
            "events": [delta("writer", 40, "Hello, ", missed=40)],
            "next_after_seq": 2,
            "next_output_after": 7,
            "terminal": False,
            "more": False,
            "status": "running",
        },
        {
            "events": [delta("writer", 47, "wor"), delta("writer", 50, "ld.\nBye.")],
            "next_after_seq": 2,
            "next_output_after": 9,
            "terminal": False,
            "more": False,
            "status": "running",
        },
        {
            "events": [recorded],
            "next_after_seq": 3,
            "next_output_after": 9,
            "terminal": True,
            "more": False,
            "status": "completed",
        },
    ]
    asked: list[tuple[int, int]] = []

    async def read(after_seq: int, output_after: int, wait: float) -> dict[str, Any]:
        asked.append((after_seq, output_after))
        return pages[len(asked) - 1]

    out = io.StringIO()
    assert await follow(read, "run-x", out, after=1, as_json=False, wait_seconds=1) == 0
    assert asked == [(1, 0), (2, 7), (2, 9)]  # each page read on from the previous one's cursors
    assert out.getvalue().splitlines() == [
        "  writer> [... 40 characters not held]",
        "  writer> Hello, world.",
        "          Bye.",
        "#3    10:00:00  run_finished           completed",
        "run run-x ended: completed",
    ]

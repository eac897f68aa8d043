"""``runs tail`` follows a run live, in process: the events printed as the run records them."""

from __future__ import annotations

import io
import re

import anyio

from orchestration.core.vocabulary import RunStatus
from orchestration.engine.runtime import StartRequest
from server.cli.live import TAIL_BACKLOG, render_watch, tail
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
    head, _ = await runtime.start(StartRequest("Queued.", chain=("writer",)))
    text = render_watch([head], runtime.clock.now())
    assert f"{head.run_id}  custom" in text and "queued" in text
    assert "tasks 0/1  waits for a worker to pick it up" in text
    await runtime.drive(head.run_id)
    text = render_watch([await runtime.status(head.run_id)], runtime.clock.now(), more=True)
    assert text.startswith("1+ live runs at ")
    assert "waits for host output for task writer" in text and "--limit N" in text

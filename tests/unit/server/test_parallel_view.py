"""The run view, the CLI and the timeline of a parallel run: the graph (steps with what they run
after), everything that waits at once (each host task and each gate with its exact call), what
each pending task waits for, and the status that summarizes the branches."""

from __future__ import annotations

import io

from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.vocabulary import RunStatus
from server.cli.printing import print_view as print_view
from server.views.next_step import Approve
from server.views.run_view import run_view
from server.views.timeline import render_timeline
from stores.memory import MemoryStore
from tests.unit.helpers import ScriptedWorker, make_runtime
from tests.unit.parallel import PARALLEL_CATALOG, RESEARCHERS


async def test_a_paused_parallel_run_names_every_host_task_and_gate_that_waits() -> None:
    runtime = make_runtime(MemoryStore(), ScriptedWorker(), ManualClock(), PARALLEL_CATALOG)
    # a: approve_after; b: approve_before; c: plain; writer (after a, b, c): approve_before
    head, _ = await runtime.start(StartRequest("Study it", chain="fan-gated"))
    await runtime.drive(head.run_id)
    view = run_view(await runtime.snapshot(head.run_id))
    # Host tasks a and c wait, and so does the gate before b: the run is paused on the host.
    assert view.status == RunStatus.AWAITING_HOST and view.status_kind == "paused"
    waiting = [view.next_action, *view.more_actions]
    assert [(w.kind, getattr(w, "task_id", None), getattr(w, "gate_id", None)) for w in waiting] == [
        ("run_host_task", "a", None),
        ("run_host_task", "c", None),
        ("approve", "b", "before:b"),
    ]
    assert isinstance(waiting[2], Approve)
    assert (waiting[2].tool, waiting[2].arguments) == (
        "orchestrate_approve",
        {"run_id": "run-test-0001", "gate_id": "before:b", "decision": "approve"},
    )
    assert list(waiting[2].choices) == ["approve", "reject"]
    tasks = {t.task_id: t for t in view.tasks}
    assert tasks["b"].waits_for == "approval of gate before:b"
    assert tasks["writer"].waits_for == "tasks a, b, c"
    assert [s.after for s in view.chain.steps] == [[], [], [], ["a", "b", "c"]]
    assert view.chain.max_parallel == 4

    # The host answers a and c: only gates wait now (a's after-gate is requested next).
    for task_id in ("a", "c"):
        await runtime.submit_host_output(head.run_id, task_id, f"found {task_id}")
    await runtime.drive(head.run_id)
    view = run_view(await runtime.snapshot(head.run_id))
    assert view.status == RunStatus.AWAITING_APPROVAL
    assert [view.next_action.gate_id, *(m.gate_id for m in view.more_actions)] == ["after:a", "before:b"]  # type: ignore[union-attr]
    assert view.tasks[-1].waits_for == "tasks a, b"

    printed = io.StringIO()
    print_view(view, printed)
    text = printed.getvalue()
    assert "chain fan-gated: a*, b*, c, writer* (after a, b, c)" in text
    assert "writer* (after a, b, c)" in text
    assert "next: decide gate after:a" in text
    assert "also waiting now (1 more, parallel steps; any order):" in text
    assert "construct-mcp runs approve run-test-0001 --gate-id before:b" in text


async def test_the_timeline_shows_the_graph() -> None:
    runtime = make_runtime(MemoryStore(), ScriptedWorker(), ManualClock(), PARALLEL_CATALOG)
    head, _ = await runtime.start(StartRequest("Study it", chain="research", worker_backend="provider"))
    await runtime.drive(head.run_id)
    final = await runtime.status(head.run_id)
    assert final.status == RunStatus.COMPLETED
    timeline = render_timeline(final, await runtime.store.read_facts(head.run_id))
    assert "writer (after research-sources, research-practice, research-critique)" in timeline
    # The writer starts after every researcher's output is recorded.
    lines = timeline.splitlines()
    done = [i for i, line in enumerate(lines) if "task_completed" in line and "research-" in line]
    writer = next(i for i, line in enumerate(lines) if "attempt_started" in line and "writer" in line)
    assert len(done) == len(RESEARCHERS) and max(done) < writer

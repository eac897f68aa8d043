"""Child runs on every store: a step that runs a chain makes a run of its own, linked both ways;
the parent waits without being runnable; the child's end is recorded on the parent once; a
parent that ends takes its live children with it."""

from __future__ import annotations

from orchestration.core import StartRequest
from orchestration.core.facts import ChildEnded, ChildStarted, TaskCompleted
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.store import RunStore
from tests.unit.child_chains import child_runtime, drive_tree
from tests.unit.helpers import ScriptedWorker


async def test_a_step_runs_a_chain_as_a_linked_child_run(store: RunStore) -> None:
    runtime = child_runtime(store)
    parent, _ = await runtime.start(StartRequest("Build a CLI", chain="outer", worker_backend="provider"))
    await runtime.drive(parent.run_id)

    waiting = await runtime.status(parent.run_id)
    assert waiting.status == RunStatus.AWAITING_CHILDREN
    build = waiting.task("build")
    assert build.status == TaskStatus.RUNNING and build.children is not None
    child_id = build.children[0].run_id
    # The waiting parent is not runnable: no dispatcher claims it while its child works.
    assert parent.run_id not in await store.runnable(runtime.clock.now())
    child = await runtime.status(child_id)
    assert child.parent is not None
    assert (child.parent.run_id, child.parent.task_id, child.parent.depth) == (parent.run_id, "build", 1)
    assert child.idempotency_key == f"child:{parent.run_id}:build"
    assert "architect output" in child.request  # the work the step would have seen

    final = await drive_tree(runtime, parent.run_id)
    assert final.status == RunStatus.COMPLETED
    facts = await store.read_facts(parent.run_id)
    ended = [f for f in facts if isinstance(f, ChildEnded)]
    assert [(f.child_run_id, f.status) for f in ended] == [(child_id, "completed")]
    build_output = next(f for f in facts if isinstance(f, TaskCompleted) and f.task_id == "build")
    # output_of = "engineer": the child's engineer's output, not its last task's.
    assert build_output.output == "engineer output (attempt 1)"
    assert build_output.executor == f"child:{child_id}"
    assert [c.status for c in final.task("build").children or ()] == ["completed"]
    assert len([f for f in facts if isinstance(f, ChildStarted)]) == 1


async def test_a_failed_child_fails_the_step_with_a_typed_error(store: RunStore) -> None:
    from tests.unit.engine.test_crash_prefixes import AUTH

    runtime = child_runtime(store, ScriptedWorker({"reviewer": [AUTH]}))
    parent, _ = await runtime.start(StartRequest("Build", chain="outer", worker_backend="provider"))
    final = await drive_tree(runtime, parent.run_id)
    assert final.status == RunStatus.FAILED
    assert final.error is not None and final.error.code == "child_failed"
    assert "auth" in final.error.message

    request = StartRequest("Build", chain="outer-tolerant", worker_backend="provider")
    tolerant, _ = await runtime.start(request)
    final = await drive_tree(runtime, tolerant.run_id)
    assert final.status == RunStatus.COMPLETED_WITH_FAILURES
    assert final.task("writer").status == TaskStatus.DONE


async def test_cancelling_the_parent_cancels_its_live_children(store: RunStore) -> None:
    runtime = child_runtime(store)
    parent, _ = await runtime.start(StartRequest("Build", chain="outer-gated", worker_backend="provider"))
    await runtime.drive(parent.run_id)
    child_id = (await runtime.status(parent.run_id)).task("build").children[0].run_id  # type: ignore[index]
    await runtime.drive(child_id)
    assert (await runtime.status(child_id)).status == RunStatus.AWAITING_APPROVAL

    await runtime.cancel(parent.run_id, reason="changed my mind")
    child = await runtime.status(child_id)
    assert child.status == RunStatus.CANCELLED
    facts = await store.read_facts(child_id)
    assert facts[-1].type == "run_cancelled"

"""The runtime's use cases on the memory store: start, host output, approve, cancel, resume, and
what each one does with repeats and races."""

from __future__ import annotations

import anyio
import pytest

from orchestration.core import Limits, StartRequest
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.runtime import Runtime
from orchestration.errors import Conflict, Hint, InvalidArgument, InvalidState, RunNotFound, TooLarge
from tests.unit.helpers import ScriptedWorker, make_runtime, play


async def started(runtime: Runtime, **kwargs: object) -> str:
    head, created = await runtime.start(StartRequest("Build a URL shortener", **kwargs))  # type: ignore[arg-type]
    assert created
    await runtime.drive(head.run_id)
    return head.run_id


async def test_inline_run_pauses_for_the_host_with_materialized_prompts() -> None:
    runtime = make_runtime()
    run_id = await started(runtime)
    snap = await runtime.snapshot(run_id)
    assert snap.head.status == RunStatus.AWAITING_HOST
    assert snap.host_task is not None and snap.host_task.task_id == "architect"
    assert snap.host_task.system == runtime.catalog.specialists["architect"].persona
    assert "Build a URL shortener" in snap.host_task.user
    assert snap.head.task("architect").prompt_sha256 == snap.host_task.sha256


async def test_full_run_completes_and_records_executor() -> None:
    runtime = make_runtime()
    run_id = await started(runtime, approve_before=("engineer",))
    head = await play(runtime, run_id)
    assert head.status == RunStatus.COMPLETED
    assert all(t.status == TaskStatus.DONE and t.output_seq is not None for t in head.tasks)
    history = (await runtime.snapshot(run_id)).head
    assert all(t.executor == "inline:host" and len(t.attempts) == 1 for t in history.tasks)
    outputs = await runtime.outputs(head)
    assert outputs == {t: f"host output for {t}" for t in ("architect", "engineer", "reviewer")}
    gate = head.gate("before:engineer")
    assert gate is not None and gate.status == "approved" and gate.comment == "ok before:engineer"


async def test_idempotency_key() -> None:
    runtime = make_runtime()
    first, created = await runtime.start(StartRequest("x", idempotency_key="k1"))
    again, created_again = await runtime.start(StartRequest("x", idempotency_key="k1"))
    assert created and not created_again and again.run_id == first.run_id
    with pytest.raises(Conflict, match="different request"):
        await runtime.start(StartRequest("y", idempotency_key="k1"))
    page = await runtime.list_runs()
    assert len(page.runs) == 1


async def test_start_validation() -> None:
    runtime = make_runtime()
    runtime.limits = Limits(max_request_chars=10)
    with pytest.raises(TooLarge, match="limit is 10"):
        await runtime.start(StartRequest("x" * 11))
    with pytest.raises(InvalidArgument, match="empty"):
        await runtime.start(StartRequest("   "))


async def test_host_output_repeat_conflict_and_wrong_task() -> None:
    runtime = make_runtime()
    run_id = await started(runtime)
    with pytest.raises(Conflict, match="the task awaiting output is 'architect'"):
        await runtime.submit_host_output(run_id, "engineer", "too early")
    with pytest.raises(InvalidArgument, match="no task 'nobody'"):
        await runtime.submit_host_output(run_id, "nobody", "x")
    head = await runtime.submit_host_output(run_id, "architect", "design")
    version = head.version
    again = await runtime.submit_host_output(run_id, "architect", "design")
    assert again.version == version, "a repeat appends nothing"
    with pytest.raises(Conflict, match="already done with a different output"):
        await runtime.submit_host_output(run_id, "architect", "another design")
    runtime.limits = Limits(max_output_chars=5)
    await runtime.drive(run_id)
    with pytest.raises(TooLarge):
        await runtime.submit_host_output(run_id, "engineer", "x" * 6)


async def test_approve_repeat_conflict_and_wrong_state() -> None:
    runtime = make_runtime()
    run_id = await started(runtime, approve_before=("engineer",))
    gate = "before:engineer"
    with pytest.raises(InvalidState, match="not awaiting approval"):
        await runtime.approve(run_id, "approve", gate)
    await runtime.submit_host_output(run_id, "architect", "design")
    await runtime.drive(run_id)
    head = await runtime.status(run_id)
    assert head.status == RunStatus.AWAITING_APPROVAL
    approved = await runtime.approve(run_id, "approve", gate, comment="fine", approver="ann")
    again = await runtime.approve(run_id, "approve", gate, comment="fine", approver="ann")
    assert again.version == approved.version
    with pytest.raises(Conflict, match="already approved"):
        await runtime.approve(run_id, "reject", gate)
    with pytest.raises(InvalidArgument, match="no gate 'after:x'"):
        await runtime.approve(run_id, "approve", "after:x")


async def test_reject_ends_the_run() -> None:
    runtime = make_runtime()
    run_id = await started(runtime, approve_before=("architect",))
    head = await runtime.approve(run_id, "reject", "before:architect", comment="no")
    assert head.status == RunStatus.REJECTED
    assert all(t.status == TaskStatus.SKIPPED for t in head.tasks)
    with pytest.raises(InvalidState):
        await runtime.submit_host_output(run_id, "architect", "x")


async def test_cancel() -> None:
    runtime = make_runtime()
    run_id = await started(runtime)
    head = await runtime.cancel(run_id, "changed my mind")
    assert head.status == RunStatus.CANCELLED
    assert (await runtime.cancel(run_id)).version == head.version
    with pytest.raises(InvalidState, match="nothing to resume"):
        await runtime.check_resumable(run_id)
    done = make_runtime()
    other = await started(done, chain=("writer",))
    await play(done, other)
    with pytest.raises(InvalidState, match="already completed"):
        await done.cancel(other)


async def test_resume_without_output_says_what_the_run_needs() -> None:
    runtime = make_runtime()
    run_id = await started(runtime, approve_before=("architect",))
    # The engine names the next step as a hint (each channel says it in its words), never a tool.
    gate = Hint("approve_gate", {"run_id": run_id, "gate_id": "before:architect", "decision": "approve"})
    with pytest.raises(InvalidState) as refused:
        await runtime.check_resumable(run_id)
    assert gate in refused.value.said.hints() and "orchestrate_" not in refused.value.message
    # The approval's write prepares the architect's host task too.
    head = await runtime.approve(run_id, "approve", "before:architect")
    assert head.status == RunStatus.AWAITING_HOST
    task = Hint("resume_run", {"run_id": run_id, "task_id": "architect"}, needs=("output",))
    with pytest.raises(InvalidArgument) as refused_output:
        await runtime.check_resumable(run_id)
    assert task in refused_output.value.said.hints() and "orchestrate_" not in refused_output.value.message


async def test_bad_run_ids_never_reach_the_store() -> None:
    runtime = make_runtime()
    for bad in ["../../etc", "", "A B", "x" * 200]:
        with pytest.raises(InvalidArgument):
            await runtime.status(bad)
    with pytest.raises(RunNotFound):
        await runtime.status("run-missing")


async def test_racing_approvers_make_one_decision() -> None:
    runtime = make_runtime()
    run_id = await started(runtime, approve_before=("architect",))
    results: list[object] = []

    async def approve(decision: str) -> None:
        try:
            results.append(await runtime.approve(run_id, decision, "before:architect"))  # type: ignore[arg-type]
        except Conflict as exc:
            results.append(exc)

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(approve, "approve" if i % 2 else "reject")
    facts = await runtime.store.read_facts(run_id)
    assert sum(1 for f in facts if f.type == "approval_decided") == 1
    assert any(isinstance(r, Conflict) for r in results)


async def test_drive_skips_a_run_leased_by_another_worker() -> None:
    runtime = make_runtime(worker=ScriptedWorker({}))
    head, _ = await runtime.start(StartRequest("x", worker_backend="provider"))
    other = await runtime.store.claim_lease(head.run_id, "someone-else", 60, runtime.clock.now())
    assert other is not None
    assert await runtime.drive(head.run_id) is None
    assert (await runtime.status(head.run_id)).status == RunStatus.QUEUED


async def test_wait_settled_returns_when_paused() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("x"))
    seen: list[int] = []

    async def progress(h: object) -> None:
        seen.append(1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.drive, head.run_id)
        settled = await runtime.wait_settled(head.run_id, 5, progress)
    assert settled.status == RunStatus.AWAITING_HOST

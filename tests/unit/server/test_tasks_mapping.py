"""The MCP Tasks mapping (:func:`server.mcp.tasks.detailed_task`): every run status, from views of
real runs on the memory store (``running``, which a run holds only inside a drive, is the queued
run's view with a task in progress)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core.models import TypedError
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.runtime import Runtime, StartRequest
from server.mcp.tasks import (
    HOST_TASKS_META,
    POLL_WAITING_MS,
    POLL_WORKING_MS,
    RUN_ENDED_ERROR,
    detailed_task,
    tool_result,
)
from server.views.children_view import with_children
from server.views.run_view import RunView, run_view
from tests.acceptance.task_client import conforms
from tests.unit.helpers import ScriptedWorker, make_runtime, play

#: The task status each run status maps to (SEP-2663's five).
EXPECTED = {
    RunStatus.QUEUED: "working",
    RunStatus.RUNNING: "working",
    RunStatus.AWAITING_APPROVAL: "input_required",
    RunStatus.AWAITING_HOST: "input_required",
    RunStatus.COMPLETED: "completed",
    RunStatus.COMPLETED_WITH_FAILURES: "completed",
    RunStatus.FAILED: "failed",
    RunStatus.REJECTED: "failed",
    RunStatus.CANCELLED: "cancelled",
    # the views() case: the child run waits for the host (a child at work: "working", below)
    RunStatus.AWAITING_CHILDREN: "input_required",
    # the server follows an agent step's remote run: nothing is asked of the caller
    RunStatus.AWAITING_AGENT: "working",
}

#: The fields only one task status carries (SEP-2663's DetailedTask).
PAYLOAD = {"input_required": "inputRequests", "completed": "result", "failed": "error"}

REFUSED = TypedError(code="content_filtered", message="the provider refused the text")


def _catalog() -> Catalog:
    qa = {"steps": ["engineer", {"specialist": "tester", "on_failure": "continue"}, "writer"]}
    outer = {"steps": [{"name": "build", "chain": "inner"}]}
    chains = {"qa": qa, "outer": outer, "inner": {"steps": ["writer"]}}
    return Catalog.builtin().extended({"chains": chains}, "test", Path("."))


async def _parent_view(runtime: Runtime, run_id: str) -> RunView:
    """The view a server gives of a parent run: its children listed, and what one of them waits
    for as its next action (:func:`server.views.children_view.with_children`)."""
    return await with_children(await _view(runtime, run_id), await runtime.status(run_id), _load(runtime))


def _load(runtime: Runtime) -> Callable[[str], Awaitable[RunView]]:
    async def load(run_id: str) -> RunView:
        return await _parent_view(runtime, run_id)

    return load


async def _child_of(runtime: Runtime, parent: str) -> str:
    (child,) = [c.run_id for t in (await runtime.status(parent)).tasks for c in t.children or ()]
    return child


async def _view(runtime: Runtime, run_id: str) -> RunView:
    return run_view(await runtime.snapshot(run_id))


async def _start(runtime: Runtime, drive: bool = True, **kwargs: object) -> str:
    head, _ = await runtime.start(StartRequest("Write the release notes", **kwargs))  # type: ignore[arg-type]
    if drive:
        await runtime.drive(head.run_id)
    return head.run_id


async def views() -> dict[RunStatus, RunView]:
    """One view per run status."""
    worker = ScriptedWorker({"tester": [REFUSED], "reviewer": [REFUSED]})
    runtime = make_runtime(worker=worker, catalog=_catalog())
    found: dict[RunStatus, RunView] = {}
    # (An inline start prepares its first host task in its first write: a provider run waits.)
    queued = await _view(
        runtime, await _start(runtime, drive=False, chain=("writer",), worker_backend="provider")
    )
    found[RunStatus.QUEUED] = queued
    task = queued.tasks[0].model_copy(update={"status": TaskStatus.RUNNING})
    found[RunStatus.RUNNING] = queued.model_copy(update={"status": RunStatus.RUNNING, "tasks": [task]})
    awaiting_agent = {"status": RunStatus.AWAITING_AGENT, "tasks": [task]}
    found[RunStatus.AWAITING_AGENT] = queued.model_copy(update=awaiting_agent)
    gated = await _start(runtime, chain=("writer",), approve_before=("writer",))
    found[RunStatus.AWAITING_APPROVAL] = await _view(runtime, gated)
    found[RunStatus.AWAITING_HOST] = await _view(runtime, await _start(runtime, chain=("writer",)))
    done = await _start(runtime, chain=("writer",))
    await play(runtime, done)
    found[RunStatus.COMPLETED] = await _view(runtime, done)
    partial = await _start(runtime, chain="qa", worker_backend="provider")
    await play(runtime, partial)
    found[RunStatus.COMPLETED_WITH_FAILURES] = await _view(runtime, partial)
    failed = await _start(runtime, chain=("reviewer",), worker_backend="provider")
    await play(runtime, failed)
    found[RunStatus.FAILED] = await _view(runtime, failed)
    rejected = await _start(runtime, chain=("writer",), approve_before=("writer",))
    await play(runtime, rejected, decisions=lambda gate: "reject")
    found[RunStatus.REJECTED] = await _view(runtime, rejected)
    cancelled = await _start(runtime, chain=("writer",))
    await runtime.cancel(cancelled, reason="not needed")
    found[RunStatus.CANCELLED] = await _view(runtime, cancelled)
    parent = await _start(runtime, chain="outer")
    await runtime.drive(await _child_of(runtime, parent))  # the child now waits for the host
    found[RunStatus.AWAITING_CHILDREN] = await _parent_view(runtime, parent)
    for status, view in found.items():
        assert view.status == status
    return found


@pytest.mark.parametrize("status", list(RunStatus))
async def test_every_run_status_maps_to_a_task(status: RunStatus) -> None:
    view = (await views())[status]
    task = detailed_task(view)
    assert task["status"] == EXPECTED[status]
    assert task["taskId"] == view.run_id
    assert task["ttlMs"] is None
    assert task["createdAt"] == view.created_at.isoformat()
    assert task["lastUpdatedAt"] == view.updated_at.isoformat()
    waiting = task["status"] == "input_required"
    assert task["pollIntervalMs"] == (POLL_WAITING_MS if waiting else POLL_WORKING_MS)
    assert view.run_id in task["statusMessage"]
    for task_status, field in PAYLOAD.items():
        assert (field in task) == (task["status"] == task_status), (task_status, field)
    # As the extension's schema has it (the SDK adds resultType "complete" to a tasks/get answer).
    conforms("GetTaskResult", {**task, "resultType": "complete"})
    # The seed state a tools/call answers with: resultType task, the same status, no payload.
    seed = conforms("CreateTaskResult", detailed_task(view, created=True))
    assert seed["resultType"] == "task" and seed["status"] == task["status"]
    assert not set(PAYLOAD.values()) & set(seed)


async def test_a_parent_whose_child_is_at_work_is_working() -> None:
    runtime = make_runtime(catalog=_catalog())
    parent = await _start(runtime, chain="outer")
    child = await _child_of(runtime, parent)  # created, not driven yet: at work, asking nothing
    task = detailed_task(await _parent_view(runtime, parent))
    assert task["status"] == "working" and task["pollIntervalMs"] == POLL_WORKING_MS
    assert child in task["statusMessage"] and "inputRequests" not in task


async def test_a_parent_whose_child_waits_names_the_call_on_the_child() -> None:
    view = (await views())[RunStatus.AWAITING_CHILDREN]
    (child,) = view.children
    task = detailed_task(view)
    message = task["statusMessage"]
    call = json.dumps({"run_id": child.run_id, "task_id": "writer"})
    assert f"call orchestrate_resume with {call} plus output" in message
    # The child's task is answered on the child, with a tool call: nothing in inputRequests.
    assert task["inputRequests"] == {}


async def test_a_host_task_names_the_call_that_continues_it() -> None:
    view = (await views())[RunStatus.AWAITING_HOST]
    task = detailed_task(view)
    message = task["statusMessage"]
    call = json.dumps({"run_id": view.run_id, "task_id": "writer"})
    assert f"call orchestrate_resume with {call} plus output" in message
    (host,) = task["_meta"][HOST_TASKS_META]
    assert host["task_id"] == "writer" and host["system_prompt"] and host["user_prompt"]
    # The host answers with a tool call, not with tasks/update: nothing to answer in inputRequests.
    assert task["inputRequests"] == {}


async def test_a_gate_carries_the_forms_it_is_given() -> None:
    view = (await views())[RunStatus.AWAITING_APPROVAL]
    form = {"method": "elicitation/create", "params": {"mode": "form", "message": "decide"}}
    task = detailed_task(view, {"gate:before:writer": form})
    assert task["inputRequests"] == {"gate:before:writer": form}
    call = json.dumps({"run_id": view.run_id, "gate_id": "before:writer", "decision": "approve"})
    assert (
        "tasks/update" in task["statusMessage"]
        and f"call orchestrate_approve with {call}" in task["statusMessage"]
    )
    # A caller who may not decide it is given no form, and told who may.
    unasked = detailed_task(view)["statusMessage"]
    assert (
        "tasks/update" not in unasked
        and f"someone who may decide it calls orchestrate_approve with {call}" in unasked
    )
    assert HOST_TASKS_META not in task.get("_meta", {})


async def test_completed_carries_the_final_view_and_lists_failures() -> None:
    found = await views()
    done = detailed_task(found[RunStatus.COMPLETED])
    assert done["result"] == tool_result(found[RunStatus.COMPLETED])
    assert done["result"]["structuredContent"]["status"] == "completed"
    assert done["result"].get("isError") in (None, False)
    assert done["statusMessage"].endswith("completed")
    partial = detailed_task(found[RunStatus.COMPLETED_WITH_FAILURES])
    assert partial["result"]["structuredContent"]["status"] == "completed_with_failures"
    assert "completed with failures: tester (content_filtered)" in partial["statusMessage"]


async def test_failed_and_rejected_carry_the_typed_reason() -> None:
    found = await views()
    failed = detailed_task(found[RunStatus.FAILED])
    error = found[RunStatus.FAILED].error
    assert error is not None
    assert failed["error"]["code"] == RUN_ENDED_ERROR
    assert failed["error"]["data"] == {
        "reason": error.code,
        "run_id": found[RunStatus.FAILED].run_id,
        "status": "failed",
    }
    assert failed["error"]["message"].startswith(f"{error.code}: ")
    rejected = detailed_task(found[RunStatus.REJECTED])
    assert rejected["error"]["data"]["reason"] == "rejected"
    assert "rejected: rejected: gate before:writer was rejected" in rejected["statusMessage"]
    assert "ok before:writer" in rejected["statusMessage"]  # the decision's comment

"""The MCP Tasks mapping (:func:`server.mcp.tasks.detailed_task`): every run status, from views of
real runs on the memory store (``running``, which a run holds only inside a drive, is the queued
run's view with a task in progress). A run that waits for what a task-aware client cannot give
through ``tasks/update`` (a host task, a gate it has no form for) is handed over: ``completed``
with the run's view."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.models import TypedError
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.runtime import Runtime
from server.mcp.tasks import (
    POLL_WAITING_MS,
    POLL_WORKING_MS,
    RUN_ENDED_ERROR,
    detailed_task,
    hands_over,
    tool_result,
)
from server.views.children_view import with_children
from server.views.run_view import RunView, run_view
from tests.acceptance.task_client import conforms
from tests.unit.helpers import ScriptedWorker, make_runtime, play

#: The task status each run status maps to (SEP-2663's five), for a caller given no gate form.
EXPECTED = {
    RunStatus.QUEUED: "working",
    RunStatus.RUNNING: "working",
    # no form to put in inputRequests: handed over with the view (test_a_gate_carries_...: with one)
    RunStatus.AWAITING_APPROVAL: "completed",
    # the host's model does the task: the client gets the view that says so
    RunStatus.AWAITING_HOST: "completed",
    RunStatus.COMPLETED: "completed",
    RunStatus.COMPLETED_WITH_FAILURES: "completed",
    RunStatus.FAILED: "failed",
    RunStatus.REJECTED: "failed",
    RunStatus.CANCELLED: "cancelled",
    # the views() case: the child run waits for the host (a child at work: "working", below)
    RunStatus.AWAITING_CHILDREN: "completed",
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
    # The seed state a tools/call answers with: resultType task, the same status, no result or error.
    seed = conforms("CreateTaskResult", detailed_task(view, created=True))
    assert seed["resultType"] == "task" and seed["status"] == task["status"]
    assert not {"result", "error"} & set(seed)


FORM = {"method": "elicitation/create", "params": {"mode": "form", "message": "decide"}}
ENDED = (RunStatus.COMPLETED, RunStatus.COMPLETED_WITH_FAILURES)


@pytest.mark.parametrize("status", list(RunStatus))
@pytest.mark.parametrize("forms", [{}, {"gate:before:writer": FORM}], ids=["no-form", "a-form"])
async def test_input_required_always_carries_the_forms_it_waits_for(
    status: RunStatus, forms: dict[str, dict[str, object]]
) -> None:
    view = (await views())[status]
    for created in (False, True):
        task = detailed_task(view, forms, created=created)
        if task["status"] == "input_required":
            assert forms and task["inputRequests"] == forms, task
        # Handed over: a run that waits for someone, with no form to give, is a final result.
        handed = hands_over(view, forms)
        assert handed == (task["status"] == "completed" and status not in ENDED), (status, task["status"])
        if handed and not created:
            assert task["result"] == tool_result(view)
            assert task["statusMessage"].startswith("handed over: ")


async def test_a_parent_whose_child_is_at_work_is_working() -> None:
    runtime = make_runtime(catalog=_catalog())
    parent = await _start(runtime, chain="outer")
    child = await _child_of(runtime, parent)  # created, not driven yet: at work, asking nothing
    task = detailed_task(await _parent_view(runtime, parent))
    assert task["status"] == "working" and task["pollIntervalMs"] == POLL_WORKING_MS
    assert child in task["statusMessage"] and "inputRequests" not in task


async def test_a_parent_whose_child_waits_is_handed_over_naming_the_call_on_the_child() -> None:
    view = (await views())[RunStatus.AWAITING_CHILDREN]
    (child,) = view.children
    task = detailed_task(view)
    assert task["status"] == "completed" and "inputRequests" not in task
    call = json.dumps({"run_id": child.run_id, "task_id": "writer"})
    assert f"call orchestrate_resume with {call} plus output" in task["statusMessage"]
    # The result is the parent's view, whose next action is the child's host task.
    action = task["result"]["structuredContent"]["next_action"]
    assert (action["kind"], action["arguments"]) == ("run_host_task", json.loads(call))


async def test_a_host_task_is_handed_over_with_the_view_that_names_it() -> None:
    view = (await views())[RunStatus.AWAITING_HOST]
    task = detailed_task(view)
    assert task["status"] == "completed" and task["pollIntervalMs"] == POLL_WORKING_MS
    call = json.dumps({"run_id": view.run_id, "task_id": "writer"})
    assert f"call orchestrate_resume with {call} plus output" in task["statusMessage"]
    # The prompts are in the result, the plain answer of the tools: no private _meta key.
    assert "_meta" not in task and "inputRequests" not in task
    action = task["result"]["structuredContent"]["next_action"]
    assert action["kind"] == "run_host_task" and action["task_id"] == "writer"
    assert action["system_prompt"] and action["user_prompt"]
    # Forms do not keep a run that waits for the host's model from being handed over.
    assert detailed_task(view, {"gate:before:writer": FORM})["status"] == "completed"


async def test_a_gate_carries_the_forms_it_is_given() -> None:
    view = (await views())[RunStatus.AWAITING_APPROVAL]
    task = detailed_task(view, {"gate:before:writer": FORM})
    assert task["status"] == "input_required" and task["pollIntervalMs"] == POLL_WAITING_MS
    assert task["inputRequests"] == {"gate:before:writer": FORM}
    call = json.dumps({"run_id": view.run_id, "gate_id": "before:writer", "decision": "approve"})
    message = task["statusMessage"]
    assert "tasks/update" in message and f"call orchestrate_approve with {call}" in message
    # A caller given no form (no elicitation, or not one who may decide) gets the view, told who may.
    unasked = detailed_task(view)
    assert unasked["status"] == "completed"
    assert unasked["result"]["structuredContent"]["next_action"]["gate_id"] == "before:writer"
    message = unasked["statusMessage"]
    assert "tasks/update" not in message
    assert f"someone who may decide it calls orchestrate_approve with {call}" in message


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

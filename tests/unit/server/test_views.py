"""The tools' answers: run views built from the record, next actions, semantics, totals, summaries,
and the error results' stable codes."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]  # ships no type information
import pytest
from pydantic import Field, TypeAdapter

from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.models import TypedError, text_hash
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.reading import RunSnapshot
from orchestration.engine.runtime import Runtime
from orchestration.errors import (
    Conflict,
    ConstructError,
    FactNotFound,
    InvalidArgument,
    InvalidState,
    RunNotFound,
    TooLarge,
    UnknownChain,
    UnknownSpecialist,
    VersionConflict,
)
from server.mcp.arguments import error_result
from server.mcp.tool_hints import tool_message
from server.views.listing import run_summary, runs_page
from server.views.next_step import Approve, Done, NextAction, RunHostTask, Wait
from server.views.outline import Outlined
from server.views.run_view import (
    OUTPUT_PREVIEW_CHARS,
    REQUEST_PREVIEW_CHARS,
    ChainView,
    ErrorView,
    RunView,
    run_view,
    semantics,
)
from tests.unit.helpers import ScriptedWorker, make_runtime, play


async def begin(runtime: Runtime, request: str = "Build a URL shortener", **kwargs: object) -> str:
    head, _ = await runtime.start(StartRequest(request, **kwargs))  # type: ignore[arg-type]
    await runtime.drive(head.run_id)
    return head.run_id


async def view_of(runtime: Runtime, run_id: str, warnings: tuple[str, ...] = ()) -> RunView:
    snap = await runtime.snapshot(run_id)
    return run_view(RunSnapshot(snap.head, snap.outputs, snap.host_task, warnings))


async def test_a_host_task_is_the_next_action_with_its_prompts() -> None:
    runtime = make_runtime()
    run_id = await begin(runtime)
    snap = await runtime.snapshot(run_id)
    view = run_view(snap)
    action = view.next_action
    assert isinstance(action, RunHostTask)
    assert snap.host_task is not None
    assert (action.task_id, action.system_prompt, action.user_prompt) == (
        "architect",
        snap.host_task.system,
        snap.host_task.user,
    )
    assert (action.tool, action.arguments) == (
        "orchestrate_resume",
        {"run_id": run_id, "task_id": "architect"},
    )
    assert action.add == {"output": "your complete answer"}
    assert view.status == RunStatus.AWAITING_HOST and view.status_kind == "paused"
    assert [t.task_id for t in view.tasks] == ["architect", "engineer", "reviewer"]
    assert view.tasks[0].attempts[0].outcome == "prepared"
    assert view.tasks[0].output is None and view.tasks[0].output_preview is None
    assert view.tasks[0].output_uri is None
    assert "inline:host" in view.semantics and "called no model" in view.semantics


async def test_a_requested_gate_is_the_next_action() -> None:
    runtime = make_runtime()
    run_id = await begin(runtime, approve_before=("engineer",))
    await runtime.submit_host_output(run_id, "architect", "the design")
    await runtime.drive(run_id)
    view = await view_of(runtime, run_id)
    action = view.next_action
    assert isinstance(action, Approve)
    assert (action.gate_id, action.task_id, action.position) == ("before:engineer", "engineer", "before")
    assert "'engineer' step" in action.guards
    assert (action.tool, action.arguments) == (
        "orchestrate_approve",
        {"run_id": run_id, "gate_id": "before:engineer", "decision": "approve"},
    )
    assert view.tasks[0].output_preview == "the design" and view.tasks[0].output_chars == len("the design")
    assert view.tasks[0].output is None  # compact: the whole output is asked for
    assert "run_status with detail='full'" in action.guards
    assert view.gates[0].status == "requested"


async def test_after_gates_guard_the_output() -> None:
    # An approve_after gate comes from a chain definition (the TOML tables' shape).
    from orchestration.chains.catalog import Catalog

    catalog = Catalog.builtin().extended(
        {"chains": {"checked": {"steps": [{"specialist": "writer", "approve_after": True}]}}},
        "test",
        Path("."),
    )
    runtime = make_runtime(catalog=catalog)
    run_id = await begin(runtime, chain="checked")
    await runtime.submit_host_output(run_id, "writer", "a draft")
    await runtime.drive(run_id)
    action = (await view_of(runtime, run_id)).next_action
    assert isinstance(action, Approve) and action.position == "after"
    assert "output of the 'writer' step" in action.guards
    assert "run_status with task_id='writer'" in action.guards


async def test_terminal_runs_need_nothing() -> None:
    runtime = make_runtime()
    run_id = await begin(runtime)
    head = await play(runtime, run_id)
    view = await view_of(runtime, run_id)
    assert isinstance(view.next_action, Done)
    assert "completed" in view.next_action.instruction
    assert view.status_kind == "terminal" and view.finished_at == head.finished_at
    assert [t.output_preview for t in view.tasks] == [
        f"host output for {t}" for t in ("architect", "engineer", "reviewer")
    ]
    # no call: a host that makes every call an answer names would otherwise never stop
    assert set(view.next_action.model_dump()) == {"kind", "instruction"}

    cancelled = await begin(runtime, "another")
    await runtime.cancel(cancelled, reason="no")
    assert isinstance((await view_of(runtime, cancelled)).next_action, Done)


async def test_a_compact_view_previews_each_output_once_and_points_at_the_whole() -> None:
    runtime = make_runtime()
    run_id = await begin(runtime)
    design = "d" * 5000 + "END"
    await runtime.submit_host_output(run_id, "architect", design)
    await runtime.drive(run_id)
    view = await view_of(runtime, run_id)
    architect = view.tasks[0]
    assert architect.output is None
    assert architect.output_preview == design[:OUTPUT_PREVIEW_CHARS]
    assert architect.output_chars == len(design) and architect.output_sha256 == text_hash(design)
    assert architect.output_uri == f"run://{run_id}/tasks/architect/output"
    # The engineer's prompt carries the design; nothing else in the view does.
    action = view.next_action
    assert isinstance(action, RunHostTask) and design in action.user_prompt
    assert view.model_dump_json().count(design) == 1
    assert view.tasks[1].output_preview is None and view.tasks[1].output_uri is None


async def test_a_long_request_travels_once_in_a_compact_view() -> None:
    runtime = make_runtime()
    request = "Build it. " + "context " * 5000 + "END OF REQUEST"
    run_id = await begin(runtime, request)
    snap = await runtime.snapshot(run_id)
    view = run_view(snap)
    assert view.request is None and view.request_chars == len(request)
    assert view.request_preview == request[: REQUEST_PREVIEW_CHARS - 1] + "…"
    # The host task's prompt carries the request; the rest of the view does not repeat it.
    assert view.model_dump_json().count("END OF REQUEST") == 1
    assert run_view(snap, "full").request == request


async def test_full_detail_and_full_task_carry_whole_outputs() -> None:
    runtime = make_runtime()
    run_id = await begin(runtime)
    head = await play(runtime, run_id, output=lambda t: f"{t}:" + "x" * 1000)
    assert head.status == RunStatus.COMPLETED
    snap = await runtime.snapshot(run_id)
    full = run_view(snap, "full")
    assert [t.output for t in full.tasks] == [
        f"{t}:" + "x" * 1000 for t in ("architect", "engineer", "reviewer")
    ]
    assert all(t.output_preview is None for t in full.tasks)  # the whole output, not twice
    one = run_view(snap, full_task="engineer")
    assert [t.output is not None for t in one.tasks] == [False, True, False]
    assert one.tasks[1].output == "engineer:" + "x" * 1000
    assert one.tasks[0].output_preview == ("architect:" + "x" * 1000)[:OUTPUT_PREVIEW_CHARS]
    with pytest.raises(
        InvalidArgument, match="has no task 'coder'; its tasks are architect, engineer, reviewer"
    ):
        run_view(snap, full_task="coder")


def test_the_published_run_view_schema_is_an_outline() -> None:
    schema = RunView.model_json_schema()
    assert "$defs" not in schema and "$ref" not in str(schema)
    # Only the fields every compact answer has (server.views.compact) are named; the others are allowed.
    published = {"run_id", "status", "status_kind", "next_action", "tasks"}
    assert set(schema["properties"]) == published and published <= set(RunView.model_fields)
    assert set(schema["required"]) == published
    assert schema.get("additionalProperties", True) is True
    # A bare outline: each field by its type (the README says what they hold); words and enums
    # would cost tools/list bytes.
    assert schema["properties"] == {
        "run_id": {"type": "string"},
        "status": {"type": "string"},
        "status_kind": {"type": "string"},
        "next_action": {"type": "object"},
        "tasks": {"type": "array", "items": {"type": "object"}},
    }

    class Described(Outlined):
        chain: ChainView = Field(description="the chain the run follows")
        error: ErrorView | None = None

    described = Described.model_json_schema()
    assert described["properties"]["chain"] == {"description": "the chain the run follows", "type": "object"}
    assert described["properties"]["error"]["type"] == ["object", "null"]
    assert described["additionalProperties"] is False  # without ``published``: every field, closed


async def test_a_run_view_validates_against_its_published_schema() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("x", chain=("architect",), approve_before=("architect",)))
    view = run_view(await runtime.snapshot(head.run_id), "full")
    jsonschema.validate(view.model_dump(mode="json"), RunView.model_json_schema())


async def test_provider_runs_show_telemetry_totals_and_their_executor() -> None:
    failure = TypedError(code="overloaded", message="busy", retryable=True, http_status=529)
    runtime = make_runtime(worker=ScriptedWorker({"architect": [failure, "ok"]}))
    head, _ = await runtime.start(
        StartRequest("x", chain=("architect", "engineer"), worker_backend="provider")
    )
    # Not driven yet: the server is on it, the caller waits.
    view = await view_of(runtime, head.run_id)
    assert view.status == RunStatus.QUEUED and view.status_kind == "active"
    assert isinstance(view.next_action, Wait) and view.next_action.not_before is None
    assert (view.next_action.tool, view.next_action.arguments) == (
        "run_status",
        {"run_id": head.run_id, "wait_seconds": 3},
    )

    head = await play(runtime, head.run_id)
    view = await view_of(runtime, head.run_id)
    assert isinstance(view.next_action, Done)
    assert view.contract.worker_backend == "provider"
    assert {t.executor for t in view.tasks} == {"provider:fake:fake-1"}
    assert "provider:fake:fake-1" in view.semantics and "inline:host" not in view.semantics
    assert view.totals.attempts == 3
    assert view.totals.output_tokens == 14  # two successful attempts of 7 tokens each
    first = view.tasks[0].attempts[0]
    assert first.outcome == "failed" and first.error is not None and first.error.code == "overloaded"
    assert first.telemetry.http_status == 529
    assert [a.outcome for a in view.tasks[0].attempts] == ["failed", "succeeded"]


async def test_a_durable_wait_shows_not_before() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("x", chain=("architect",), worker_backend="provider"))
    not_before = ManualClock().now() + timedelta(minutes=5)
    snap = await runtime.snapshot(head.run_id, head.model_copy(update={"not_before": not_before}))
    action = run_view(snap).next_action
    assert isinstance(action, Wait)
    assert action.not_before == not_before
    assert "not before" in action.instruction and action.tool == "run_status"


async def test_warnings_and_the_schema() -> None:
    runtime = make_runtime()
    run_id = await begin(runtime)
    view = await view_of(runtime, run_id, warnings=("store postgres could not be opened",))
    assert view.warnings == ["store postgres could not be opened"]
    # The view survives a trip through JSON (what a host receives as structuredContent).
    assert RunView.model_validate_json(view.model_dump_json()) == view
    # The full schema of next_action is a union on kind; the published outline names every kind.
    schema = TypeAdapter(NextAction).json_schema()
    kinds = {
        schema["$defs"][ref.split("/")[-1]]["properties"]["kind"]["const"]
        for ref in schema["discriminator"]["mapping"].values()
    }
    assert kinds == {"run_host_task", "approve", "wait", "none"}
    described = RunView.model_fields["next_action"].description or ""
    assert all(kind in described for kind in kinds)


async def test_summaries_and_pages() -> None:
    runtime = make_runtime()
    long_request = "word " * 100
    run_id = await begin(runtime, long_request)
    head = await runtime.status(run_id)
    summary = run_summary(head)
    assert summary.waiting_for == "host output for task architect"
    assert len(summary.request_preview) == REQUEST_PREVIEW_CHARS and summary.request_preview.endswith("…")
    page = runs_page(await runtime.list_runs())
    assert [r.run_id for r in page.runs] == [run_id] and page.next_cursor is None
    assert runs_page([head], "cursor").next_cursor == "cursor"


def test_semantics_of_a_run_before_any_task_ran() -> None:
    assert "inline:host" in semantics_for("inline")
    assert "provider backend" in semantics_for("provider")


def semantics_for(backend: str) -> str:
    from orchestration.chains.catalog import Catalog
    from orchestration.core.facts import RunCreated
    from orchestration.core.fold import head_from_creation
    from orchestration.core.models import ExecutionContract

    chain = Catalog.builtin().resolve("default")
    fact = RunCreated(
        seq=1,
        at=ManualClock().now(),
        run_id="run-test-0001",
        request="x",
        chain=chain,
        chain_hash=chain.content_hash(),
        contract=ExecutionContract(worker_backend=backend),  # type: ignore[arg-type]
        request_hash="h",
    )
    return semantics(head_from_creation(fact))


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RunNotFound("run-x01"), "run_not_found"),
        (FactNotFound("run-x01", 7), "fact_not_found"),
        (InvalidArgument("bad id"), "invalid_argument"),
        (InvalidState("run is completed"), "invalid_state"),
        (Conflict("already decided"), "conflict"),
        (UnknownChain("unknown chain 'x'"), "unknown_chain"),
        (UnknownSpecialist("unknown specialist 'x'"), "unknown_specialist"),
        (TooLarge("too big"), "too_large"),
        (VersionConflict("run-x01", 3, 4), "version_conflict"),
    ],
)
def test_error_results_start_with_the_stable_code(error: ConstructError, code: str) -> None:
    result = error_result(error)
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert text == f"{code}: {tool_message(error)}"
    assert result.structured_content is None

"""Routing and bounded loops: the configuration checked at load, task instances and their ids and
gates, the route facts, what each ``on_exhausted`` does, and what a revisited step's prompt
carries. The every-prefix check over routed runs is in ``test_route_prefixes.py``."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.chains.prompts import materialize
from orchestration.core import StartRequest
from orchestration.core.facts import RouteDecided, TaskCompleted
from orchestration.core.models import RECORD_FORMAT, ChainStep, instance_id
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.runtime import Runtime
from orchestration.errors import ConfigError, InvalidArgument
from server.cli.printing import print_view as print_view
from server.views.run_view import run_view
from server.views.timeline import render_timeline
from stores.memory import MemoryStore
from tests.unit.helpers import make_runtime, play
from tests.unit.routed import ROUTED_CATALOG, answer_for

# --- the configuration -----------------------------------------------------------------------

ROUTER = '{ specialist = "reviewer", output_schema = "verdict", route_on = "verdict", '


@pytest.mark.parametrize(
    ("steps", "field", "problem"),
    [
        (
            f'"architect", "engineer", {ROUTER}routes = {{ approve = "end", revise = "enginer", '
            'reject = "fail" } }',
            "chains.x.steps[2].routes.revise",
            "unknown target 'enginer'",
        ),
        (
            f'"engineer", {ROUTER}routes = {{ approve = "end", revise = "engineer" }} }}',
            "chains.x.steps[1].routes",
            "no route for verdict = 'reject'",
        ),
        (
            f'"engineer", {ROUTER}routes = {{ approve = "end", revise = "engineer", reject = "fail", '
            'maybe = "end" } }',
            "chains.x.steps[1].routes.maybe",
            "does not allow verdict = 'maybe'",
        ),
        (
            '"engineer", { specialist = "reviewer", output_schema = "verdict", route_on = "score", '
            'routes = { approve = "end" } }',
            "chains.x.steps[1].route_on",
            "has no field 'score'",
        ),
        (
            '"engineer", { specialist = "reviewer", route_on = "verdict", routes = { approve = "end" } }',
            "chains.x.steps[1].route_on",
            "needs an output_schema",
        ),
        (
            '"engineer", { specialist = "reviewer", output_schema = "verdict", route_on = "notes", '
            'routes = { approve = "end" } }',
            "chains.x.steps[1].route_on",
            "fixed set of strings",
        ),
        (
            '"engineer", { specialist = "reviewer", output_schema = "verdict", route_on = "verdict" }',
            "chains.x.steps[1].routes",
            "give both or neither",
        ),
        (
            '"architect", { name = "end", specialist = "engineer" }',
            "chains.x.steps[1].name",
            "'end' is reserved",
        ),
        (
            f'"engineer", {ROUTER}routes = {{ approve = "end", revise = "engineer", reject = "fail" }} }}, '
            '"writer"',
            "chains.x.steps[2]",
            "step 'writer' can never run",
        ),
        (
            f'"engineer", {ROUTER}routes = {{ approve = "end", revise = "engineer", reject = "fail" }}, '
            'on_exhausted = "engineer" }',
            "chains.x.steps[1].on_exhausted",
            "not 'fail', 'ask', 'end' or a step after reviewer",
        ),
        (
            '{ specialist = "engineer", on_exhausted = "ask" }',
            "chains.x.steps[0].on_exhausted",
            "only a step that routes",
        ),
        (
            '{ specialist = "engineer", max_visits = 0 }',
            "chains.x.steps[0].max_visits",
            "must be at least 1",
        ),
    ],
)
def test_bad_routes_are_refused_at_load_naming_file_and_field(
    tmp_path: Path, steps: str, field: str, problem: str
) -> None:
    path = tmp_path / "construct.toml"
    path.write_text(f"[chains.x]\nsteps = [{steps}]\n")
    with pytest.raises(ConfigError) as info:
        Catalog.load(path)
    text = str(info.value)
    assert str(path) in text and field in text and problem in text, text


def test_review_loop_is_built_in_and_default_is_unchanged() -> None:
    catalog = Catalog.builtin()
    default = catalog.chains["default"].steps
    assert [(s.name, s.route_on, s.routes) for s in default] == [
        ("architect", None, None),
        ("engineer", None, None),
        ("reviewer", None, None),
    ]
    loop = catalog.resolve("review-loop")
    reviewer = loop.step("reviewer")
    assert reviewer.route_on == "verdict" and reviewer.on_exhausted == "ask"
    assert reviewer.routes == {"approve": "end", "revise": "engineer", "reject": "fail"}
    assert loop.step("engineer").max_visits == 3


def test_step_names_cannot_hold_the_instance_separator_or_a_reserved_name() -> None:
    with pytest.raises(ValueError, match="cannot contain '~'"):
        ChainStep(name="engineer~2", specialist="engineer")
    specialists = {"end": {"description": "d", "persona": "p"}}
    catalog = Catalog.builtin().extended({"specialists": specialists}, "t", Path("."))
    with pytest.raises(InvalidArgument, match="cannot be called 'end'"):
        catalog.resolve(["engineer", "end"])
    assert instance_id("writer-2", 1) == "writer-2" and instance_id("writer-2", 2) == "writer-2~2"


# --- instances, route facts, gates --------------------------------------------------------------


def routed_runtime() -> Runtime:
    return make_runtime(MemoryStore(), catalog=ROUTED_CATALOG)


async def run_inline(
    chain: str, verdicts: dict[str, str], decide: str = "approve"
) -> tuple[Runtime, str, list[RouteDecided]]:
    runtime = routed_runtime()
    head, _ = await runtime.start(StartRequest("Build a URL shortener", chain=chain))
    await play(runtime, head.run_id, output=answer_for(verdicts), decisions=lambda gate: decide)  # type: ignore[arg-type, return-value]
    facts = await runtime.store.read_facts(head.run_id)
    return runtime, head.run_id, [f for f in facts if isinstance(f, RouteDecided)]


async def test_revise_revise_approve_runs_three_rounds_as_instances() -> None:
    verdicts = {"reviewer": "revise", "reviewer~2": "revise", "reviewer~3": "approve"}
    runtime, run_id, routes = await run_inline("review-loop", verdicts)
    head = await runtime.status(run_id)
    assert head.status == RunStatus.COMPLETED
    ids = [t.task_id for t in head.tasks]
    assert ids == [
        "architect",
        "engineer",
        "reviewer",
        "engineer~2",
        "reviewer~2",
        "engineer~3",
        "reviewer~3",
    ]
    assert all(t.status == TaskStatus.DONE for t in head.tasks)
    assert [(t.step_name, t.visit_number) for t in head.tasks[3:5]] == [("engineer", 2), ("reviewer", 2)]
    assert head.task("engineer~2").sent_back_by == "reviewer"
    assert head.task("reviewer~3").route_value == "approve"
    assert [(r.task_id, r.value, r.target, r.applied, r.next_task_id) for r in routes] == [
        ("reviewer", "revise", "engineer", "engineer", "engineer~2"),
        ("reviewer~2", "revise", "engineer", "engineer", "engineer~3"),
        ("reviewer~3", "approve", "end", "end", None),
    ]
    # Each route names the output fact it routed on, and raises the record format.
    for route in routes:
        fact = await runtime.store.read_fact(run_id, route.output_seq)
        assert isinstance(fact, TaskCompleted) and fact.task_id == route.task_id
        assert route.format == 2
    assert head.format == 2 <= RECORD_FORMAT
    # Every instance has its own output.
    outputs = await runtime.outputs(head)
    assert outputs["engineer~2"] == "the work of engineer~2"


async def test_a_run_of_a_routing_chain_is_format_2_from_its_creation() -> None:
    """A server that does not know routes would read the chain as a linear one (and finish the run
    after the first review): it must refuse the run from its first record on."""
    runtime = routed_runtime()
    head, _ = await runtime.start(StartRequest("Build it", chain="review-loop"))
    created, *_ = await runtime.store.read_facts(head.run_id)
    assert created.format == 2 and (await runtime.status(head.run_id)).format == 2


async def test_a_linear_run_keeps_format_1_and_step_named_task_ids() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("Build it"))
    final = await play(runtime, head.run_id)
    assert final.format == 1
    assert all(t.step is None and t.visit is None for t in final.tasks)


async def test_reject_fails_the_run_naming_step_and_value() -> None:
    runtime, run_id, routes = await run_inline("review-loop", {"reviewer": "reject"})
    head = await runtime.status(run_id)
    assert head.status == RunStatus.FAILED
    assert head.error is not None and head.error.code == "route_failed"
    assert "reviewer" in head.error.message and "'reject'" in head.error.message
    assert routes[-1].applied == "fail"


async def test_exhausted_loop_asks_with_a_gate_on_the_routing_instance() -> None:
    verdicts = {"reviewer": "revise", "reviewer~2": "revise", "reviewer~3": "revise"}
    runtime = routed_runtime()
    head, _ = await runtime.start(StartRequest("Build it", chain="review-loop"))
    answer = answer_for(verdicts)
    for _ in range(20):
        await runtime.drive(head.run_id)
        current = await runtime.status(head.run_id)
        if current.status != RunStatus.AWAITING_HOST:
            break
        task = next(t for t in current.tasks if t.status == TaskStatus.AWAITING_HOST)
        await runtime.submit_host_output(head.run_id, task.task_id, answer(task.task_id))
    assert current.status == RunStatus.AWAITING_APPROVAL
    gate = current.gate("exhausted:reviewer~3")
    assert gate is not None and gate.status == "requested" and gate.task_id == "reviewer~3"
    route = [f for f in await runtime.store.read_facts(head.run_id) if isinstance(f, RouteDecided)][-1]
    assert (route.exhausted, route.bounded_step, route.visits, route.applied) == (True, "engineer", 3, "ask")
    final = await runtime.approve(head.run_id, "approve", "exhausted:reviewer~3")
    await runtime.drive(head.run_id)
    final = await runtime.status(head.run_id)
    assert final.status == RunStatus.COMPLETED
    assert [t.task_id for t in final.tasks][-1] == "reviewer~3"


async def test_exhausted_loop_rejected_at_its_gate_ends_rejected() -> None:
    verdicts = {"reviewer": "revise", "reviewer~2": "revise", "reviewer~3": "revise"}
    runtime, run_id, _ = await run_inline("review-loop", verdicts, decide="reject")
    assert (await runtime.status(run_id)).status == RunStatus.REJECTED


async def test_exhausted_loop_with_on_exhausted_fail_fails_with_loop_exhausted() -> None:
    verdicts = {"reviewer": "revise", "reviewer~2": "revise", "reviewer~3": "revise"}
    runtime, run_id, routes = await run_inline("loop-fail", verdicts)
    head = await runtime.status(run_id)
    assert head.status == RunStatus.FAILED
    assert head.error is not None and head.error.code == "loop_exhausted"
    assert "engineer" in head.error.message and "3 visits" in head.error.message
    assert routes[-1].exhausted and routes[-1].applied == "fail"


async def test_exhausted_loop_with_on_exhausted_end_completes() -> None:
    verdicts = {"reviewer": "revise", "reviewer~2": "revise", "reviewer~3": "revise"}
    runtime, run_id, routes = await run_inline("loop-end", verdicts)
    assert (await runtime.status(run_id)).status == RunStatus.COMPLETED
    assert routes[-1].exhausted and routes[-1].applied == "end"


async def test_exhausted_loop_with_on_exhausted_step_goes_on_there() -> None:
    verdicts = {"reviewer": "revise", "reviewer~2": "revise", "reviewer~3": "revise"}
    runtime, run_id, routes = await run_inline("loop-step", verdicts)
    head = await runtime.status(run_id)
    assert head.status == RunStatus.COMPLETED
    assert head.tasks[-1].task_id == "writer" and head.tasks[-1].status == TaskStatus.DONE
    assert (routes[-1].applied, routes[-1].next_task_id) == ("writer", "writer")


async def test_a_forward_route_skips_what_it_jumps_over() -> None:
    runtime, run_id, routes = await run_inline("jump", {"reviewer": "approve"})
    head = await runtime.status(run_id)
    assert head.status == RunStatus.COMPLETED
    assert [(t.task_id, t.status) for t in head.tasks] == [
        ("engineer", TaskStatus.DONE),
        ("reviewer", TaskStatus.DONE),
        ("tester", TaskStatus.SKIPPED),
        ("writer", TaskStatus.DONE),
    ]
    assert routes[0].next_task_id == "writer"


async def test_gates_belong_to_instances() -> None:
    verdicts = {"reviewer": "revise", "reviewer~2": "approve"}
    runtime, run_id, _ = await run_inline("loop-gated", verdicts)
    head = await runtime.status(run_id)
    assert head.status == RunStatus.COMPLETED
    assert [g.gate_id for g in head.gates] == [
        "before:engineer",
        "after:reviewer",
        "before:engineer~2",
        "after:reviewer~2",
    ]
    assert all(g.status == "approved" for g in head.gates)
    assert head.gate("before:engineer~2").task_id == "engineer~2"  # type: ignore[union-attr]


# --- prompts ---------------------------------------------------------------------------------------


async def test_a_revisited_step_sees_the_notes_that_sent_the_work_back() -> None:
    verdicts = {"reviewer": "revise", "reviewer~2": "approve"}
    runtime, run_id, _ = await run_inline("review-loop", verdicts)
    head = await runtime.status(run_id)
    outputs = await runtime.outputs(head)
    engineer2 = materialize(head, "engineer~2", outputs).user
    assert "round 2 (task engineer~2)" in engineer2
    assert "### architect (architect)" in engineer2 and "the work of architect" in engineer2
    assert "## Sent back by reviewer (round 1, task reviewer)" in engineer2
    assert "round notes from reviewer" in engineer2
    assert "the work of engineer\n" not in engineer2, "the earlier round's work is not repeated"
    reviewer2 = materialize(head, "reviewer~2", outputs).user
    assert reviewer2.index("the work of architect") < reviewer2.index("the work of engineer~2")
    assert "### engineer (engineer)" not in reviewer2, "a step sees the latest instance of each earlier step"
    first = materialize(head, "reviewer", outputs).user
    assert "'revise' sends the work to engineer" in first and "Sent back" not in first
    # Deterministic: the same record gives the same bytes (a restarted server's prompt).
    assert materialize(head, "engineer~2", outputs) == materialize(
        await runtime.status(run_id), "engineer~2", await runtime.outputs(head)
    )
    assert (await runtime.snapshot(run_id)).head.task("engineer~2").prompt_sha256 == materialize(
        head, "engineer~2", outputs
    ).sha256


# --- views and timeline ------------------------------------------------------------------------


async def test_the_view_shows_the_path_the_routes_and_the_loop_history_at_the_gate() -> None:
    verdicts = {"reviewer": "revise", "reviewer~2": "revise", "reviewer~3": "revise"}
    runtime = routed_runtime()
    head, _ = await runtime.start(StartRequest("Build it", chain="review-loop"))
    answer = answer_for(verdicts)
    for _ in range(20):
        await runtime.drive(head.run_id)
        current = await runtime.status(head.run_id)
        if current.status != RunStatus.AWAITING_HOST:
            break
        task = next(t for t in current.tasks if t.status == TaskStatus.AWAITING_HOST)
        if task.task_id == "engineer~2":
            # Mid-loop, a waiting task says what it waits for.
            mid = run_view(await runtime.snapshot(head.run_id))
            waits = {t.task_id: t.waits_for for t in mid.tasks}
            assert waits["engineer~2"] == "the host's output (orchestrate_resume)"
            assert waits["reviewer~2"] == "task engineer~2" and waits["reviewer"] is None
        await runtime.submit_host_output(head.run_id, task.task_id, answer(task.task_id))
    view = run_view(await runtime.snapshot(head.run_id))
    assert [(t.task_id, t.step, t.visit) for t in view.tasks][2:4] == [
        ("reviewer", "reviewer", 1),
        ("engineer~2", "engineer", 2),
    ]
    reviewer_step = view.chain.steps[2]
    assert reviewer_step.routes == {"approve": "end", "revise": "engineer", "reject": "fail"}
    assert reviewer_step.on_exhausted == "ask" and view.chain.steps[1].max_visits == 3
    assert [(r.task_id, r.value, r.applied, r.next_task_id) for r in view.routes] == [
        ("reviewer", "revise", "engineer", "engineer~2"),
        ("reviewer~2", "revise", "engineer", "engineer~3"),
        ("reviewer~3", "revise", "ask", None),
    ]
    action = view.next_action
    assert action.kind == "approve" and action.gate_id == "exhausted:reviewer~3"
    assert action.position == "exhausted"
    for n, task_id in ((1, "reviewer"), (2, "reviewer~2"), (3, "reviewer~3")):
        assert f"round {n} ({task_id}): verdict=revise, notes: round notes from {task_id}" in action.guards
    gate = next(g for g in view.gates if g.gate_id == "exhausted:reviewer~3")
    assert gate.description == action.guards
    printed = io.StringIO()
    print_view(view, printed)
    assert "reviewer [verdict: approve->end, revise->engineer, reject->fail]" in printed.getvalue()
    assert "route reviewer~2: verdict=revise -> engineer: engineer~3" in printed.getvalue()
    assert "route reviewer~3: verdict=revise -> engineer (bound reached; on_exhausted ask): ask" in (
        printed.getvalue()
    )
    timeline = render_timeline(await runtime.status(head.run_id), await runtime.store.read_facts(head.run_id))
    assert "reviewer~2: verdict=revise -> engineer: goes on with engineer~3" in timeline
    assert "bound reached: engineer had 3 visits; on_exhausted ask" in timeline

"""Fork and rewind on every store (issue 14, part 4; the rule: :mod:`orchestration.ops.forking`): a
fork copies the recorded work done before its task — the copies name their source fact, routes
replay — calls the worker only from that task on, and leaves the source run as it was."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.chains.prompts import TaskPrompt
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.facts import RouteDecided, TaskCompleted, dump_fact
from orchestration.core.models import ChainStep, ExecutionContract, Telemetry, TypedError
from orchestration.core.outcomes import AttemptFailedOutcome, AttemptOutcome, AttemptSucceeded
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from orchestration.errors import Conflict, ForkMismatch, InvalidArgument, RunNotFound, UnknownChain
from orchestration.ops.forking import ForkRequest, fork_run
from orchestration.store import RunStore
from orchestration.workers.port import DeltaSink, TaskWorker
from server.views.run_view import run_view
from tests.unit.helpers import Decision, play, provider_contract, sequential_ids
from tests.unit.routed import ROUTED_CATALOG, InstanceWorker

MISSING_MODEL = "no-such-model"


def catalog(reviewer_model: str | None, **reviewer: object) -> Catalog:
    """A chain ``build`` = architect -> engineer -> reviewer whose reviewer uses ``reviewer_model``."""
    step = {"specialist": "reviewer", "model": reviewer_model, **reviewer}
    chains = {"build": {"steps": ["architect", "engineer", step]}}
    return Catalog.builtin().extended({"chains": chains}, "fork-test", Path("."))


@dataclass
class ModelWorker:
    """A provider worker that fails a step whose model does not exist (not retryable), and counts
    the calls per task instance."""

    calls: dict[str, int] = field(default_factory=dict)

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        self.calls[prompt.task_id] = self.calls.get(prompt.task_id, 0) + 1
        if step.model == MISSING_MODEL:
            error = TypedError(code="model_not_found", message=f"no model {step.model}", http_status=404)
            return AttemptFailedOutcome(error, Telemetry(http_status=404))
        return AttemptSucceeded(f"{prompt.task_id} by {step.model or 'default'}", Telemetry(output_tokens=3))


def runtime_on(
    store: RunStore, cat: Catalog, worker: TaskWorker, ids: Callable[[], str] | None = None
) -> Runtime:
    return Runtime(
        store,
        cat,
        clock=ManualClock(),
        new_id=ids or sequential_ids(),
        resolve_contract=provider_contract,
        worker=worker,
        settings=RuntimeSettings(lease_ttl_seconds=30),
    )


async def log_of(store: RunStore, run_id: str) -> list[str]:
    return [dump_fact(f) for f in await store.read_facts(run_id)]


async def test_a_failed_run_forked_from_its_failed_task_after_fixing_the_config(store: RunStore) -> None:
    ids = sequential_ids()
    worker = ModelWorker()
    broken = runtime_on(store, catalog(MISSING_MODEL), worker, ids)
    started, _ = await broken.start(StartRequest("Build a parser", chain="build", worker_backend="provider"))
    await broken.drive(started.run_id)
    source = await store.load(started.run_id)
    assert source.status == RunStatus.FAILED and source.task("reviewer").status == TaskStatus.FAILED
    assert worker.calls == {"architect": 1, "engineer": 1, "reviewer": 1}
    source_log = await log_of(store, source.run_id)

    # The configuration is fixed (the reviewer's model): fork from the failed task.
    worker.calls.clear()
    fixed = runtime_on(store, catalog("good-model"), worker, ids)
    head, created = await fork_run(fixed, ForkRequest(source.run_id, "reviewer"))
    assert created and head.run_id != source.run_id and head.status == RunStatus.QUEUED
    await fixed.drive(head.run_id)
    forked = await store.load(head.run_id)
    assert forked.status == RunStatus.COMPLETED
    assert worker.calls == {"reviewer": 1}  # the provider is called only from the forked-from task on
    assert await fixed.outputs(forked) == {
        "architect": "architect by default",
        "engineer": "engineer by default",
        "reviewer": "reviewer by good-model",
    }

    # The source is untouched: same head, same log.
    assert await store.load(source.run_id) == source
    assert await log_of(store, source.run_id) == source_log

    # Each copy names its source fact, which is the same fact in the source's log.
    facts = await store.read_facts(forked.run_id)
    created_fact = facts[0]
    assert created_fact.type == "run_created" and created_fact.forked_from is not None
    assert (created_fact.forked_from.run_id, created_fact.forked_from.task_id) == (source.run_id, "reviewer")
    copies = [f for f in facts if f.copied_from is not None]
    assert [(f.type, getattr(f, "task_id", None)) for f in copies] == [
        ("attempt_started", "architect"),
        ("task_completed", "architect"),
        ("attempt_started", "engineer"),
        ("task_completed", "engineer"),
    ]
    for copy in copies:
        original = await store.read_fact(source.run_id, copy.copied_from or 0)
        assert original.model_copy(update={"seq": copy.seq, "at": copy.at, "copied_from": copy.seq}) == (
            copy.model_copy(update={"copied_from": copy.seq})
        )
    # A fact that is not a copy is recorded as before (no copied_from key: older readers see nothing new).
    assert "copied_from" not in json.loads(dump_fact(facts[-1]))

    view = run_view(await fixed.snapshot(forked.run_id))
    assert view.forked_from is not None and view.forked_from.run_id == source.run_id
    assert view.forked_from.task_id == "reviewer"
    assert {t.task_id: t.copied_from for t in view.tasks} == {
        "architect": copies[1].copied_from,
        "engineer": copies[3].copied_from,
        "reviewer": None,
    }


async def test_a_loop_forked_from_a_later_round_replays_its_routes(store: RunStore) -> None:
    ids = sequential_ids()
    worker = InstanceWorker(verdicts={"reviewer": "revise", "reviewer~2": "approve"})
    runtime = runtime_on(store, ROUTED_CATALOG, worker, ids)
    started, _ = await runtime.start(StartRequest("Build it", chain="loop-fail", worker_backend="provider"))
    await runtime.drive(started.run_id)
    source = await store.load(started.run_id)
    assert source.status == RunStatus.COMPLETED
    source_log = await log_of(store, source.run_id)

    # Redo the second round of the engineer, and have the reviewer ask for a third.
    worker.calls.clear()
    worker.verdicts = {"reviewer~2": "revise", "reviewer~3": "approve"}
    head, _ = await fork_run(runtime, ForkRequest(source.run_id, "engineer~2"))
    assert [t.task_id for t in head.tasks] == [
        "architect",
        "engineer",
        "reviewer",
        "engineer~2",
        "reviewer~2",
    ]
    assert head.task("reviewer").routed_to == "engineer~2"  # the route replayed, not decided again
    await runtime.drive(head.run_id)
    forked = await store.load(head.run_id)
    assert forked.status == RunStatus.COMPLETED
    assert worker.calls == {"engineer~2": 1, "reviewer~2": 1, "engineer~3": 1, "reviewer~3": 1}
    assert await log_of(store, source.run_id) == source_log

    facts = await store.read_facts(forked.run_id)
    routes = [f for f in facts if isinstance(f, RouteDecided)]
    copied_route = routes[0]
    assert copied_route.copied_from is not None and copied_route.task_id == "reviewer"
    original = await store.read_fact(source.run_id, copied_route.copied_from)
    assert isinstance(original, RouteDecided) and original.next_task_id == copied_route.next_task_id
    # The copied route points at the copy of the output it routed on, in the new run's log.
    output = facts[copied_route.output_seq - 1]
    assert (
        isinstance(output, TaskCompleted) and output.task_id == "reviewer" and output.copied_from is not None
    )
    assert [r.copied_from is None for r in routes] == [False, True, True]

    # Forked from the routing task of the last round: its route is decided again, from a new answer.
    worker.calls.clear()
    worker.verdicts = {"reviewer~2": "reject"}
    again, _ = await fork_run(runtime, ForkRequest(source.run_id, "reviewer~2"))
    await runtime.drive(again.run_id)
    ended = await store.load(again.run_id)
    assert ended.status == RunStatus.FAILED and ended.error is not None and ended.error.code == "route_failed"
    assert worker.calls == {"reviewer~2": 1}


async def test_gates_of_the_copied_work_are_copied_and_the_forked_task_asks_again(store: RunStore) -> None:
    runtime = runtime_on(store, catalog(None), ModelWorker())
    started, _ = await runtime.start(
        StartRequest(
            "Gated",
            chain="build",
            approve_before=("engineer",),
            worker_backend="inline",
            timeout_seconds=600,
            task_timeout_seconds=60,
        )
    )
    source = await play(runtime, started.run_id)
    assert source.status == RunStatus.COMPLETED

    # From the reviewer: the decided gate before the engineer is copied, nobody is asked again.
    head, _ = await fork_run(runtime, ForkRequest(source.run_id, "reviewer", request="Gated, again"))
    assert head.request == "Gated, again"
    # The start's time limits carry over: the run's as a duration from the fork, the tasks' as set.
    assert head.deadline_at is not None and (head.deadline_at - head.created_at).total_seconds() == 600
    assert {s.timeout_seconds for s in head.chain.steps} == {60}
    gate = head.gate("before:engineer")
    assert gate is not None and gate.status == "approved"
    await runtime.drive(head.run_id)
    view = run_view(await runtime.snapshot(head.run_id))
    assert view.next_action.kind == "run_host_task" and view.next_action.task_id == "reviewer"
    assert "Gated, again" in (view.next_action.user_prompt or "")

    # From the engineer: its gate is asked again (approve_before is the source's by default).
    head, _ = await fork_run(runtime, ForkRequest(source.run_id, "engineer"))
    await runtime.drive(head.run_id)
    assert (await store.load(head.run_id)).status == RunStatus.AWAITING_APPROVAL
    # ... unless the fork says which steps to gate.
    head, _ = await fork_run(runtime, ForkRequest(source.run_id, "engineer", approve_before=()))
    await runtime.drive(head.run_id)
    after = await store.load(head.run_id)
    assert after.status == RunStatus.AWAITING_HOST and after.gates == ()


async def test_the_same_idempotency_key_returns_the_same_fork(store: RunStore) -> None:
    runtime = runtime_on(store, catalog(None), ModelWorker())
    started, _ = await runtime.start(StartRequest("Once", chain="build", worker_backend="provider"))
    await runtime.drive(started.run_id)
    fork = ForkRequest(started.run_id, "engineer", idempotency_key="fork-1")
    first, created = await fork_run(runtime, fork)
    again, created_again = await fork_run(runtime, fork)
    assert created and not created_again and again.run_id == first.run_id
    assert len((await store.list_runs(None, 10, None)).runs) == 2
    with pytest.raises(Conflict, match="fork-1"):
        await fork_run(runtime, ForkRequest(started.run_id, "reviewer", idempotency_key="fork-1"))
    # Keys are shared with starts: a start's key is not a fork's.
    with pytest.raises(Conflict):
        await runtime.start(StartRequest("Once", chain="build", idempotency_key="fork-1"))


async def test_bad_forks_are_refused_with_coded_errors(store: RunStore) -> None:
    ids = sequential_ids()
    runtime = runtime_on(store, catalog(None), ModelWorker(), ids)
    started, _ = await runtime.start(StartRequest("Check", chain="build", worker_backend="provider"))
    await runtime.drive(started.run_id)
    run_id = started.run_id
    with pytest.raises(RunNotFound):
        await fork_run(runtime, ForkRequest("run-test-9999", "engineer"))
    with pytest.raises(InvalidArgument, match="its tasks are: architect, engineer, reviewer"):
        await fork_run(runtime, ForkRequest(run_id, "coder"))
    # A chain that lacks a copied step, or defines it differently, cannot take the copies.
    with pytest.raises(ForkMismatch, match="no step 'engineer'") as missing:
        await fork_run(runtime, ForkRequest(run_id, "reviewer", chain=("architect", "reviewer")))
    assert missing.value.code == "fork_mismatch"
    changed = runtime_on(store, catalog(None, instruction="Be brief."), ModelWorker(), ids)
    await fork_run(changed, ForkRequest(run_id, "reviewer"))  # the changed step is the one redone: fine
    moved = Catalog.builtin().extended(
        {
            "chains": {
                "build": {"steps": ["architect", {"specialist": "engineer", "model": "other"}, "reviewer"]}
            }
        },
        "fork-test",
        Path("."),
    )
    with pytest.raises(ForkMismatch, match=r"step 'engineer'.*model"):
        await fork_run(runtime_on(store, moved, ModelWorker(), ids), ForkRequest(run_id, "reviewer"))
    # A chain since removed from the configuration is unknown.
    with pytest.raises(UnknownChain, match="unknown chain 'build'"):
        await fork_run(
            runtime_on(store, Catalog.builtin(), ModelWorker(), ids), ForkRequest(run_id, "reviewer")
        )
    # A skipped instance never ran: nothing to redo from it.
    jumper = runtime_on(store, ROUTED_CATALOG, InstanceWorker(verdicts={"reviewer": "approve"}), ids)
    jumped, _ = await jumper.start(StartRequest("Jump", chain="jump", worker_backend="provider"))
    await jumper.drive(jumped.run_id)
    assert (await store.load(jumped.run_id)).task("tester").status == TaskStatus.SKIPPED
    with pytest.raises(InvalidArgument, match="skipped"):
        await fork_run(jumper, ForkRequest(jumped.run_id, "tester"))
    assert len((await store.list_runs(None, 10, None)).runs) == 3  # the source runs and one good fork


async def test_a_revise_replays_and_a_changed_chain_takes_the_copies_it_defines_alike(
    store: RunStore,
) -> None:
    ids = sequential_ids()
    runtime = runtime_on(store, ROUTED_CATALOG, ModelWorker(), ids)
    started, _ = await runtime.start(StartRequest("Revise me", chain="gated-revise"))
    revised: set[str] = set()

    def decide(gate: str) -> Decision:
        if gate == "after:engineer" and gate not in revised:
            revised.add(gate)
            return "revise"
        return "approve"

    source = await play(runtime, started.run_id, decide)
    assert [t.task_id for t in source.tasks] == ["architect", "engineer", "engineer~2", "tester"]

    # The revise decision is copied: engineer~2 exists again, sent back with the approver's comment.
    head, _ = await fork_run(runtime, ForkRequest(source.run_id, "engineer~2"))
    assert head.task("engineer~2").revised_by == "after:engineer"
    await runtime.drive(head.run_id)
    snapshot = await runtime.snapshot(head.run_id)
    assert snapshot.host_task is not None and snapshot.host_task.task_id == "engineer~2"
    assert "ok after:engineer" in snapshot.host_task.user

    # Another chain whose copied steps differ is refused; one that defines them alike is taken.
    with pytest.raises(ForkMismatch, match="approve_after"):
        await fork_run(runtime, ForkRequest(source.run_id, "tester", chain="default"))
    build = runtime_on(store, catalog(None), ModelWorker(), ids)
    started, _ = await build.start(StartRequest("Build", chain="build", worker_backend="inline"))
    done = await play(build, started.run_id)
    other, _ = await fork_run(build, ForkRequest(done.run_id, "reviewer", chain="default"))
    assert other.chain.name == "default" and other.task("engineer").status == TaskStatus.DONE

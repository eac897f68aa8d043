"""The fold's fast path (issue 11: ``evolve`` instead of ``model_copy``, one copy of the head per
fact, a task found at its step's position, the changed task settled alone, no pass over the tasks
for deadlines a chain does not have) gives what the fold gave before it (``fold_reference``): on
full runs of every shape the prefix tests play, fact by fact and write by write, the same head —
equal, with the same fields set at every level, the same JSON — and, for facts that cannot happen
(every fact of a run applied to every head of it), the same error."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import pytest
from pydantic import BaseModel

import orchestration.core.fold as fast
import tests.unit.engine.test_crash_prefixes as crash
import tests.unit.engine.test_parallel_prefixes as parallel
import tests.unit.engine.test_route_prefixes as routed
import tests.unit.fold_reference as reference
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.facts import Fact
from orchestration.core.models import (
    AgentStep,
    AttemptRecord,
    Frozen,
    RunHead,
    TaskState,
    Telemetry,
    built,
    evolve,
    task_position,
)
from orchestration.errors import IllegalTransition
from tests.unit.child_chains import child_runtime, drive_tree
from tests.unit.helpers import ScriptedWorker, make_runtime, play
from tests.unit.parallel import PARALLEL_CATALOG, play_parallel
from tests.unit.routed import ROUTED_CATALOG, InstanceWorker, answer_for

#: a run's facts, and the length of the log after each of its writes
Log = tuple[list[Fact], list[int]]


async def _crash_log(name: str) -> list[Log]:
    request, script, decisions = crash.SCENARIOS[name]
    store = crash.BoundaryStore()
    runtime = make_runtime(store, ScriptedWorker(script), ManualClock(), crash.GATED_CATALOG)
    head, _ = await runtime.start(request)
    await play(runtime, head.run_id, decisions=decisions)
    return [(await store.read_facts(head.run_id), store.boundaries)]


async def _routed_log(name: str) -> list[Log]:
    scenario = routed.SCENARIOS[name]
    store = crash.BoundaryStore()
    worker = InstanceWorker(scenario.verdicts, scenario.errors)
    runtime = make_runtime(store, worker, ManualClock(), ROUTED_CATALOG)  # type: ignore[arg-type]
    head, _ = await runtime.start(scenario.request)
    await play(runtime, head.run_id, decisions=scenario.decisions, output=answer_for(scenario.verdicts))
    return [(await store.read_facts(head.run_id), store.boundaries)]


async def _parallel_log(name: str) -> list[Log]:
    scenario = parallel.SCENARIOS[name]
    store = crash.BoundaryStore()
    verdicts = scenario.verdicts
    worker = ScriptedWorker(scenario.script) if verdicts is None else InstanceWorker(verdicts)
    runtime = make_runtime(store, worker, ManualClock(), PARALLEL_CATALOG)  # type: ignore[arg-type]
    head, _ = await runtime.start(scenario.request)
    output = (lambda task: f"host output for {task}") if verdicts is None else answer_for(verdicts)
    await play_parallel(runtime, head.run_id, decisions=scenario.decisions, output=output)
    return [(await store.read_facts(head.run_id), store.boundaries)]


async def _child_logs(chain: str) -> list[Log]:
    store = crash.BoundaryStore()
    runtime = child_runtime(store)
    root, _ = await runtime.start(StartRequest("Nest", chain=chain, worker_backend="provider"))
    await drive_tree(runtime, root.run_id)
    return [(await store.read_facts(h.run_id), store.boundaries) for h in (await store.list_runs()).runs]


async def _timed_log(backend: Literal["inline", "provider"]) -> list[Log]:
    """Steps with a deadline (the fold keeps the run's ``wake_at`` on the task in progress); the
    inline run's first task runs out of time."""
    clock = ManualClock()
    store = crash.BoundaryStore()
    runtime = make_runtime(store, ScriptedWorker(), clock)
    request = StartRequest("x", task_timeout_seconds=60, timeout_seconds=3600, worker_backend=backend)
    head, _ = await runtime.start(request)
    if backend == "provider":
        await play(runtime, head.run_id)
    else:
        await runtime.drive(head.run_id)
        clock.advance(61)
        await runtime.drive(head.run_id)
    return [(await store.read_facts(head.run_id), store.boundaries)]


async def _cancelled_log() -> list[Log]:
    store = crash.BoundaryStore()
    runtime = make_runtime(store)
    head, _ = await runtime.start(StartRequest("x"))
    await runtime.drive(head.run_id)
    await runtime.cancel(head.run_id, "changed my mind")
    return [(await store.read_facts(head.run_id), store.boundaries)]


SOURCES: dict[str, Any] = {
    **{f"linear: {name}": (_crash_log, name) for name in crash.SCENARIOS},
    **{f"routed: {name}": (_routed_log, name) for name in routed.SCENARIOS},
    **{f"parallel: {name}": (_parallel_log, name) for name in parallel.SCENARIOS},
    **{f"children: {chain}": (_child_logs, chain) for chain in ("outer", "recursive", "outer-tolerant")},
    **{f"deadlines: {backend}": (_timed_log, backend) for backend in ("provider", "inline")},
    "cancelled": (lambda _: _cancelled_log(), None),
}


def _fields_set(value: Any) -> Any:
    """Every record's ``model_fields_set`` in ``value``, nested as the records are."""
    if isinstance(value, BaseModel):
        return (
            type(value).__name__,
            sorted(value.model_fields_set),
            {name: _fields_set(item) for name, item in value.__dict__.items()},
        )
    if isinstance(value, tuple | list):
        return [_fields_set(item) for item in value]
    if isinstance(value, dict):
        return {key: _fields_set(item) for key, item in value.items()}
    return None


def assert_same(fast_head: RunHead, reference_head: RunHead, where: str) -> None:
    assert fast_head == reference_head, where
    assert fast_head.model_dump(mode="json") == reference_head.model_dump(mode="json"), where
    assert fast_head.model_dump_json() == reference_head.model_dump_json(), where  # the key order too
    assert _fields_set(fast_head) == _fields_set(reference_head), where
    assert list(fast_head.__dict__) == list(reference_head.__dict__), where


def _outcome(fold: Any, head: RunHead | None, fact: Fact, keep_history: bool) -> RunHead | str:
    try:
        result: RunHead = fold.apply(head, fact, keep_history=keep_history)
    except (IllegalTransition, KeyError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return result


def _writes(facts: Sequence[Fact], boundaries: Sequence[int]) -> list[list[Fact]]:
    """The facts of each write, in order (boundaries holding other runs' log lengths excluded)."""
    writes, start = [], 1
    for end in sorted(b for b in set(boundaries) if b <= len(facts)):
        if end > start:
            writes.append(list(facts[start:end]))
            start = end
    return writes


@pytest.mark.parametrize("name", list(SOURCES))
async def test_the_fast_fold_gives_the_heads_and_errors_of_the_reference(name: str) -> None:
    make, arg = SOURCES[name]
    for facts, boundaries in await make(arg):
        for keep_history in (False, True):
            # Fact by fact.
            heads: list[RunHead] = []
            fast_head: RunHead | None = None
            reference_head: RunHead | None = None
            for fact in facts:
                fast_head = fast.apply(fast_head, fact, keep_history=keep_history)
                reference_head = reference.apply(reference_head, fact, keep_history=keep_history)
                assert_same(fast_head, reference_head, f"{name}: fact {fact.seq} ({fact.type})")
                heads.append(fast_head)
                assert fast.wake_at(fast_head) == reference.wake_at(fast_head)
                assert fast.time_limit(fast_head) == reference.time_limit(fast_head)
            # Write by write, as the drive and the stores fold them.
            fast_head = reference_head = heads[0]
            for write in _writes(facts, boundaries):
                fast_head = fast.apply_write(fast_head, write, keep_history=keep_history)
                reference_head = reference.apply_write(reference_head, write, keep_history=keep_history)
                assert_same(fast_head, reference_head, f"{name}: write ending at {write[-1].seq}")
            assert fast_head.last_seq == len(facts)
            # Facts that cannot happen here: every fact of the run on every head of it.
            for head in heads if not keep_history else ():
                for fact in facts:
                    moved = evolve(fact, {"seq": head.last_seq + 1})
                    got = _outcome(fast, head, moved, keep_history)
                    expected = _outcome(reference, head, moved, keep_history)
                    if isinstance(got, str) or isinstance(expected, str):
                        assert got == expected, f"{name}: {fact.type} on the head at {head.last_seq}"
                    else:
                        assert_same(got, expected, f"{name}: {fact.type} on the head at {head.last_seq}")


async def test_the_sources_cover_every_kind_of_fact() -> None:
    seen: set[str] = set()
    for make, arg in SOURCES.values():
        for facts, _ in await make(arg):
            seen |= {fact.type for fact in facts}
    # (Budget gates, remote runs and host output are folded in the runs of test_budgets,
    # test_agent_runs and the inline scenarios.)
    expected = {
        "run_created",
        "attempt_started",
        "attempt_failed",
        "task_completed",
        "task_failed",
        "host_task_prepared",
        "host_output_submitted",
        "approval_requested",
        "approval_decided",
        "route_decided",
        "child_started",
        "child_ended",
        "run_cancelled",
        "run_finished",
    }
    assert expected <= seen, expected - seen


def _scan(head: RunHead, task_id: str) -> TaskState:
    for task in head.tasks:
        if task.task_id == task_id:
            return task
    raise KeyError(task_id)


async def test_a_task_is_found_by_id_wherever_routes_and_revises_put_it() -> None:
    """``RunHead.task`` tries the task's step position first: a head whose tasks moved (new
    instances inserted) must still give the task with that id, and KeyError for no task."""
    for name in routed.SCENARIOS:
        for facts, _ in await _routed_log(name):
            head: RunHead | None = None
            for fact in facts:
                head = fast.apply(head, fact)
                for task in head.tasks:
                    assert head.task(task.task_id) is _scan(head, task.task_id)
                    assert head.tasks[task_position(head, task.task_id)] is task
                for missing in ("nope", "engineer~9", *(s.name + "~7" for s in head.chain.steps)):
                    with pytest.raises(KeyError):
                        head.task(missing)
    # A head whose tasks are not in chain order at all (only ids tell them apart).
    assert head is not None
    shuffled = evolve(head, {"tasks": head.tasks[::-1]})
    for task in shuffled.tasks:
        assert shuffled.task(task.task_id) is task


async def test_evolve_is_model_copy() -> None:
    ((facts, _),) = await _crash_log(next(iter(crash.SCENARIOS)))
    head = fast.fold(facts[:3], keep_history=True)
    task = next(t for t in head.tasks if t.attempts)
    records: list[tuple[Frozen, dict[str, Any]]] = [
        (head, {"version": 7, "status": head.status, "not_before": None}),
        (task, {"status": task.status, "executor": "x"}),
        (task, {}),
        (task.attempts[0], {"outcome": "failed"}),
    ]
    for record, update in records:
        copied = record.model_copy(update=update)
        evolved = evolve(record, update)
        assert type(evolved) is type(copied) and evolved == copied
        assert evolved.model_fields_set == copied.model_fields_set
        assert evolved.model_dump_json() == copied.model_dump_json()
        assert list(evolved.__dict__) == list(copied.__dict__)
        # A new record, with a fields set of its own; the record it came from is unchanged.
        assert evolved is not record and evolved.model_fields_set is not record.model_fields_set
        assert evolved.__pydantic_extra__ is None and evolved.__pydantic_private__ is None
        assert record == record.model_copy()
    with pytest.raises(ValueError, match="frozen"):
        head.version = 9
    with pytest.raises(ValueError, match="frozen"):
        evolve(head, {"version": 9}).version = 10


def _same_record(got: Frozen, expected: Frozen) -> None:
    assert type(got) is type(expected) and got == expected
    assert got.model_fields_set == expected.model_fields_set
    assert got.model_dump_json() == expected.model_dump_json()
    assert list(got.__dict__) == list(expected.__dict__)


async def test_built_records_are_the_validated_ones() -> None:
    """``built`` (settled tasks, started attempts) makes what the validating constructor makes."""
    for name in ("provider with retries and a tolerated failure", "inline gated chain, all approved"):
        ((facts, _),) = await _crash_log(name)
        for end in range(2, len(facts) + 1):
            head = fast.fold(facts[:end], keep_history=True)
            for task in head.tasks:
                kept = {n: getattr(task, n) for n in _SETTLED}
                _same_record(task.settled(), TaskState(**kept))
                for attempt in task.attempts:
                    given = {n: getattr(attempt, n) for n in attempt.model_fields_set}
                    _same_record(built(AttemptRecord, given), AttemptRecord(**given))
    _same_record(built(Telemetry, {}), Telemetry())
    with pytest.raises(TypeError, match="default factory"):
        built(AgentStep, {"agent": "a", "tool": "t"})


_SETTLED = (
    "task_id",
    "specialist",
    "step",
    "visit",
    "sent_back_by",
    "revised_by",
    "revision_of",
    "upgraded_from",
    "route_value",
    "routed_to",
    "status",
    "output_seq",
    "error",
    "children",
)

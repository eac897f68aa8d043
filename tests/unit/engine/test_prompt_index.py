"""Prompts read through orchestration.chains.prompt_index (issue 11) are byte for byte the prompts of the
straightforward materialization they replace (kept below as the reference), at every state of runs
that loop, jump, revise, fail, fan out, run child chains and carry approver notes; and its caches
never give a value made for other tasks or other outputs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestration.chains import prompt_index
from orchestration.chains.catalog import Catalog
from orchestration.chains.prompt_index import describe
from orchestration.chains.prompts import TaskPrompt, materialize, upstream_task_ids
from orchestration.chains.schemas import answer_format
from orchestration.core import StartRequest
from orchestration.core.facts import Fact, TaskCompleted
from orchestration.core.fold import apply
from orchestration.core.graph import ancestors, is_parallel, latest
from orchestration.core.models import RunHead, TaskState, TypedError
from orchestration.core.routing import routing_note
from orchestration.core.vocabulary import TaskStatus
from orchestration.engine.reading import read_outputs, read_prompt
from orchestration.engine.runtime import Runtime
from stores.memory import MemoryStore
from tests.unit.child_chains import child_runtime, drive_tree
from tests.unit.helpers import ScriptedWorker, make_runtime, play
from tests.unit.parallel import PARALLEL_CATALOG, play_parallel
from tests.unit.routed import ROUTED_CATALOG, InstanceWorker, answer_for

# -- the reference: prompts.py as it was before orchestration.chains.prompt_index ----------------------


def _ref_position(head: RunHead, task_id: str) -> int:
    return next(i for i, t in enumerate(head.tasks) if t.task_id == task_id)


def _ref_earlier_steps(head: RunHead, task: TaskState) -> list[TaskState]:
    if is_parallel(head.chain):
        found = (latest(head, name) for name in ancestors(head.chain, task.step_name))
        return [t for t in found if t is not None and t.status != TaskStatus.SKIPPED]
    position = _ref_position(head, task.task_id)
    latest_before: dict[str, TaskState] = {}
    for t in head.tasks[:position]:
        if t.status != TaskStatus.SKIPPED:
            latest_before[t.step_name] = t
    steps = head.chain.steps[: head.chain.index(task.step_name)]
    return [latest_before[step.name] for step in steps if step.name in latest_before]


def _ref_seen(head: RunHead, task: TaskState, position: int) -> set[str]:
    if is_parallel(head.chain):
        names = set(ancestors(head.chain, task.step_name))
        return {t.task_id for t in head.tasks if t.step_name in names}
    return {t.task_id for t in head.tasks[:position]}


def ref_upstream_task_ids(head: RunHead, task_id: str) -> list[str]:
    task = head.task(task_id)
    ids = [t.task_id for t in _ref_earlier_steps(head, task) if t.status == TaskStatus.DONE]
    sender = task.sent_back_by
    if sender is not None and sender not in ids and head.task(sender).status == TaskStatus.DONE:
        ids.append(sender)
    revised = task.revision_of
    if revised is not None and revised not in ids and head.task(revised).status == TaskStatus.DONE:
        ids.append(revised)
    return ids


def _ref_sent_back_by_approver(head: RunHead, task: TaskState, outputs: Mapping[str, str]) -> list[str]:
    gate = head.gate(task.revised_by) if task.revised_by is not None else None
    if gate is None or task.revision_of is None:
        return []
    who = f" ({gate.approver})" if gate.approver else ""
    comment = gate.comment.strip() if gate.comment else "(no comment)"
    parts = [
        "",
        f"## Sent back by the approver{who}",
        "",
        f"At gate {gate.gate_id} the approver sent the output of task {task.revision_of} back with "
        f"this comment: {comment}",
        "",
        "Redo that work, taking the comment into account.",
    ]
    if task.revision_of in outputs:
        parts += ["", f"### {task.revision_of} (the output sent back)", "", outputs[task.revision_of].strip()]
    return parts


def ref_materialize(
    head: RunHead, task_id: str, outputs: Mapping[str, str], upstream_ids: Sequence[str] | None = None
) -> TaskPrompt:
    steps = head.chain.steps
    task = head.task(task_id)
    index = head.chain.index(task.step_name)
    step = steps[index]
    specialist = head.chain.specialist(step.specialist)
    visit = task.visit_number
    round_note = f", round {visit} (task {task_id})" if visit > 1 else ""
    parts = [
        f'You are step {index + 1} of {len(steps)} ("{step.name}", the {specialist.name}){round_note} in '
        f'the chain "{head.chain.name}": {describe(head.chain)}.',
        "",
        "## Request",
        "",
        head.request.strip(),
    ]
    sender = task.sent_back_by
    if upstream_ids is None:
        upstream_ids = ref_upstream_task_ids(head, task_id)
    upstream = [tid for tid in upstream_ids if tid not in (sender, task.revision_of)]
    if upstream:
        parts += ["", "## Work so far"]
        specialists = {t.task_id: t.specialist for t in head.tasks}
        for tid in upstream:
            spec = specialists[tid]
            parts += ["", f"### {tid} ({spec})", "", outputs[tid].strip()]
    if sender is not None and sender in outputs:
        by = head.task(sender)
        parts += [
            "",
            f"## Sent back by {by.step_name} (round {by.visit_number}, task {sender})",
            "",
            f"The {by.step_name}'s output below sent the work back for round {visit} of {step.name}. "
            "Take it into account.",
            "",
            outputs[sender].strip(),
        ]
    parts += _ref_sent_back_by_approver(head, task, outputs)
    position = _ref_position(head, task_id)
    seen = _ref_seen(head, task, position)
    notes = [
        g
        for g in head.gates
        if g.status == "approved"
        and g.comment
        and (g.task_id in seen or (g.task_id == task_id and g.position == "before"))
    ]
    if notes:
        parts += ["", "## Approver notes"]
        for gate in notes:
            who = f" ({gate.approver})" if gate.approver else ""
            parts += ["", f"- {gate.gate_id}{who}: {gate.comment}"]
    failed = [t.task_id for t in head.tasks if t.status == TaskStatus.FAILED and t.task_id in seen]
    if failed:
        parts += ["", f"Note: these earlier steps failed and produced no output: {', '.join(failed)}."]
    parts += [
        "",
        "## Your task",
        "",
        f"Do the {specialist.name}'s part of this request. Your role: {_as_sentence(specialist.description)} "
        "Build on the work so far; the next step sees only what you write.",
    ]
    if step.instruction is not None:
        parts += ["", step.instruction.strip()]
    note = routing_note(step)
    if note is not None:
        parts += ["", note]
    if step.output_schema is not None:
        parts += ["", "## Answer format", "", answer_format(step.output_schema)]
    return TaskPrompt(task_id, specialist.name, specialist.persona, "\n".join(parts) + "\n")


# -- runs of every shape --------------------------------------------------------------------------


def _as_sentence(text: str) -> str:
    # A custom specialist's description may lack its full stop; the prompt adds one.
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


EXTRA = Catalog.builtin().extended(
    {
        "specialists": {"notes": {"description": "Writes the release notes", "persona": "You write notes."}},
        "chains": {
            "custom": {"steps": ["architect", "notes"]},
            "instructed": {
                "steps": [
                    "architect",
                    {"specialist": "engineer", "instruction": "  Keep it small.  ", "approve_before": True},
                    {"specialist": "tester", "on_failure": "continue"},
                    "writer",
                ]
            },
            "instructed-fan": {
                "steps": [
                    {"name": "one", "specialist": "researcher", "after": [], "instruction": "Look at costs."},
                    {"name": "two", "specialist": "researcher", "after": [], "instruction": "Look at risks."},
                    {"specialist": "writer", "after": ["one", "two"]},
                ]
            },
        },
    },
    "test",
    Path("."),
)

FATAL = TypedError(code="provider_error", message="no", retryable=False)
Scenario = Callable[[], Awaitable[tuple[Runtime, str]]]


async def _inline_gates() -> tuple[Runtime, str]:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("  Make a game  ", approve_before=("reviewer", "engineer")))
    await play(runtime, head.run_id, output=lambda t: f"  the {t}'s work \n")
    return runtime, head.run_id


async def _routed(chain: str, verdicts: dict[str, str], backend: str = "provider") -> tuple[Runtime, str]:
    runtime = make_runtime(worker=InstanceWorker(verdicts=verdicts), catalog=ROUTED_CATALOG)  # type: ignore[arg-type]
    head, _ = await runtime.start(StartRequest("Build it", chain=chain, worker_backend=backend))  # type: ignore[arg-type]
    if backend == "provider":
        await runtime.drive(head.run_id)
        await play(runtime, head.run_id, decisions=lambda g: "approve")
    else:
        await play(runtime, head.run_id, output=answer_for(verdicts))
    return runtime, head.run_id


async def _revised() -> tuple[Runtime, str]:
    runtime = make_runtime(catalog=ROUTED_CATALOG)
    head, _ = await runtime.start(StartRequest("Build it", chain="gated-revise"))
    sent: set[str] = set()

    def decide(gate: str) -> Any:
        if gate.startswith("after:engineer") and len(sent) < 2:
            sent.add(gate)
            return "revise"
        return "approve"

    await play(runtime, head.run_id, decisions=decide)
    return runtime, head.run_id


async def _custom() -> tuple[Runtime, str]:
    runtime = make_runtime(catalog=EXTRA)
    head, _ = await runtime.start(StartRequest("Release it", chain="custom"))
    await play(runtime, head.run_id, output=lambda t: f"the {t}'s work")
    return runtime, head.run_id


async def _failing() -> tuple[Runtime, str]:
    worker = ScriptedWorker(script={"tester": [FATAL]})
    runtime = make_runtime(worker=worker, catalog=EXTRA)
    head, _ = await runtime.start(StartRequest("Build it", chain="instructed", worker_backend="provider"))
    await play(runtime, head.run_id)
    return runtime, head.run_id


async def _parallel(
    chain: str, catalog: Catalog, verdicts: dict[str, str] | None = None
) -> tuple[Runtime, str]:
    worker = InstanceWorker(verdicts=verdicts or {}, errors={"a": [FATAL]})
    runtime = make_runtime(worker=worker, catalog=catalog)  # type: ignore[arg-type]
    backend = "inline" if chain == "fan-gated" else "provider"
    head, _ = await runtime.start(StartRequest("Study it", chain=chain, worker_backend=backend))  # type: ignore[arg-type]
    await play_parallel(runtime, head.run_id)
    return runtime, head.run_id


async def _children() -> tuple[Runtime, str]:
    runtime = child_runtime(MemoryStore())
    head, _ = await runtime.start(StartRequest("Build it", chain="outer", worker_backend="provider"))
    await drive_tree(runtime, head.run_id)
    return runtime, head.run_id


#: each run, and a part of a prompt one of its states shows (so that each part is compared)
SCENARIOS: dict[str, tuple[Scenario, str]] = {
    "inline-gates-notes": (_inline_gates, "- before:engineer: ok before:engineer"),
    "loop-then-step": (
        lambda: _routed("loop-step", {"reviewer": "revise", "reviewer~2": "approve"}),
        "## Sent back by reviewer (round 1, task reviewer)",
    ),
    "loop-exhausted": (
        lambda: _routed("loop-end", {f"reviewer{v}": "revise" for v in ("", "~2", "~3")}),
        ", round 3 (task reviewer~3)",
    ),
    "loop-gated-inline": (
        lambda: _routed("loop-gated", {"reviewer": "revise", "reviewer~2": "approve"}, "inline"),
        "- before:engineer~2: ok before:engineer~2",
    ),
    "jump": (lambda: _routed("jump", {"reviewer": "approve"}), "## Answer format"),
    "jump-back": (lambda: _routed("jump", {"reviewer": "revise"}), "### reviewer (reviewer)"),
    "revise": (_revised, "## Sent back by the approver"),
    "failed-continue-instruction": (_failing, "failed and produced no output: tester."),
    "instruction": (_failing, "\nKeep it small.\n"),
    "custom-description": (_custom, "Your role: Writes the release notes. Build on the work so far"),
    "fan-continue": (
        lambda: _parallel("fan-continue", PARALLEL_CATALOG),
        "failed and produced no output: a.",
    ),
    "fan-gated": (lambda: _parallel("fan-gated", PARALLEL_CATALOG), "## Approver notes"),
    "diamond-loop": (
        lambda: _parallel("diamond-loop", PARALLEL_CATALOG, {"reviewer": "revise", "reviewer~2": "approve"}),
        "## Sent back by reviewer",
    ),
    "graph-jump": (lambda: _parallel("graph-jump", PARALLEL_CATALOG, {"reviewer": "approve"}), "(after "),
    "instructed-fan": (lambda: _parallel("instructed-fan", EXTRA), "Look at risks."),
    "child-output-of": (_children, "### build (chain:inner)"),
}


def _same(head: RunHead, task_id: str, outputs: Mapping[str, str]) -> TaskPrompt | None:
    """The new materialization equals the reference (or both raise the same error)."""
    try:
        ids = ref_upstream_task_ids(head, task_id)
        expected = ref_materialize(head, task_id, {k: outputs[k] for k in ids})
    except KeyError as exc:
        with pytest.raises(KeyError) as raised:
            materialize(head, task_id, {k: outputs[k] for k in upstream_task_ids(head, task_id)})
        assert raised.value.args == exc.args
        return None
    assert upstream_task_ids(head, task_id) == ids
    got = materialize(head, task_id, {k: outputs[k] for k in ids})
    assert got == expected and got.sha256 == expected.sha256
    assert materialize(head, task_id, dict(outputs), ids) == ref_materialize(
        head, task_id, dict(outputs), ids
    )
    return expected


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_every_prompt_of_every_state_is_the_reference_prompt(name: str) -> None:
    scenario, part = SCENARIOS[name]
    runtime, run_id = await scenario()
    shown: list[str] = []
    store = runtime.store
    heads = [await store.load(run_id)]
    for task in heads[0].tasks:
        for child in task.children or ():
            heads.append(await store.load(child.run_id))
    compared = 0
    for final in heads:
        facts = await store.read_facts(final.run_id, 0)
        head: RunHead | None = None
        outputs: dict[str, str] = {}
        known: dict[int, Fact] = {}
        for n, fact in enumerate(facts):
            head = apply(head, fact)
            if isinstance(fact, TaskCompleted):
                outputs[fact.task_id] = fact.output
                known[fact.seq] = fact
            if n % 3 == 0:
                prompt_index.clear()  # cold as well as extended
            for task in head.tasks:
                expected = _same(head, task.task_id, outputs)
                compared += expected is not None
                if expected is not None:
                    shown.append(expected.user)
                    # As a drive reads it (outputs known or read from the store), and as a head
                    # read back from the store (other objects, equal values) gives it.
                    assert await read_prompt(store, head, task.task_id, dict(known)) == expected
                    assert await read_prompt(store, head, task.task_id) == expected
                    again = RunHead.model_validate(head.model_dump())
                    assert materialize(again, task.task_id, outputs) == expected
        assert head is not None and (head.last_seq, head.status) == (final.last_seq, final.status)
    assert compared > 0
    assert any(part in user for user in shown), part


async def test_outputs_read_with_known_facts_are_the_store_s() -> None:
    runtime, run_id = await _routed("loop-step", {"reviewer": "revise", "reviewer~2": "approve"})
    head = await runtime.store.load(run_id)
    facts = await runtime.store.read_facts(run_id, 0)
    everything = await read_outputs(runtime.store, head)
    assert everything == {f.task_id: f.output for f in facts if isinstance(f, TaskCompleted)}
    ids = ["architect", "engineer~2", "nope"]
    assert await read_outputs(runtime.store, head, ids) == {k: everything[k] for k in ids[:2]}


# -- the caches cannot give a stale value ---------------------------------------------------------


async def _three_tasks() -> RunHead:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("Make a game", chain=("architect", "engineer", "reviewer")))
    await play(runtime, head.run_id, output=lambda t: f"the {t}'s work")
    return await runtime.status(head.run_id)


async def test_a_cached_prefix_is_used_only_for_the_same_earlier_tasks() -> None:
    head = await _three_tasks()
    architect, engineer, reviewer = head.tasks
    outputs = {"architect": "A", "engineer": "E"}
    first = materialize(head, "reviewer", outputs)
    assert "### architect (architect)" in first.user and "failed" not in first.user
    # The same engineer task object (the key of the cached prefix), another architect before it.
    failed = architect.model_copy(update={"status": TaskStatus.FAILED, "output_seq": None})
    other = head.model_copy(update={"tasks": (failed, engineer, reviewer)})
    second = materialize(other, "reviewer", {"engineer": "E"})
    assert second == ref_materialize(other, "reviewer", {"engineer": "E"})
    assert "### architect" not in second.user
    assert "these earlier steps failed and produced no output: architect." in second.user
    assert materialize(head, "reviewer", outputs) == first


async def test_a_cached_work_section_is_used_only_for_the_same_outputs() -> None:
    head = await _three_tasks()
    first = materialize(head, "reviewer", {"architect": "A", "engineer": "E"})
    second = materialize(head, "reviewer", {"architect": "A2", "engineer": "E"})
    assert "\nA\n" in first.user and "\nA2\n" in second.user and "\nA\n" not in second.user
    assert second == ref_materialize(head, "reviewer", {"architect": "A2", "engineer": "E"})
    # One more task than the cached section, with another output for the earlier one.
    extra = head.model_copy(update={"chain": head.chain})
    assert materialize(extra, "engineer", {"architect": "A3"}).user.count("A3") == 1


def test_the_caches_are_bounded() -> None:
    prompt_index.clear()
    tasks = tuple(TaskState(task_id=f"t{i}", specialist="s", status=TaskStatus.DONE) for i in range(3))
    for i in range(prompt_index.LIMIT * 2):
        copies = tuple(t.model_copy(update={"specialist": f"s{i}"}) for t in tasks)
        prompt_index.before(copies, 2)
        prompt_index.work_section(copies, ["x"] * 3)
    assert len(prompt_index._befores) <= prompt_index.LIMIT
    assert len(prompt_index._works) <= prompt_index.LIMIT

"""Child runs (a chain as a step): the configuration checks made at load, the bounds (depth,
live children) and the ties between a parent and its children (deadline, cancel)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.decide import child_run_id
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.children import refuse_detached
from orchestration.errors import ConfigError, InvalidState
from orchestration.ops.forking import ForkRequest, fork_run
from orchestration.store import Tombstone
from server.cli import main as cli
from server.views.children_view import with_children, with_gone_links
from server.views.next_step import Approve, RunHostTask
from server.views.run_view import ForkView, RunView, run_view
from stores.filesystem import FilesystemStore
from stores.memory import MemoryStore
from tests.unit.child_chains import child_catalog, child_runtime, drive_tree


def load(chains: dict[str, Any]) -> Catalog:
    return Catalog.builtin().extended({"chains": chains}, "construct.toml", Path("."))


def test_a_step_that_runs_a_chain_is_snapshotted_with_its_bounds() -> None:
    chain = child_catalog().resolve("outer")
    build = chain.step("build")
    assert (build.chain, build.output_of, build.specialist) == ("inner", "engineer", "chain:inner")
    assert [s.name for s in chain.specialists] == ["architect", "writer"]
    recursive = child_catalog().resolve("recursive")
    assert (recursive.max_depth, recursive.max_children) == (2, None)


@pytest.mark.parametrize(
    ("chains", "where", "says"),
    [
        ({"a": {"steps": ["architect", {"chain": "a"}]}}, "chains.a", "contains itself (a -> a)"),
        (
            {"a": {"steps": [{"chain": "b"}]}, "b": {"steps": ["engineer", {"chain": "a"}]}},
            "chains.a",
            "contains itself (a -> b -> a)",
        ),
        ({"a": {"steps": [{"chain": "nope"}]}}, "chains.a", "unknown chain 'nope'"),
        ({"a": {"steps": [{"chain": "default", "output_of": "tester"}]}}, "chains.a", "not a step of chain"),
        ({"a": {"steps": [{"chain": "default", "specialist": "engineer"}]}}, "steps[0]", "exactly one of"),
        ({"a": {"steps": [{"specialist": "engineer", "output_of": "x"}]}}, "output_of", "only a step with"),
        ({"a": {"steps": [{"chain": "default", "output_schema": "verdict"}]}}, "output_schema", "as it is"),
        # a step runs one of a specialist, a chain or an agent (orchestration.core.agent_steps)
        (
            {"a": {"steps": [{"chain": "default", "agent": "other", "tool": "t"}]}},
            "steps[0]",
            "exactly one of",
        ),
        ({"a": {"steps": [{"chain": "default", "tool": "t"}]}}, "steps[0].tool", "only a step with 'agent'"),
    ],
)
def test_bad_child_steps_are_configuration_errors(chains: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load(chains)
    assert where in raised.value.field and says in raised.value.problem, raised.value


def test_a_chain_that_contains_itself_loads_once_a_chain_on_the_cycle_bounds_its_depth() -> None:
    catalog = load(
        {"a": {"steps": [{"chain": "b"}]}, "b": {"max_depth": 4, "steps": ["engineer", {"chain": "a"}]}}
    )
    assert catalog.resolve("b").max_depth == 4


async def test_a_chain_that_runs_itself_stops_at_its_depth_limit() -> None:
    store = MemoryStore()
    runtime = child_runtime(store)
    root, _ = await runtime.start(StartRequest("Recurse", chain="recursive", worker_backend="provider"))
    final = await drive_tree(runtime, root.run_id)
    assert final.status == RunStatus.FAILED and final.error is not None
    assert final.error.code == "child_failed"
    runs = {h.run_id: h for h in (await store.list_runs()).runs}
    assert len(runs) == 3  # depth 0, 1 and 2; depth 3 is over max_depth = 2
    deepest = next(h for h in runs.values() if h.parent is not None and h.parent.depth == 2)
    again = deepest.task("again")
    assert again.status == TaskStatus.FAILED and again.error is not None
    assert again.error.code == "child_depth_exceeded"


async def test_the_default_depth_limit_is_three() -> None:
    chains = {f"l{i}": {"steps": ["engineer", {"name": "down", "chain": f"l{i + 1}"}]} for i in range(4)}
    chains["l4"] = {"steps": ["engineer"]}
    store = MemoryStore()
    runtime = child_runtime(store, catalog=child_catalog(chains))
    for top, expected in (("l1", RunStatus.COMPLETED), ("l0", RunStatus.FAILED)):
        root, _ = await runtime.start(StartRequest("Deep", chain=top, worker_backend="provider"))
        final = await drive_tree(runtime, root.run_id)
        assert final.status == expected, top
    depths = sorted(h.parent.depth for h in (await store.list_runs()).runs if h.parent is not None)
    assert max(depths) == 3


async def test_a_parents_deadline_bounds_its_child_and_ends_it() -> None:
    store = MemoryStore()
    clock = ManualClock()
    runtime = child_runtime(store, clock=clock)
    parent, _ = await runtime.start(
        StartRequest("Build", chain="outer-gated", worker_backend="provider", timeout_seconds=60)
    )
    await runtime.drive(parent.run_id)
    child_id = child_run_id(parent.run_id, "build")
    child = await store.load(child_id)
    assert parent.deadline_at is not None and child.deadline_at == parent.deadline_at
    await runtime.drive(child_id)
    assert (await store.load(child_id)).status == RunStatus.AWAITING_APPROVAL

    clock.advance(61)
    # The parent's deadline passed: whoever drives it first fails it, and its child is cancelled.
    assert parent.run_id in await store.runnable(clock.now())
    await runtime.drive(parent.run_id)
    ended = await store.load(parent.run_id)
    assert ended.status == RunStatus.FAILED and ended.error is not None
    assert ended.error.code == "deadline_exceeded"
    assert (await store.load(child_id)).status == RunStatus.CANCELLED


async def test_a_hosts_children_are_bounded_by_max_children_and_block_their_task() -> None:
    catalog = child_catalog(
        {"split": {"max_children": 1, "steps": ["writer", {"name": "more", "chain": "inner"}]}}
    )
    store = MemoryStore()
    runtime = child_runtime(store, catalog=catalog)
    parent, _ = await runtime.start(StartRequest("Write", chain="split"))
    await runtime.drive(parent.run_id)
    first, created = await runtime.children.start_for_host(
        StartRequest("Part 1", chain=("researcher",), idempotency_key="p1"), parent.run_id, "writer"
    )
    assert created and first.parent is not None and first.parent.depth == 1
    again, created = await runtime.children.start_for_host(
        StartRequest("Part 1", chain=("researcher",), idempotency_key="p1"), parent.run_id, "writer"
    )
    assert again.run_id == first.run_id and not created
    with pytest.raises(InvalidState, match="max_children"):
        await runtime.children.start_for_host(
            StartRequest("Part 2", chain=("researcher",)), parent.run_id, "writer"
        )
    # The refused start left no live run behind: it was cancelled.
    live = [h for h in (await store.list_runs()).runs if not h.status.is_terminal]
    assert sorted(h.run_id for h in live) == sorted([parent.run_id, first.run_id])
    before = (await store.load(parent.run_id)).version
    with pytest.raises(InvalidState, match="live child runs"):
        await runtime.submit_host_output(parent.run_id, "writer", "Report.")
    assert (await store.load(parent.run_id)).version == before  # refused: nothing recorded

    # Completed with its child detached, the child is still the run's: the next step's child
    # would be one too many.
    await runtime.submit_host_output(parent.run_id, "writer", "Report.", detach_children=True)
    final = await drive_tree(runtime, parent.run_id)
    assert final.status == RunStatus.FAILED
    more = final.task("more")
    assert more.error is not None and more.error.code == "too_many_children"
    # The parent failed: its live child was cancelled with it.
    assert (await store.load(first.run_id)).status == RunStatus.CANCELLED


async def test_a_hosts_child_that_ends_is_recorded_on_its_task_which_can_then_complete() -> None:
    store = MemoryStore()
    runtime = child_runtime(store)
    parent, _ = await runtime.start(StartRequest("Write", chain=("writer", "reviewer")))
    await runtime.drive(parent.run_id)
    child, _ = await runtime.children.start_for_host(
        StartRequest("Research", chain=("researcher",), worker_backend="provider"), parent.run_id, "writer"
    )
    with pytest.raises(InvalidState):
        refuse_detached(await store.load(parent.run_id), "writer", detach=False)
    assert (await drive_tree(runtime, child.run_id)).status == RunStatus.COMPLETED
    head = await store.load(parent.run_id)
    assert head.status == RunStatus.AWAITING_HOST  # a host's child never moves the task itself
    assert [(c.run_id, c.by, c.status) for c in head.task("writer").children or ()] == [
        (child.run_id, "host", "completed")
    ]
    refuse_detached(head, "writer", detach=False)  # nothing live: the task may complete
    facts = await store.read_facts(parent.run_id)
    assert [f.type for f in facts[-2:]] == ["child_started", "child_ended"]


async def test_a_parallel_run_waits_for_several_children_at_once() -> None:
    both = {
        "steps": [
            {"name": "left", "chain": "inner", "after": []},
            {"name": "right", "chain": "inner", "after": [], "on_failure": "continue"},
            {"specialist": "writer", "after": ["left", "right"]},
        ]
    }
    catalog = child_catalog({"both": both, "one-at-a-time": {**both, "max_children": 1}})
    store = MemoryStore()
    runtime = child_runtime(store, catalog=catalog)
    parent, _ = await runtime.start(StartRequest("Two ways", chain="both", worker_backend="provider"))
    await runtime.drive(parent.run_id)
    waiting = await store.load(parent.run_id)
    # Both children started; the run waits for them without being runnable.
    assert waiting.status == RunStatus.AWAITING_CHILDREN
    assert [t.status for t in waiting.tasks[:2]] == [TaskStatus.RUNNING, TaskStatus.RUNNING]
    assert parent.run_id not in await store.runnable(runtime.clock.now())
    final = await drive_tree(runtime, parent.run_id)
    assert final.status == RunStatus.COMPLETED
    prompt = await runtime.prompt_for(await store.load(parent.run_id), "writer")
    assert "### left (chain:inner)" in prompt.user and "### right (chain:inner)" in prompt.user

    # max_children = 1: the second start of the same decision is one too many.
    bounded, _ = await runtime.start(StartRequest("One", chain="one-at-a-time", worker_backend="provider"))
    final = await drive_tree(runtime, bounded.run_id)
    assert final.status == RunStatus.COMPLETED_WITH_FAILURES
    right = final.task("right")
    assert right.error is not None and right.error.code == "too_many_children"


def test_the_cli_refuses_to_complete_a_task_with_live_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONSTRUCT_HOME", str(tmp_path))
    for name in ("CONSTRUCT_ORCHESTRATION_STORE", "CONSTRUCT_DEPLOYMENT_MODE"):
        monkeypatch.delenv(name, raising=False)

    async def setup() -> str:
        store = FilesystemStore(tmp_path)
        try:
            runtime = child_runtime(store)
            parent, _ = await runtime.start(StartRequest("Write", chain=("writer", "reviewer")))
            await runtime.drive(parent.run_id)
            await runtime.children.start_for_host(
                StartRequest("Research", chain=("researcher",)), parent.run_id, "writer"
            )
            return parent.run_id
        finally:
            await store.close()

    run_id = anyio.run(setup)
    resume = ["runs", "resume", run_id, "--task-id", "writer", "--output", "Report.", "--json"]
    out = io.StringIO()
    assert cli.run(resume, out) != 0
    assert cli.run([*resume, "--detach-children"], out) == 0
    assert json.loads(out.getvalue())["tasks"][0]["status"] == "done"


async def test_a_parents_view_says_a_child_moved_to_another_store() -> None:
    """A link to a child deleted from this store (moved by ``runs import --move``, or pruned) says
    so in the parent's view, instead of looking like a child not created yet."""
    store = MemoryStore()
    clock = ManualClock()
    runtime = child_runtime(store, clock=clock)
    parent, _ = await runtime.start(StartRequest("Build", chain="outer-gated", worker_backend="provider"))
    await runtime.drive(parent.run_id)
    child_id = child_run_id(parent.run_id, "build")
    await runtime.drive(child_id)
    child = await store.load(child_id)
    await store.delete_run(Tombstone.of(child, "moved", clock.now(), moved_to="sqlite:///elsewhere.db"))

    async def load(run_id: str) -> RunView:
        return run_view(await runtime.snapshot(run_id))

    head = await store.load(parent.run_id)
    view = await with_children(await load(parent.run_id), head, load)
    assert [(c.run_id, c.status) for c in view.children] == [(child_id, "moved")]
    assert not isinstance(view.next_action, Approve | RunHostTask)


async def test_links_to_runs_pruned_or_moved_away_say_so() -> None:
    """A child's ``parent`` and a fork's ``forked_from`` name the linked run; once that run is
    deleted from the store (moved, or pruned), the view says which."""
    store = MemoryStore()
    clock = ManualClock()
    runtime = child_runtime(store, clock=clock)
    parent, _ = await runtime.start(StartRequest("Build", chain="outer-gated", worker_backend="provider"))
    await runtime.drive(parent.run_id)
    child_id = child_run_id(parent.run_id, "build")

    async def view_of(run_id: str) -> RunView:
        return await with_gone_links(run_view(await runtime.snapshot(run_id)), store)

    link = (await view_of(child_id)).parent
    assert link is not None and (link.run_id, link.task_id, link.gone) == (parent.run_id, "build", None)
    await store.delete_run(Tombstone.of(await store.load(parent.run_id), "moved", clock.now()))
    link = (await view_of(child_id)).parent
    assert link is not None and link.gone == "moved"

    source, _ = await runtime.start(
        StartRequest("Plan", chain=("architect", "writer"), worker_backend="provider")
    )
    await runtime.drive(source.run_id)
    fork, _ = await fork_run(runtime, ForkRequest(source.run_id, "writer"))
    assert (await view_of(fork.run_id)).forked_from == ForkView(run_id=source.run_id, task_id="writer")
    ended = await store.load(source.run_id)
    assert ended.status == RunStatus.COMPLETED
    await store.delete_run(Tombstone.of(ended, "pruned", clock.now()))
    link = (await view_of(fork.run_id)).forked_from
    assert link is not None and link.gone == "pruned"
    assert '"gone":"pruned"' in (await view_of(fork.run_id)).model_dump_json()

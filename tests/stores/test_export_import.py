"""Export and import across stores (issue 14, part 5): runs recorded by the real runtime on the
filesystem store, in every record format (1: plain; 2: routed, ``route_decided``; 3: a gate's
``revise``; 4: a budget; 5: a chain-level gate policy; 6: a remote run awaited; 7: a chain version
moved to; 8: an A2A agent's question answered at its gate), exported to JSON Lines and imported into
SQLite, PostgreSQL, memory and another filesystem store read back as the same run and the same
view. A tampered export is refused, also with its hashes recomputed when its head and facts disagree
(issue 22, finding 9); a live run is imported only when it is moved, and the store it left never
drives it again."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from pathlib import Path
from typing import cast

import pytest

from orchestration.chains import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.costs import Budget
from orchestration.core.models import RECORD_FORMAT
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.reading import read_snapshot
from orchestration.engine.runtime import Runtime
from orchestration.errors import (
    Conflict,
    ExportCorrupt,
    InvalidState,
    RecordTooNew,
    RunMoved,
    RunNotFound,
    RunPruned,
    StoreUnavailable,
    VersionConflict,
)
from orchestration.ops.export import RunExport, export_lines, read_export, snapshot
from orchestration.ops.retention import PRUNABLE, import_export, prune
from orchestration.store import RunStore
from server.views.run_view import run_view
from stores.filesystem import FilesystemStore
from tests.fakes.a2a_peer import ScriptedExecutor, serving
from tests.stores.conftest import make_filesystem, make_memory
from tests.stores.sql_adapters import make_postgres, make_sqlite
from tests.stores.test_a2a_agent_steps import catalog as a2a_catalog
from tests.stores.test_a2a_agent_steps import runtime as a2a_runtime
from tests.unit.faulty import FaultyStore
from tests.unit.helpers import Decision, ScriptedWorker, play, provider_contract, sequential_ids
from tests.unit.routed import ROUTED_CATALOG, answer_for
from tests.unit.server.test_agent_runs import FakeRemote, agent_worker, runtime_for

TARGETS: dict[str, Callable[[Path], AbstractAsyncContextManager[RunStore]]] = {
    "sqlite": make_sqlite,
    "postgres": make_postgres,
    "memory": make_memory,
    "filesystem": make_filesystem,
}


@pytest.fixture(params=list(TARGETS), ids=list(TARGETS))
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RunStore]:
    (tmp_path / "target").mkdir()
    async with TARGETS[request.param](tmp_path / "target") as opened:
        yield opened


@pytest.fixture
async def source(tmp_path: Path) -> AsyncIterator[FilesystemStore]:
    store = FilesystemStore(tmp_path / "source")
    yield store
    await store.close()


def runtime_on(store: RunStore, clock: ManualClock | None = None) -> Runtime:
    return Runtime(
        store,
        ROUTED_CATALOG,
        clock=clock or ManualClock(),
        new_id=sequential_ids(),
        resolve_contract=provider_contract,
        worker=ScriptedWorker(),
        settings=RuntimeSettings(lease_ttl_seconds=30),
    )


async def runs_of_every_format(store: RunStore) -> dict[str, str]:
    """Ended runs recorded by the runtime: name -> run id."""
    runtime = runtime_on(store)
    runs: dict[str, str] = {}
    head, _ = await runtime.start(StartRequest("Plain", idempotency_key="plain-key"))
    runs["plain"] = (await play(runtime, head.run_id)).run_id
    head, _ = await runtime.start(StartRequest("Routed", chain="loop-end"))
    answer = answer_for({"reviewer": "revise", "reviewer~2": "approve"})
    runs["routed"] = (await play(runtime, head.run_id, output=answer)).run_id
    head, _ = await runtime.start(StartRequest("Revised", chain="gated-revise"))
    once = {"after:engineer"}  # revised once, then approved

    def revise_once(gate: str) -> Decision:
        if gate in once:
            once.discard(gate)
            return "revise"
        return "approve"

    runs["revised"] = (await play(runtime, head.run_id, decisions=revise_once)).run_id
    head, _ = await runtime.start(StartRequest("Rejected", chain="gated-revise"))
    runs["rejected"] = (await play(runtime, head.run_id, decisions=lambda g: "reject")).run_id
    # format 4: a run with a budget (its running totals in the head)
    head, _ = await runtime.start(StartRequest("Budgeted", budget=Budget(max_total_tokens=1_000_000)))
    runs["budgeted"] = (await play(runtime, head.run_id)).run_id
    # and a provider run that spent tokens (the scripted worker's)
    budget = Budget(max_total_tokens=1_000)
    head, _ = await runtime.start(StartRequest("Spent", worker_backend="provider", budget=budget))
    runs["spent"] = (await play(runtime, head.run_id)).run_id
    # format 5: a chain whose gates the calling agent decides (a chain-level approvers policy)
    head, _ = await runtime.start(StartRequest("Autonomous", chain="agent-gated"))
    runs["agent"] = (await play(runtime, head.run_id, approver="agent")).run_id
    # format 6: a run whose agent step awaited its remote run (awaiting_agent)
    delegating = runtime_for(store, agent_worker(FakeRemote(polls=1)))
    delegating.new_id = runtime.new_id  # the same sequence of run ids
    head, _ = await delegating.start(StartRequest("Delegated", chain="delegated"))
    runs["delegated"] = (await play(delegating, head.run_id)).run_id
    # format 7: a run moved to another version of its chain (a step added) before it ran
    shipped = runtime.catalog
    runtime.catalog = movable(shipped, ["architect", "engineer"])
    head, _ = await runtime.start(StartRequest("Moved", chain="movable"))
    runtime.catalog = movable(shipped, ["architect", "engineer", "reviewer"])  # the config changed
    assert (await runtime.upgrade(head.run_id, dry_run=False)).moved
    runs["moved"] = (await play(runtime, head.run_id)).run_id
    runtime.catalog = shipped
    # format 8: a run whose A2A agent asked a question, answered at its gate
    with serving(ScriptedExecutor(work_seconds=0.05)) as url:
        asking, _, _ = a2a_runtime(store, url, catalog_=a2a_catalog("ask me"))
        asking.new_id = runtime.new_id
        head, _ = await asking.start(StartRequest("Asked", chain="delegated"))
        runs["asked"] = (await play(asking, head.run_id)).run_id
    return runs


def movable(catalog: Catalog, steps: list[str]) -> Catalog:
    """``catalog`` with a chain ``movable`` of ``steps`` whose runs move when asked."""
    return catalog.extended({"chains": {"movable": {"steps": steps, "upgrade": "manual"}}}, "t", Path("."))


async def exported(store: RunStore, run_id: str) -> list[str]:
    return export_lines(await snapshot(store, run_id), source=store.name, at=ManualClock().now())


async def view_of(store: RunStore, run_id: str) -> dict[str, object]:
    return run_view(await read_snapshot(store, await store.load(run_id)), "full").model_dump(mode="json")


async def test_runs_of_every_record_format_move_to_another_store_unchanged(
    source: FilesystemStore, target: RunStore
) -> None:
    runs = await runs_of_every_format(source)
    formats = set()
    for run_id in runs.values():
        head = await source.load(run_id)
        formats.add(head.format)
        run = read_export(await exported(source, run_id))
        await import_export(target, run, now=ManualClock().now())
        assert await target.load(run_id) == head
        assert await target.read_facts(run_id) == await source.read_facts(run_id)
        assert await view_of(target, run_id) == await view_of(source, run_id)
    assert formats == {1, 2, 3, 4, 5, 6, 7, 8} and RECORD_FORMAT == 8
    # The imported run's idempotency key is the run's in the target too.
    again, created = await runtime_on(target).start(StartRequest("Plain", idempotency_key="plain-key"))
    assert not created and again.run_id == runs["plain"]
    # The same export again: the target has the run.
    with pytest.raises(Conflict) as info:
        await import_export(
            target, read_export(await exported(source, runs["plain"])), now=ManualClock().now()
        )
    assert info.value.code == "conflict"


def facts_sha256(fact_lines: list[str]) -> str:
    return hashlib.sha256("".join(line + "\n" for line in fact_lines).encode()).hexdigest()


def tamper(lines: list[str], index: int, change: Callable[[dict[str, object]], None]) -> list[str]:
    record = json.loads(lines[index])
    change(record)
    return [*lines[:index], json.dumps(record), *lines[index + 1 :]]


async def test_a_tampered_export_is_refused_and_nothing_is_written(
    source: FilesystemStore, target: RunStore
) -> None:
    run_id = (await runs_of_every_format(source))["plain"]
    lines = await exported(source, run_id)
    output_line = next(i for i, line in enumerate(lines) if '"task_completed"' in line)
    damaged = {
        "an output changed": tamper(lines, output_line, lambda r: r.update(output="something else")),
        "the head changed": tamper(lines, 1, lambda r: r.update(status="failed")),
        "a fact dropped": lines[:-1],
        "a fact dropped and the hash fixed": tamper(
            lines[:-1], 0, lambda r: r.update(facts_sha256=facts_sha256(lines[2:-1]))
        ),
        "the header's run id changed": tamper(lines, 0, lambda r: r.update(run_id="run-other")),
        "not an export": ['{"hello": "world"}', *lines[1:]],
        "empty": [],
    }
    for why, text in damaged.items():
        with pytest.raises(ExportCorrupt) as info:
            await import_export(target, read_export(text, "run.jsonl"), now=ManualClock().now())
        assert info.value.code == "export_corrupt", why
        assert "run.jsonl" in info.value.message, why
    with pytest.raises(RunNotFound):
        await target.load(run_id)


def rehashed(lines: list[str]) -> list[str]:
    """``lines`` with the header made to match its head and facts again, as anyone can: the
    hashes recomputed, the run's status, version and last_seq taken from the head line."""
    header, head = json.loads(lines[0]), json.loads(lines[1])
    header.update(
        head_sha256=facts_sha256(lines[1:2]),
        facts_sha256=facts_sha256(lines[2:]),
        status=head["status"],
        head_version=head["version"],
        last_seq=head["last_seq"],
    )
    return [json.dumps(header), *lines[1:]]


async def refused(target: RunStore, lines: list[str], move_from: RunStore | None = None) -> str:
    """The ``export_corrupt`` message of importing ``lines`` into ``target`` (moved from
    ``move_from`` when given), after which ``target`` has nothing of the run."""
    run = read_export(lines)
    with pytest.raises(ExportCorrupt) as info:
        await import_export(target, run, now=ManualClock().now(), move_from=move_from)
    assert info.value.code == "export_corrupt"
    with pytest.raises(RunNotFound):
        await target.load(run.run_id)
    assert await target.tombstone(run.run_id) is None
    return info.value.message


async def test_an_edit_with_recomputed_hashes_is_refused_when_head_and_facts_disagree(
    source: FilesystemStore, target: RunStore
) -> None:
    runs = await runs_of_every_format(source)
    lines = await exported(source, runs["plain"])
    finished = len(lines) - 1
    assert json.loads(lines[finished])["type"] == "run_finished"
    output = next(i for i, line in enumerate(lines) if '"task_completed"' in line)
    edits = {
        "the head says failed": (tamper(lines, 1, lambda r: r.update(status="failed")), "status"),
        "the run's end says failed": (
            tamper(lines, finished, lambda r: r.update(status="failed")),
            'status is "completed" in the head, "failed" by its facts',
        ),
        "a task's status": (
            tamper(lines, 1, lambda r: cast(list[dict[str, str]], r["tasks"])[1].update(status="skipped")),
            'tasks[1].status is "skipped"',
        ),
        "more writes than facts": (tamper(lines, 1, lambda r: r.update(version=len(lines))), "version"),
        "an output": (tamper(lines, output, lambda r: r.update(output="edited")), "output_sha256"),
    }
    for why, (edited, differs) in edits.items():
        message = await refused(target, rehashed(edited))
        assert "match" in message or "version" in message, why
        assert differs in message, (why, message)
    # An edit that blanks what the facts say (a budgeted run's spend, as a head written before
    # spend was kept holds it) imports what the facts say: the budget is not reset.
    spent = await source.load(runs["spent"])
    assert spent.spent is not None and spent.spent.run.total_tokens > 0
    blank = tamper(await exported(source, spent.run_id), 1, lambda r: r.update(spent=None))
    await import_export(target, read_export(rehashed(blank)), now=ManualClock().now())
    assert await target.load(spent.run_id) == spent


async def test_a_duplicated_last_fact_is_refused_not_imported_as_a_corrupt_record(
    source: FilesystemStore, target: RunStore
) -> None:
    run_id = (await runs_of_every_format(source))["plain"]
    lines = await exported(source, run_id)
    # The run's last fact again, numbered as the next one, and the head's last_seq with it.
    again, head = json.loads(lines[-1]), json.loads(lines[1])
    again["seq"] += 1
    head["last_seq"] += 1
    duplicated = [lines[0], json.dumps(head), *lines[2:], json.dumps(again)]
    message = await refused(target, rehashed(duplicated))
    assert "its facts do not make a run" in message and "after a terminal fact" in message


async def test_a_live_run_relabelled_completed_is_refused_moved_or_not(
    source: FilesystemStore, target: RunStore
) -> None:
    _runtime, run_id = await live_run(source)
    lines = await exported(source, run_id)
    at = json.loads(lines[1])["updated_at"]
    relabelled = rehashed(tamper(lines, 1, lambda r: r.update(status="completed", finished_at=at)))
    message = await refused(target, relabelled)
    assert 'status is "completed" in the head, "awaiting_host" by its facts' in message
    # Moved, it is refused before the source lets go: the source still has it and drives it.
    await refused(target, relabelled, move_from=source)
    assert await source.tombstone(run_id) is None
    assert (await source.load(run_id)).status == RunStatus.AWAITING_HOST


async def test_an_export_of_a_newer_record_format_is_record_too_new(source: FilesystemStore) -> None:
    run_id = (await runs_of_every_format(source))["plain"]
    lines = await exported(source, run_id)
    newer = tamper(lines, 2, lambda r: r.update(format=RECORD_FORMAT + 1))
    header = json.loads(newer[0])
    header["facts_sha256"] = facts_sha256(newer[2:])
    with pytest.raises(RecordTooNew):
        read_export([json.dumps(header), *newer[1:]])


async def live_run(store: RunStore) -> tuple[Runtime, str]:
    runtime = runtime_on(store)
    head, _ = await runtime.start(StartRequest("Live", chain="gated-revise", idempotency_key="live-key"))
    await runtime.drive(head.run_id)
    assert (await store.load(head.run_id)).status == RunStatus.AWAITING_HOST
    return runtime, head.run_id


async def test_a_live_run_is_imported_only_when_moved_and_the_source_stops_driving_it(
    source: FilesystemStore, target: RunStore
) -> None:
    runtime, run_id = await live_run(source)
    run = read_export(await exported(source, run_id))
    with pytest.raises(InvalidState, match="has not ended"):
        await import_export(target, run, now=ManualClock().now())
    with pytest.raises(RunNotFound):
        await target.load(run_id)

    await import_export(target, run, now=ManualClock().now(), move_from=source, target_name="the target")
    assert await target.load(run_id) == run.head
    # The source: marked moved (its tombstone), never listed as runnable, and nothing drives or
    # changes it: the drive, a host's answer and a cancel all say where it went.
    tombstone = await source.tombstone(run_id)
    assert tombstone is not None and tombstone.reason == "moved" and tombstone.moved_to == "the target"
    assert await source.runnable(ManualClock().now() + timedelta(days=1)) == []
    with pytest.raises(RunMoved, match="the target"):
        await runtime.drive(run_id)
    with pytest.raises(RunMoved):
        await runtime.submit_host_output(run_id, "architect", "an answer")
    with pytest.raises(RunMoved):
        await runtime.cancel(run_id)
    with pytest.raises(RunMoved):
        await runtime.start(StartRequest("Live", chain="gated-revise", idempotency_key="live-key"))
    # The target goes on with it to the end.
    finished = await play(runtime_on(target), run_id)
    assert finished.status == RunStatus.COMPLETED


async def test_a_move_of_a_run_that_changed_since_its_export_is_refused(
    source: FilesystemStore, target: RunStore
) -> None:
    runtime, run_id = await live_run(source)
    run = read_export(await exported(source, run_id))
    await runtime.submit_host_output(run_id, "architect", "the plan")
    with pytest.raises(VersionConflict):
        await import_export(target, run, now=ManualClock().now(), move_from=source)
    with pytest.raises(RunNotFound):
        await target.load(run_id)
    assert (await source.load(run_id)).version == run.head.version + 1


async def test_a_move_interrupted_before_the_import_is_finished_by_the_same_import(
    source: FilesystemStore, target: RunStore
) -> None:
    _runtime, run_id = await live_run(source)
    run = read_export(await exported(source, run_id))
    down = FaultyStore(target)
    down.before = lambda op: setattr(down, "down", op == "import_run")
    with pytest.raises(StoreUnavailable):
        await import_export(down, run, now=ManualClock().now(), move_from=source)
    with pytest.raises(RunMoved):
        await source.load(run_id)
    # The export file is the run now; importing it again finishes the move.
    await import_export(target, run, now=ManualClock().now(), move_from=source)
    assert await target.load(run_id) == run.head


async def test_a_retried_start_with_a_pruned_runs_key_is_refused(source: FilesystemStore) -> None:
    # Store-independent (the conformance suite checks every store's key), through the runtime.
    clock = ManualClock()
    runtime = runtime_on(source, clock)
    head, _ = await runtime.start(StartRequest("Nightly", idempotency_key="nightly-2026-01-01"))
    await play(runtime, head.run_id)
    clock.advance(timedelta(days=31).total_seconds())
    result = await prune(source, frozenset({RunStatus.COMPLETED}), timedelta(days=30), now=clock.now())
    assert result.pruned == (head.run_id,)
    with pytest.raises(RunPruned) as info:
        await runtime.start(StartRequest("Nightly", idempotency_key="nightly-2026-01-01"))
    assert info.value.code == "run_pruned" and head.run_id in info.value.message
    with pytest.raises(RunPruned):
        await runtime.status(head.run_id)
    assert (await source.list_runs()).runs == []


async def test_a_prune_with_an_archive_can_be_restored(source: FilesystemStore, target: RunStore) -> None:
    runs = await runs_of_every_format(source)
    archived: dict[str, RunExport] = {}

    async def archive(run: RunExport) -> str:
        archived[run.run_id] = read_export(export_lines(run, source="filesystem", at=ManualClock().now()))
        return f"/archive/{run.run_id}.jsonl"

    now = ManualClock().now() + timedelta(days=40)
    result = await prune(source, PRUNABLE, timedelta(days=30), now=now, archive=archive)
    assert sorted(result.pruned) == sorted(runs.values()) == sorted(archived)
    tombstone = await source.tombstone(runs["routed"])
    assert tombstone is not None and tombstone.archive == f"/archive/{runs['routed']}.jsonl"
    for run_id, run in archived.items():
        await import_export(target, run, now=now)  # an archive restores in any store
        assert await target.read_facts(run_id) == list(run.facts)
        await import_export(source, run, now=now)  # and back where it was pruned from
        assert await source.tombstone(run_id) is None
        assert await source.load(run_id) == run.head

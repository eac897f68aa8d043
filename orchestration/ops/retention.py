"""Moving runs between stores and deleting ended ones: the use cases behind ``runs import`` and
``runs prune`` (the store side: ``import_run``, ``delete_run`` and tombstones in
:mod:`orchestration.store`).

A live run is never held by two stores: a move first deletes it from the source behind a ``moved``
tombstone, compare-and-swapped on the exported head's version, then imports it, and the same
import repeated finishes a move a crash interrupted. A prune deletes a run only if it has ended and
its head is still the one read, judged by the store in the step that deletes it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from orchestration.chains.catalog import carried
from orchestration.core.vocabulary import RunStatus
from orchestration.errors import Conflict, ConstructError, InvalidArgument, InvalidState, RunNotFound
from orchestration.ops.export import RunExport, derive, snapshot
from orchestration.store import ChainVersion, KeepsChainVersions, RunStore, Tombstone

log = logging.getLogger(__name__)

#: What ``runs prune`` may delete: ended runs only.
PRUNABLE = frozenset(s for s in RunStatus if s.is_terminal)
#: Runs read per page while looking for runs to prune.
_PAGE = 200


async def import_export(
    target: RunStore,
    run: RunExport,
    *,
    now: datetime,
    move_from: RunStore | None = None,
    target_name: str | None = None,
    where: str = "the export",
) -> RunExport:
    """Import ``run`` into ``target``; with ``move_from``, move it out of that store first (see the
    module docstring). Returns the run as ``target`` now holds it. Raises ``ExportCorrupt`` (naming
    ``where``) for a run whose facts do not make the head it states, ``InvalidState`` for a run
    that has not ended without ``move_from``, ``Conflict`` when ``target`` has the run id already,
    ``VersionConflict`` when the source moved on since the export. Nothing is written when it
    raises before the move (a move's source lets go first: see the module docstring)."""
    run = derive(run, where)
    head = run.head
    if move_from is None and not head.status.is_terminal:
        raise InvalidState(
            f"run {head.run_id} has not ended ({head.status.value}): imported as it is, it would be "
            "live in two stores. Move it (runs import --move --from SOURCE: the source stops "
            "driving it), or import it once it has ended"
        )
    try:
        held = await target.load(head.run_id)
    except RunNotFound:
        held = None
    if held is not None:
        raise Conflict(
            f"this store already has run {head.run_id} ({held.status.value}, version {held.version}); "
            "nothing was imported"
        )
    if move_from is not None:
        tombstone = Tombstone.of(head, "moved", now, moved_to=target_name or target.name)
        await move_from.delete_run(tombstone)
        log.info(
            "run moved out of the source",
            extra={"action": "run_moved_out", "run_id": head.run_id, "store": move_from.name},
        )
    stored = await target.import_run(head, run.facts)
    log.info("run imported", extra={"action": "run_imported", "run_id": head.run_id, "store": target.name})
    return RunExport(stored, run.facts)


#: Writes a run's export somewhere durable and says where (a file path), before a prune deletes it.
Archive = Callable[[RunExport], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What a prune did (or, dry, would do): the runs deleted, their archives, and the runs it
    left because they changed or could not be deleted (run id -> error code and message)."""

    pruned: tuple[str, ...] = ()
    archives: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    dry_run: bool = False
    #: how many chain versions no run holds any more were removed with them
    versions_removed: int = 0


def parse_statuses(names: str) -> frozenset[RunStatus]:
    """``completed,failed`` as statuses; only ended statuses can be pruned (``InvalidArgument``)."""
    out: set[RunStatus] = set()
    for name in (part.strip() for part in names.split(",")):
        try:
            status = RunStatus(name)
        except ValueError:
            status = None
        if status not in PRUNABLE:
            allowed = ", ".join(sorted(s.value for s in PRUNABLE))
            raise InvalidArgument(
                f"cannot prune runs in status {name[:40]!r}: the ended statuses are {allowed}"
            )
        assert status is not None
        out.add(status)
    return frozenset(out)


async def prune(
    store: RunStore,
    statuses: frozenset[RunStatus],
    older_than: timedelta,
    *,
    now: datetime,
    dry_run: bool = False,
    archive: Archive | None = None,
    current: Sequence[str] = (),
) -> PruneResult:
    """Delete the runs of ``statuses`` (ended ones only) that ended more than ``older_than`` before
    ``now``, each after ``archive`` (when given) wrote its export; ``dry_run`` deletes nothing and
    lists what would be. A run that moved on or went away meanwhile is skipped, never forced. Then,
    on a store that keeps chain versions, the versions no run holds any more are removed, but for
    the configuration's ``current`` ones (their hashes) and each name's newest."""
    if not statuses <= PRUNABLE:
        raise InvalidArgument("only runs that have ended can be pruned")
    cutoff = now - older_than
    pruned: list[str] = []
    archives: dict[str, str] = {}
    skipped: dict[str, str] = {}
    candidates = []
    cursor: str | None = None
    while True:
        page = await store.list_runs(statuses, _PAGE, cursor)
        candidates += [h for h in page.runs if (h.finished_at or h.updated_at) < cutoff]
        cursor = page.next_cursor
        if cursor is None:
            break
    for head in candidates:
        if dry_run:
            pruned.append(head.run_id)
            continue
        try:
            where = None
            if archive is not None:
                run = await snapshot(store, head.run_id)
                head = run.head
                where = await archive(run)
                archives[head.run_id] = where
            await store.delete_run(Tombstone.of(head, "pruned", now, archive=where))
        except ConstructError as exc:
            skipped[head.run_id] = f"{exc.code}: {exc.message}"
            continue
        pruned.append(head.run_id)
        log.info("run pruned", extra={"action": "run_pruned", "run_id": head.run_id})
    removed = 0
    if not dry_run and isinstance(store, KeepsChainVersions):
        removed = await store.forget_chain_versions([*current, *await versions_held(store)])
    return PruneResult(tuple(pruned), archives, skipped, dry_run, removed)


async def versions_held(store: RunStore) -> set[str]:
    """The hashes of the kept chain versions some run in ``store`` is on: a run holds its version
    with its start-time options applied (a gate asked for at start), so its own hash may differ
    from its version's; each is matched as :class:`~orchestration.engine.ChainVersions` does."""
    if not isinstance(store, KeepsChainVersions):
        return set()
    versions: dict[str, list[ChainVersion]] = {}
    held: dict[str, str | None] = {}  # a run's chain hash -> its version's
    cursor: str | None = None
    while True:
        page = await store.list_runs(None, _PAGE, cursor)
        for head in page.runs:
            if head.chain_hash in held:
                continue
            name = head.chain.name
            if name not in versions:
                versions[name] = await store.chain_versions(name)
            held[head.chain_hash] = next(
                (
                    v.chain_hash
                    for v in versions[name]
                    if carried(head.chain, v.chain).content_hash() == head.chain_hash
                ),
                None,
            )
        cursor = page.next_cursor
        if cursor is None:
            return {h for h in held.values() if h is not None}

"""Checks and encodings every adapter shares for retention: importing a whole run and deleting one
behind a tombstone (:meth:`orchestration.store.RunStore.delete_run`)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestration.core import Fact, RunCreated, RunHead
from orchestration.errors import CorruptRecord, InvalidArgument, InvalidState, VersionConflict
from orchestration.store import Tombstone
from stores._common import check_format


def check_import(head: RunHead, facts: Sequence[Fact]) -> None:
    """Reject an import that is not a whole run before anything is written: its log starts with
    the run's ``run_created`` at seq 1, is consecutive and ends at ``head.last_seq``."""
    if not facts:
        raise InvalidArgument(f"run {head.run_id}: an import needs the run's facts, and it has none")
    first = facts[0]
    if not isinstance(first, RunCreated) or first.seq != 1 or first.run_id != head.run_id:
        raise InvalidArgument(f"run {head.run_id}: an imported log starts with its run_created fact, seq 1")
    for offset, fact in enumerate(facts):
        if fact.seq != offset + 1:
            raise InvalidArgument(f"run {head.run_id}: the imported facts must be numbered 1, 2, 3, ...")
        check_format(head.run_id, f"fact {fact.seq}", fact.format)
    if head.last_seq != facts[-1].seq:
        raise InvalidArgument(
            f"run {head.run_id}: the head's last_seq is {head.last_seq}, the log ends at {facts[-1].seq}"
        )
    if head.version < 1:
        raise InvalidArgument(f"run {head.run_id}: a head's version is at least 1")
    check_format(head.run_id, "head", head.format)


def check_delete(head: RunHead, tombstone: Tombstone) -> None:
    """The condition of ``RunStore.delete_run``, judged on the stored ``head`` under the store's
    lock or in its transaction: the version the deleter read, and an ended run for a prune."""
    if head.version != tombstone.version:
        raise VersionConflict(head.run_id, tombstone.version, head.version)
    if tombstone.reason == "pruned" and not head.status.is_terminal:
        raise InvalidState(
            f"run {head.run_id} is {head.status.value}: only a run that has ended can be pruned"
        )


def deleted_already(stored: Tombstone, tombstone: Tombstone) -> None:
    """A ``delete_run`` of a run already deleted: nothing to do when it was deleted the same way
    (a retried move or prune), else the stored tombstone's error."""
    if stored.reason == tombstone.reason and stored.version == tombstone.version:
        return
    raise stored.error()


def encode_tombstone(tombstone: Tombstone) -> str:
    return tombstone.model_dump_json()


def decode_tombstone(run_id: str, data: str | bytes) -> Tombstone:
    """A stored tombstone read back (``CorruptRecord`` when it cannot be)."""
    try:
        tombstone = Tombstone.model_validate_json(data)
    except ValueError as exc:
        raise CorruptRecord(run_id, "tombstone", f"{type(exc).__name__}") from exc
    if tombstone.run_id != run_id:
        raise CorruptRecord(run_id, "tombstone", f"it is run {tombstone.run_id}'s")
    return tombstone

"""The rows of the SQLite store: how a run's head and facts become the named parameters of
``stores/sql/sqlite/queries.sql``. Times are sortable text, bodies JSON text; the chain snapshot is
written once, by the create or the import, never by an append.
"""

from __future__ import annotations

from typing import Any

from orchestration.core import Fact, RunHead
from stores._common import encode_chain, encode_head, sortable_time

__all__ = ["fact_row", "head_row", "run_row"]


def run_row(head: RunHead) -> dict[str, Any]:
    """A new run's row (a create, an import)."""
    return head_row(head) | {
        "created_at": sortable_time(head.created_at),
        "idempotency_key": head.idempotency_key,
        # The chain snapshot is written once, in a column of its own, by the create (migration
        # chain_written_once); an append's update leaves it as it is.
        "chain": encode_chain(head.chain),
    }


def head_row(head: RunHead) -> dict[str, Any]:
    """What an append's update writes: the columns that change with the head."""
    return {
        "run_id": head.run_id,
        "version": head.version,
        "status": head.status.value,
        "updated_at": sortable_time(head.updated_at),
        "not_before": sortable_time(head.not_before) if head.not_before is not None else None,
        "head": encode_head(head, with_chain=False),
        # NULL for a terminal run, whatever its head says: a terminal run never wakes, and the
        # partial index runs_wake_at then holds only the runs that can.
        "wake_at": (
            sortable_time(head.wake_at) if head.wake_at is not None and not head.status.is_terminal else None
        ),
    }


def fact_row(run_id: str, fact: Fact) -> dict[str, Any]:
    """One fact's row."""
    return {"run_id": run_id, "seq": fact.seq, "type": fact.type, "body": fact.model_dump_json()}

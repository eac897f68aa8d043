"""The rows of the PostgreSQL store: how a run's head and facts become the parameters of
``stores/sql/postgres/queries.sql``. Times are aware UTC datetimes; heads and fact bodies are JSON
text with U+0000 escaped (not JSONB: no query reads into them, and parsing them at every append cost
server time); the chain snapshot is written once, by the create or the import, never by an append.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from orchestration.core import Fact, RunHead
from stores._common import encode_chain, encode_head
from stores._jsonb import to_jsonb_text

__all__ = ["fact_columns", "fact_values", "head_values", "run_values", "utc", "wake_at"]


def utc(at: datetime) -> datetime:
    """``at`` in UTC: the same reading of a naive time as ``stores._common.sortable_time`` (local
    time), so that every adapter orders and compares times alike."""
    return at.astimezone(UTC)


def run_values(head: RunHead) -> tuple[Any, ...]:
    """The parameters of ``insert_run``: a new run's row (a create, an import)."""
    return (
        head.run_id,
        head.version,
        head.status.value,
        utc(head.created_at),
        utc(head.updated_at),
        utc(head.not_before) if head.not_before is not None else None,
        head.idempotency_key,
        # The chain snapshot is written once, in a column of its own (migration chain_written_once).
        to_jsonb_text(encode_head(head, with_chain=False)),
        wake_at(head),
        to_jsonb_text(encode_chain(head.chain)),
    )


def head_values(head: RunHead) -> tuple[Any, ...]:
    """What an append's update writes, in the order of the ``append`` query's parameters: version,
    status, ``updated_at``, ``not_before``, the head without its chain, ``wake_at``."""
    return (
        head.version,
        head.status.value,
        utc(head.updated_at),
        utc(head.not_before) if head.not_before is not None else None,
        to_jsonb_text(encode_head(head, with_chain=False)),
        wake_at(head),
    )


def wake_at(head: RunHead) -> datetime | None:
    """The ``wake_at`` column: NULL for a terminal run, whatever its head says. A terminal run never
    wakes, and the partial index runs_wake_at then holds only the runs that can."""
    if head.status.is_terminal or head.wake_at is None:
        return None
    return utc(head.wake_at)


def fact_values(run_id: str, facts: Sequence[Fact]) -> tuple[Any, ...]:
    """The parameters of ``insert_facts``: the run id, then :func:`fact_columns`."""
    return (run_id, *fact_columns(facts))


def fact_columns(facts: Sequence[Fact]) -> tuple[Any, ...]:
    """The facts as three arrays (``unnest``-ed by the query): their seqs, types and bodies."""
    return (
        [f.seq for f in facts],
        [f.type for f in facts],
        [to_jsonb_text(f.model_dump_json()) for f in facts],
    )

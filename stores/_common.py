"""Helpers every adapter shares: argument checks for appends, the head's stored form and the list
cursor codec."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import UTC, datetime

from orchestration.errors import InvalidArgument, quoted
from orchestration.facts import Fact
from orchestration.models import RunHead

ListKey = tuple[str, str]


def encode_head(head: RunHead) -> str:
    """The head as stored: JSON without the fields that hold their default (a pending task is its
    id and specialist), read back by ``RunHead.model_validate_json``. A store rewrites the head at
    every append, so its size is the main cost of a write; this keeps it about a quarter of the full
    dump. Fields keep their declared order (``run_id``, ``version``, ``last_seq`` first)."""
    return head.model_dump_json(exclude_defaults=True)


def _check_consecutive(facts: Sequence[Fact]) -> None:
    # read_fact finds a fact by its seq, so seqs must be gap-free; the fold guarantees this for
    # honest writers, the check keeps a buggy one from corrupting the log.
    for offset, fact in enumerate(facts):
        if fact.seq != facts[0].seq + offset:
            raise InvalidArgument("the facts of one write must have consecutive seq numbers")


def check_create(head: RunHead, facts: Sequence[Fact]) -> None:
    """Reject a malformed create before anything is written."""
    if not facts:
        raise InvalidArgument("a run is created with at least one fact")
    if head.version != 1:
        raise InvalidArgument(f"a new run's head has version 1, not {head.version}")
    if facts[0].seq != 1:
        raise InvalidArgument(f"a new run's first fact has seq 1, not {facts[0].seq}")
    _check_consecutive(facts)
    if head.last_seq != facts[-1].seq:
        raise InvalidArgument("the new head's last_seq must be the seq of the last fact")


def check_append(run_id: str, expected_version: int, facts: Sequence[Fact], head: RunHead) -> None:
    """Reject a malformed append before anything is written. (Whether the first fact continues
    the stored log is checked by each store, under its compare-and-swap: see :func:`not_continuing`.)"""
    if not facts:
        raise InvalidArgument("an append needs at least one fact")
    if head.run_id != run_id:
        raise InvalidArgument(f"head is for run {head.run_id}, not {run_id}")
    if head.version != expected_version + 1:
        raise InvalidArgument(f"the new head's version must be {expected_version + 1}, not {head.version}")
    _check_consecutive(facts)
    if head.last_seq != facts[-1].seq:
        raise InvalidArgument("the new head's last_seq must be the seq of the last fact appended")


def not_continuing(run_id: str, first_seq: int, last_seq: int | None = None) -> InvalidArgument:
    """The error for an append whose first fact does not follow the stored log's last one."""
    expected = (
        f" must have seq {last_seq + 1}, not {first_seq}"
        if last_seq is not None
        else (f" has seq {first_seq}, but the log has no fact {first_seq - 1}")
    )
    return InvalidArgument(f"the first fact appended to run {run_id}{expected}")


def sortable_time(at: datetime) -> str:
    """A fixed-width UTC timestamp whose string order is its time order."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def list_order_key(head: RunHead) -> ListKey:
    """Runs are listed newest first by (created_at, run_id)."""
    return (sortable_time(head.created_at), head.run_id)


def encode_cursor_key(key: ListKey) -> str:
    """The opaque cursor for a list position (``created_at`` sortable key, run id)."""
    raw = json.dumps(list(key)).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def encode_cursor(head: RunHead) -> str:
    return encode_cursor_key(list_order_key(head))


#: The longest cursor a store reads. The cursors it gives out are about 150 characters; a longer
#: one was not given out, and is refused before it is decoded.
MAX_CURSOR_CHARS = 400


def decode_cursor(cursor: str | None) -> ListKey | None:
    """The (created_at iso, run_id) position a cursor stands for. A cursor this server did not give
    out — too long, not base64, not JSON, nested too deep for the parser, not two strings — is
    always ``InvalidArgument``, never another exception."""
    if cursor is None or cursor == "":
        return None
    try:
        if len(cursor) > MAX_CURSOR_CHARS:
            raise ValueError("cursor too long")
        padded = cursor + "=" * (-len(cursor) % 4)
        decoded = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(decoded, list) or len(decoded) != 2:
            raise ValueError("cursor shape")
        created, run_id = decoded
        if not isinstance(created, str) or not isinstance(run_id, str):
            raise ValueError("cursor fields")
        return (created, run_id)
    except (ValueError, TypeError, RecursionError) as exc:
        raise InvalidArgument(
            f"cursor {quoted(cursor, 60)} is not a cursor this server gave out; "
            "omit it to start from the newest run"
        ) from exc

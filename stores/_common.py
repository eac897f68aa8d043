"""Helpers every adapter shares: argument checks for appends, the head's stored form and the list
cursor codec."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import UTC, datetime

from orchestration.errors import InvalidArgument
from orchestration.facts import Fact
from orchestration.models import RunHead

ListKey = tuple[str, str]


def encode_head(head: RunHead) -> str:
    """The head as stored: JSON without the fields that hold their default (a pending task is its
    id and specialist), read back by ``RunHead.model_validate_json``. A store rewrites the head at
    every append, so its size is the main cost of a write; this keeps it about a quarter of the full
    dump. Fields keep their declared order (``run_id``, ``version``, ``last_seq`` first)."""
    return head.model_dump_json(exclude_defaults=True)


def check_append(run_id: str, expected_version: int, facts: Sequence[Fact], head: RunHead) -> None:
    """Reject a malformed append before anything is written."""
    if not facts:
        raise InvalidArgument("an append needs at least one fact")
    if head.run_id != run_id:
        raise InvalidArgument(f"head is for run {head.run_id}, not {run_id}")
    if head.version != expected_version + 1:
        raise InvalidArgument(f"the new head's version must be {expected_version + 1}, not {head.version}")
    if head.last_seq != facts[-1].seq:
        raise InvalidArgument("the new head's last_seq must be the seq of the last fact appended")


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


def decode_cursor(cursor: str | None) -> ListKey | None:
    """The (created_at iso, run_id) position a cursor stands for; ``InvalidArgument`` if unreadable."""
    if cursor is None or cursor == "":
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, run_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(created, str) or not isinstance(run_id, str):
            raise ValueError("cursor fields")
        return (created, run_id)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(
            f"cursor {cursor[:60]!r} is not a cursor this server gave out; "
            "omit it to start from the newest run"
        ) from exc

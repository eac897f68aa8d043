"""Helpers every adapter shares: argument checks for appends, the stored form of heads and facts
(and how it is read back: "Record formats" in :mod:`orchestration.core.facts`) and the list cursor
codec."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from orchestration.core import (
    FACT_TYPES,
    RECORD_FORMAT,
    ChainSnapshot,
    ChainUpgraded,
    Fact,
    RunHead,
    RunStatus,
    TaskState,
    by_identity,
    parse_fact,
    parse_head,
    validate_run_id,
)
from orchestration.errors import CorruptRecord, InvalidArgument, RecordTooNew, quoted
from orchestration.store import Lease
from stores._lease import check_fence

ListKey = tuple[str, str]

_DEFAULT_FORMAT = RunHead.model_fields["format"].default
_ENCODED_APART = {"chain", "tasks"}


@by_identity
def _chain_json(chain: ChainSnapshot) -> str:
    """A chain snapshot as a head stores it, once per snapshot (see :mod:`orchestration.core.memo`)."""
    return chain.model_dump_json(exclude_defaults=True)


@by_identity
def _task_json(task: TaskState) -> str:
    """A task as a head stores it, once per task object (unchanged tasks are shared by heads)."""
    return task.model_dump_json(exclude_defaults=True)


#: Per run, the tasks of the head it last encoded and their texts (strong references: an ``is``
#: below can never meet a reused id), so that the next head's encoding compares its tasks with those
#: by identity, 50 ``is`` tests instead of 50 cache look-ups, and encodes only the tasks that changed.
#: In the order the runs were last encoded: past the limit the run encoded longest ago is dropped
#: (a server with more live runs than the limit keeps the ones at work), and a run whose head has
#: ended is dropped at once (nothing is appended after its last head).
_LAST_TASKS: dict[str, tuple[tuple[TaskState, ...], list[str]]] = {}
#: runs remembered at most
LAST_TASKS_LIMIT = 1024


def _tasks_json(run_id: str, tasks: tuple[TaskState, ...], ended: bool = False) -> str:
    """The head's tasks as stored (their JSON texts, comma-separated), ``_task_json`` of each.
    ``ended``: the head is the run's last (its entry is dropped: see :data:`_LAST_TASKS`)."""
    last = _LAST_TASKS.pop(run_id, None)  # put back last: the order is that of the last encoding
    if last is not None and len(last[0]) == len(tasks):
        texts = [
            text if task is before else _task_json(task)
            for task, before, text in zip(tasks, last[0], last[1], strict=True)
        ]
    else:
        texts = [_task_json(task) for task in tasks]
    if not ended:
        while len(_LAST_TASKS) >= LAST_TASKS_LIMIT:
            del _LAST_TASKS[next(iter(_LAST_TASKS))]
        _LAST_TASKS[run_id] = (tasks, texts)
    return ",".join(texts)


def moved_chain(facts: Sequence[Fact]) -> str | None:
    """The chain an append's ``chain_upgraded`` fact moves the run to, encoded as
    :func:`encode_chain` (a store that keeps the chain apart from the head writes it with that
    append); None for an append that moves nothing."""
    moved = [f.chain for f in facts if isinstance(f, ChainUpgraded)]
    return encode_chain(moved[-1]) if moved else None


def encode_chain(chain: ChainSnapshot) -> str:
    """A chain snapshot as a stored head holds it (for a store that writes it once, apart from the
    head: see :func:`encode_head`). Not remembered (unlike :func:`_chain_json`): it is written
    once per run, and the text would stay for as long as the run's chain snapshot lives — with
    the UTF-8 copy the database driver's encoding leaves in it, about 28 KB per live run for the
    built-in chain (memory per live run)."""
    return chain.model_dump_json(exclude_defaults=True)


def encode_head(head: RunHead, *, with_chain: bool = True) -> str:
    """The head as stored: JSON without the fields that hold their default (a pending task is its
    id and specialist), read back by :func:`decode_stored_head`. A store rewrites the head at every
    append, so its size is the main cost of a write; this keeps it about a quarter of the full
    dump. Fields keep their declared order (``run_id``, ``version``, ``last_seq`` first), and
    ``format``, declared last, is always written.

    ``with_chain=False``: without the chain snapshot, which never changes after the run's creation
    (no fact changes it), for a store that writes it once (:func:`encode_chain`) and puts it back
    into the head it reads."""
    # The same text as ``head.model_dump_json(exclude_defaults=True)``, but the chain snapshot
    # (most of the head: steps and personas) and each task are encoded once per object — a head's
    # copy shares them with the head it came from — and put back in their places: before the keys
    # that follow them, ``chain_hash`` and ``gates``, required both. A string value cannot hold the
    # sequence ``,"gates":`` (its quotes are escaped), and no object before ``gates`` has a field
    # of that name.
    rest = head.model_dump_json(exclude_defaults=True, exclude=_ENCODED_APART)
    chain_at = rest.index(',"chain_hash":')
    tasks_at = rest.index(',"gates":', chain_at)
    tasks = _tasks_json(head.run_id, head.tasks, head.status.is_terminal)
    chain = f',"chain":{_chain_json(head.chain)}' if with_chain else ""
    data = f'{rest[:chain_at]}{chain}{rest[chain_at:tasks_at]},"tasks":[{tasks}]{rest[tasks_at:]}'

    if head.format == _DEFAULT_FORMAT:
        # Left out as a default; every stored head states its format all the same. The dump is a
        # JSON object with required fields, so the key goes before its closing brace.
        data = f'{data[:-1]},"format":{head.format}}}'
    return data


Problem = Callable[[Exception], str]


def check_format(run_id: str, where: str, record_format: int) -> None:
    """Raise ``RecordTooNew`` for a record (``where`` in run ``run_id``) that states a format newer
    than :data:`~orchestration.core.models.RECORD_FORMAT`."""
    if record_format > RECORD_FORMAT:
        raise RecordTooNew(run_id, where, record_format, RECORD_FORMAT)


def decode_stored_head(run_id: str, where: str, data: str | bytes, problem: Problem) -> RunHead:
    """A stored head read back. Raises ``RecordTooNew`` when a newer format wrote it,
    ``CorruptRecord`` (``problem`` describes the decoding error) when it cannot be read."""
    try:
        head = parse_head(data)
    except ValueError as exc:  # ValidationError; UnicodeDecodeError on binary garbage
        raise _too_new(run_id, where, data, fact=False) or CorruptRecord(run_id, where, problem(exc)) from exc
    check_format(run_id, where, head.format)
    return head


def decode_stored_fact(run_id: str, where: str, data: str | bytes, problem: Problem) -> Fact:
    """A stored fact read back. Raises ``RecordTooNew`` when a newer format wrote it or its type is
    unknown, ``CorruptRecord`` (``problem`` describes the decoding error) when it cannot be read.
    The caller checks that its ``seq`` is the one it asked for."""
    try:
        fact = parse_fact(data)
    except ValueError as exc:
        raise _too_new(run_id, where, data, fact=True) or CorruptRecord(run_id, where, problem(exc)) from exc
    check_format(run_id, where, fact.format)
    return fact


def _too_new(run_id: str, where: str, data: str | bytes, *, fact: bool) -> RecordTooNew | None:
    """Why a record that did not decode did not: it states a newer format, or it is a fact of a type
    this code does not know (``RecordTooNew``); otherwise it is damaged (None)."""
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    stated = record.get("format", 1)
    if type(stated) is not int or stated < 1:
        return None
    if stated > RECORD_FORMAT:
        return RecordTooNew(run_id, where, stated, RECORD_FORMAT)
    kind = record.get("type")
    if fact and isinstance(kind, str) and kind not in FACT_TYPES:
        return RecordTooNew(run_id, where, stated, RECORD_FORMAT, fact_type=kind)
    return None


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


def check_append(
    run_id: str, expected_version: int, facts: Sequence[Fact], head: RunHead, lease: Lease | None = None
) -> None:
    """Reject a malformed append before anything is read or written: a malformed run id, no facts,
    a head that does not follow, a lease for another run. (Whether the first fact continues the
    stored log is checked by each store, under its compare-and-swap: see :func:`not_continuing`.)"""
    validate_run_id(run_id)
    check_fence(run_id, lease)
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


def is_runnable(head: RunHead, now: datetime) -> bool:
    """Whether ``runnable`` lists the run (see ``RunStore.runnable``), for stores that filter heads
    in Python."""
    if head.status == RunStatus.RUNNING:
        return True  # possibly orphaned: the dispatcher finds out by claiming the lease
    if head.status == RunStatus.QUEUED and (head.not_before is None or head.not_before <= now):
        return True
    # A paused (or waiting) run whose deadline passed needs a decision although nobody wrote to it.
    return not head.status.is_terminal and head.wake_at is not None and head.wake_at <= now


def from_thread(callback: Callable[[], None]) -> Callable[[], None]:
    """(Made on the event loop.) A function a store's thread calls to have ``callback`` run on
    that loop (``RunStore.append``'s ``flushing``). Never a reason for the
    thread's write to fail: a loop closed meanwhile hears nothing."""
    loop = asyncio.get_running_loop()

    def tell() -> None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback)

    return tell


T = TypeVar("T")


async def sent(statement: Coroutine[Any, Any, T], flushing: Callable[[], None] | None) -> T:
    """Await ``statement`` (a query to a database server), calling ``flushing`` once it is sent:
    it runs as a task whose first step sends it, then ``flushing`` is called while the server
    works (``RunStore.append``'s ``flushing``). A cancelled caller cancels the statement."""
    if flushing is None:
        return await statement
    task = asyncio.ensure_future(statement)
    try:
        await asyncio.sleep(0)  # the task's first step: the statement goes out
        if not task.done():
            flushing()
        return await task
    finally:
        if not task.done():
            task.cancel()

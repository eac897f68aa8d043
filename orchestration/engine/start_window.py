"""Which run an identical start already made: under the caller's idempotency key, or within the retry
window of a start without one (:func:`start_once`; what a caller sees: docs/tools.md, retries that
never start a second run).

The window is durable: it rides on the stores' atomic create-or-return by idempotency key (an
implicit key per time bucket: :func:`window_key`), so it holds across restarts and servers
sharing a store, and two identical starts at once make one run.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from orchestration.core.clock import Clock
from orchestration.core.inputs import RetryWindow, StartRequest, stored_key
from orchestration.core.models import RunHead, canonical_hash
from orchestration.errors import Conflict, RunMoved, RunPruned, quoted
from orchestration.store import RunStore

#: How many keys one bucket may use (runs made with ``new_run``, pruned runs) before a start is
#: refused: far more than any client retries in one window.
MAX_GENERATIONS = 100

KEY_PREFIX = "retry:"


def fingerprint(request: StartRequest, window: RetryWindow) -> str:
    """What makes two starts without a key the same start: every argument that shapes the run
    (those of an explicit key's :meth:`StartRequest.request_hash`), the parent task of a child run,
    the identity and the window itself (so that a changed window never matches an older key); not
    how long the call waits, nor its trace."""
    parent = None if request.parent is None else [request.parent.run_id, request.parent.task_id]
    return canonical_hash(
        {
            "request": request.request_hash(),
            "parent": parent,
            "identity": window.identity,
            "window_seconds": window.seconds,
        }
    )


def window_key(print_: str, bucket: int, generation: int = 0) -> str:
    """The implicit idempotency key of generation ``generation`` of ``bucket`` (71-75 characters).

    A bucket is the window's width, so every run made within the window holds a key of the current
    bucket or the previous one. A bucket's key can be used more than once (``new_run``; a pruned
    run's key stays reserved), hence generations (``retry:<hash>``, ``retry:<hash>.1``, ...), taken
    in order. Two identical starts at the same instant on either side of a bucket boundary take
    different keys and make two runs: the known gap (a retry comes after the call it retries)."""
    digest = hashlib.sha256(f"{print_}:{bucket}".encode()).hexdigest()
    return f"{KEY_PREFIX}{digest}" if generation == 0 else f"{KEY_PREFIX}{digest}.{generation}"


def bucket_of(now: datetime, seconds: float) -> int:
    """The time bucket ``now`` falls in, for a window of ``seconds``."""
    return math.floor(now.timestamp() / seconds)


@dataclass(frozen=True, slots=True)
class WindowLookup:
    """What a look-up found: the newest run an identical start made within the window (None:
    none), and the first key of the current bucket that no run holds or held. ``guessed``: the
    current bucket was not read (:func:`look_up` with ``guess``): ``free_key`` is its first key,
    free unless a run holds it, which the create then answers (the caller looks up again in
    full)."""

    recent: RunHead | None
    free_key: str
    guessed: bool = False


async def look_up(
    store: RunStore, request: StartRequest, window: RetryWindow, now: datetime, *, guess: bool = False
) -> WindowLookup:
    """Read the window's keys (the current bucket's, then the previous one's when the current one
    has no run), keeping the newest run made within the window. Reads only; the caller creates
    under ``free_key``.

    ``guess``: most starts are the first of their kind, so read the previous bucket only, and when
    it holds no recent run, guess that the current one holds none either (``guessed``): the
    caller creates under the current bucket's first key, and the store's create-or-return tells
    it whether a run holds that key (then it looks up again without ``guess``: the newest run of
    the bucket answers, which may be a later generation's). One read of the store instead of
    two for a first start; a retry pays one create attempt more."""
    print_ = fingerprint(request, window)
    bucket = bucket_of(now, window.seconds)
    since = now - timedelta(seconds=window.seconds)
    if guess:
        earlier, _ = await _scan(store, print_, bucket - 1)
        if earlier is None or earlier.created_at < since:
            return WindowLookup(None, window_key(print_, bucket), guessed=True)
    newest, free_key = await _scan(store, print_, bucket)
    if newest is None:
        newest, _ = await _scan(store, print_, bucket - 1)
    recent = newest if newest is not None and newest.created_at >= since else None
    return WindowLookup(recent, free_key)


async def _scan(store: RunStore, print_: str, bucket: int) -> tuple[RunHead | None, str]:
    """The newest run holding one of ``bucket``'s keys, and the bucket's first free key. Keys are
    taken in order, so the generations before the first free one are every run of the bucket."""
    newest: RunHead | None = None
    for generation in range(MAX_GENERATIONS):
        key = window_key(print_, bucket, generation)
        try:
            head = await store.find_by_idempotency_key(key)
        except (RunPruned, RunMoved):
            continue  # a deleted run's key stays reserved: the next generation
        if head is None:
            return newest, key
        newest = head
    raise Conflict(
        f"{MAX_GENERATIONS} runs were started with these arguments within the retry window; "
        "pass an idempotency_key to start another"
    )


async def start_once(
    store: RunStore,
    request: StartRequest,
    clock: Clock,
    create: Callable[[str | None], Awaitable[tuple[RunHead, bool]]],
) -> tuple[RunHead, bool]:
    """A start made once: ``(run, False)`` for the run an earlier identical start made —
    under the caller's idempotency key (:func:`keyed_before_namespaces` too), or within the retry
    window (:func:`look_up`) — else what ``create(key)`` answers, ``key`` the idempotency key
    the new run goes under (the caller's stored per identity, the window's first free key, or
    None without either). A window key whose run was deleted since the look-up, or that a
    concurrent start took, is looked up again."""
    if request.idempotency_key is not None:
        earlier = await keyed_before_namespaces(store, request.idempotency_key, request.started_by)
        if earlier is not None:
            return repeated(earlier, request.request_hash(), request.idempotency_key, "request"), False
        return await create(stored_key(request.idempotency_key, request.started_by))
    window = request.retry
    if window is None or window.seconds <= 0:
        return await create(None)
    guess = not window.new_run  # see look_up: one read for a first start
    while True:
        seen = await look_up(store, request, window, clock.now(), guess=guess)
        if seen.recent is not None and not window.new_run:
            return seen.recent, False
        try:
            made, created = await create(seen.free_key)
        except (RunPruned, RunMoved):
            guess = False
            continue  # the key's run was deleted since the look-up, which now skips it
        if seen.guessed and not created:
            guess = False
            continue  # the bucket has runs: a full look-up answers with its newest
        if created or not window.new_run:
            return made, created  # not created: an identical start made it a moment ago
        # new_run, and a concurrent start took that key first: the next look-up passes it.


async def keyed_before_namespaces(store: RunStore, key: str, started_by: str | None) -> RunHead | None:
    """The run that identity ``started_by`` started with idempotency key ``key`` before keys
    were kept per identity (stored as sent), so that its repeats still answer with it; None
    when there is none, or the run under that key was another's (or a local caller's: whose
    it is stays unsaid), or it was deleted (a tombstone does not say who started the run)."""
    if started_by is None:
        return None
    try:
        head = await store.find_by_idempotency_key(key)
    except (RunPruned, RunMoved):
        return None
    return head if head is not None and head.started_by == started_by else None


def repeated(found: RunHead, request_hash: str, key: str | None, original: str) -> RunHead:
    """``found``, the run an earlier call (the ``original`` request or fork) with idempotency key
    ``key`` made, when this one asks for the same (``request_hash``); else a ``Conflict``."""
    if found.request_hash != request_hash:
        raise Conflict(
            f"idempotency_key {quoted(key)} was already used for run {found.run_id} with a different "
            f"request; use a new key, or repeat the original {original} exactly"
        )
    return found


__all__ = [
    "KEY_PREFIX",
    "MAX_GENERATIONS",
    "WindowLookup",
    "bucket_of",
    "fingerprint",
    "keyed_before_namespaces",
    "look_up",
    "repeated",
    "start_once",
    "window_key",
]

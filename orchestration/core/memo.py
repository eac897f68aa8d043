"""Pure caches keyed on immutable snapshots, for the interpreter time of a task boundary.

:func:`by_identity` remembers a function's result per *object* (not per value: nothing is hashed
or compared) while the object lives. Records are frozen and a head's copy shares its unchanged
parts, so a cached result is what the function would return again: no decision changes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import wraps
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: entries kept per cached function; past it the cache starts again (an entry goes with its object,
#: so this bounds only what the live objects hold: the chains and tasks of the runs in progress)
LIMIT = 8192


class _Ref(weakref.ref):  # type: ignore[type-arg]
    """A weak reference that knows its cache key: one callback per cache serves every entry (a
    closure per entry cost each cached object about 130 bytes more)."""

    __slots__ = ("key",)
    key: int


def by_identity(fn: Callable[[T], R]) -> Callable[[T], R]:
    """``fn`` (a pure function of one immutable, weak-referenceable object), remembering its
    result per object while that object lives (at most :data:`LIMIT` objects at a time)."""
    cache: dict[int, tuple[_Ref, R]] = {}

    def forget(ref: _Ref) -> None:
        entry = cache.get(ref.key)
        if entry is not None and entry[0] is ref:
            del cache[ref.key]

    @wraps(fn)
    def cached(obj: T) -> R:
        key = id(obj)
        hit = cache.get(key)
        if hit is not None and hit[0]() is obj:
            return hit[1]
        value = fn(obj)
        if len(cache) >= LIMIT:
            cache.clear()
        ref = _Ref(obj, forget)
        ref.key = key
        cache[key] = (ref, value)
        return value

    return cached

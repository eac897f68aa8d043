"""The cyclic garbage collector tuned for a long-lived server (:func:`tune_collector`), whose heap grows
with its live runs; the figures that led to it are in docs/performance.md.
"""

from __future__ import annotations

import gc

#: the collector's first threshold in a server (CPython's default is 700); the other two are
#: CPython's
YOUNG_THRESHOLD = 10_000


def tune_collector() -> None:
    """Collect, freeze what survives and raise the young generation's threshold. Call it once,
    when startup is done.

    Frozen (``gc.freeze``): the modules, the catalog, the settings and the SDK's tables live as long
    as the process, so no later collection walks them. CPython's first threshold (700) suits a
    short script; at :data:`YOUNG_THRESHOLD` the young generation is collected about 14 times less
    often, and the older ones, whose thresholds count young collections, with it. Cyclic garbage
    (an exception and its traceback, a cancelled task's frames) then waits at most that many
    allocations more; nothing that is not a cycle waits (reference counting frees it at once)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


__all__ = ["YOUNG_THRESHOLD", "tune_collector"]

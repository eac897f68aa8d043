"""The collector tuned for a long-lived server (server.collector, issue 24)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from server.collector import YOUNG_THRESHOLD, tune_collector


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.usefixtures("restored")
def test_startup_objects_are_frozen_and_the_young_generation_collected_less_often() -> None:
    gc.unfreeze()
    _, middle, old = gc.get_threshold()
    kept = [object()]  # lives on: frozen with the rest
    tune_collector()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, middle, old)
    assert gc.get_freeze_count() > len(kept)
    assert gc.get_count()[0] < YOUNG_THRESHOLD


@pytest.mark.usefixtures("restored")
def test_cycles_made_after_startup_are_still_freed_by_the_collector_on_its_own() -> None:
    tune_collector()

    class Node:
        other: object

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    assert gone() is not None  # a cycle: reference counting alone does not free it
    # No gc.collect(): the thresholds' own work.
    allocated: list[list[int]] = [[] for _ in range(3 * YOUNG_THRESHOLD)]
    assert gone() is None, len(allocated)

"""Pure caches keyed on immutable snapshots (orchestration.core.memo): a result is remembered per
object, never per value, and forgotten with its object, so no decision can read a stale one."""

from __future__ import annotations

import gc

from orchestration.core.graph import is_parallel
from orchestration.core.memo import by_identity
from orchestration.core.models import ChainSnapshot, ChainStep, SpecialistSnapshot, step_map


def chain(*steps: ChainStep) -> ChainSnapshot:
    return ChainSnapshot(
        name="c", steps=steps, specialists=(SpecialistSnapshot(name="s", description="d", persona="p"),)
    )


def test_a_result_is_remembered_per_object_and_forgotten_with_it() -> None:
    calls: list[int] = []

    class Box:
        def __init__(self, value: int) -> None:
            self.value = value

    @by_identity
    def double(box: Box) -> int:
        calls.append(box.value)
        return box.value * 2

    first = Box(1)
    assert double(first) == 2 and double(first) == 2
    assert calls == [1]
    # An equal value in another object is computed for that object.
    assert double(Box(1)) == 2
    assert calls == [1, 1]
    # A dead object's entry goes with it: a new object that reuses its id is computed afresh.
    del first
    gc.collect()
    assert [double(Box(n)) for n in (5, 6)] == [10, 12]
    assert calls == [1, 1, 5, 6]


def test_a_copied_chain_with_other_steps_gets_its_own_answers() -> None:
    linear = chain(ChainStep(name="a", specialist="s"), ChainStep(name="b", specialist="s"))
    assert not is_parallel(linear)
    assert linear.step("b").name == "b" and linear.index("b") == 1
    steps = (ChainStep(name="b", specialist="s"), ChainStep(name="a", specialist="s", after=("b",)))
    parallel = linear.model_copy(update={"steps": steps})
    assert is_parallel(parallel) and not is_parallel(linear)
    assert parallel.index("b") == 0 and linear.index("b") == 1
    assert step_map(parallel)["a"].after == ("b",) and step_map(linear)["a"].after is None


def test_an_unknown_step_is_still_a_key_error() -> None:
    linear = chain(ChainStep(name="a", specialist="s"))
    for lookup in (linear.step, linear.index):
        try:
            lookup("nope")
        except KeyError as exc:
            assert exc.args == ("nope",)
        else:  # pragma: no cover
            raise AssertionError("no KeyError")

"""The delegation a call's ``_meta`` carries (:mod:`orchestration.core.hops`): read as strictly as
arguments (every part bounded), sent on with one hop more, and the two refusals."""

from __future__ import annotations

from typing import Any

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core.hops import DELEGATION_META, check_start, from_meta, onward
from orchestration.core.models import Delegation
from orchestration.errors import DelegationDepthExceeded, DelegationLoop, InvalidArgument


@pytest.mark.parametrize(
    "value",
    [
        {"hops": 0},
        {"hops": "1"},
        {"hops": True},
        {"hops": 1.5},
        {"hops": 1001},
        {"servers": ["srv-a"]},
        {"hops": 1, "servers": ["../etc"]},
        {"hops": 1, "servers": ["s" * 101]},
        {"hops": 1, "servers": [f"srv-{n}" for n in range(51)]},
        {"hops": 1, "servers": "srv-a"},
        {"hops": 1, "extra": True},
        "hops=1",
    ],
)
def test_a_malformed_delegation_is_an_invalid_argument(value: Any) -> None:
    with pytest.raises(InvalidArgument) as refused:
        from_meta({DELEGATION_META: value})
    assert DELEGATION_META in refused.value.message and len(refused.value.message) < 400


def test_a_call_without_the_key_carries_no_delegation() -> None:
    assert from_meta(None) is None
    assert from_meta({"progressToken": 1}) is None
    assert from_meta({DELEGATION_META: {"hops": 2, "servers": ["srv-a"]}}) == Delegation(
        hops=2, servers=("srv-a",)
    )


def test_each_hop_adds_one_and_the_server_it_passed() -> None:
    first = onward(None, "srv-a")
    assert first == Delegation(hops=1, servers=("srv-a",))
    assert onward(first, "srv-b") == Delegation(hops=2, servers=("srv-a", "srv-b"))
    full = Delegation(hops=3, servers=tuple(f"srv-{n}" for n in range(50)))
    assert onward(full, "srv-me").servers[-1] == "srv-me" and len(onward(full, "srv-me").servers) == 50


def test_a_start_that_lists_this_server_or_goes_too_deep_is_refused() -> None:
    chain = Catalog.builtin().resolve(None)  # max_depth 3, the default
    check_start(None, chain, "srv-me")
    check_start(Delegation(hops=3, servers=("srv-a",)), chain, "srv-me")
    with pytest.raises(DelegationLoop):
        check_start(Delegation(hops=1, servers=("srv-me",)), chain, "srv-me")
    with pytest.raises(DelegationDepthExceeded) as deep:
        check_start(Delegation(hops=4), chain, "srv-me")
    assert "max_depth" in deep.value.message and deep.value.code == "delegation_depth_exceeded"

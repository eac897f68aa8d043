"""The optional abilities of the stores (``orchestration.store``): each adapter satisfies exactly the
protocols it implements, ``isinstance`` says so (a dispatcher relies on it), and the crash-test
wrapper has the abilities of the store it wraps, no more and no fewer."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orchestration.store import ClaimsRunnable, NotifiesRunnable, RunStore
from stores import CrashAfterWrites
from tests.stores.builders import BASE_TIME, new_run, run_id
from tests.stores.conftest import ADAPTERS

OPTIONAL: tuple[type, ...] = (ClaimsRunnable, NotifiesRunnable)

#: adapter name -> the optional abilities it has
ABILITIES: dict[str, set[type]] = {
    "memory": set(),
    "filesystem": set(),
    "sqlite": {ClaimsRunnable},
    "postgres": {ClaimsRunnable, NotifiesRunnable},
}


def abilities(store: object) -> set[type]:
    return {ability for ability in OPTIONAL if isinstance(store, ability)}


def test_the_table_names_every_adapter() -> None:
    assert set(ABILITIES) == set(ADAPTERS)


def test_an_object_lacking_a_method_of_an_ability_does_not_have_it() -> None:
    class ListensOnly:
        async def listen(self, callback: object, on_lost: object = None) -> None: ...

    assert abilities(ListensOnly()) == set()
    assert not isinstance(ListensOnly(), RunStore)


async def test_each_adapter_has_exactly_its_abilities(store: RunStore) -> None:
    assert isinstance(store, RunStore)
    assert abilities(store) == ABILITIES[store.name]


async def test_the_crash_wrapper_has_the_abilities_of_the_store_it_wraps(store: RunStore) -> None:
    wrapped = CrashAfterWrites(store, 1_000)
    assert isinstance(wrapped, RunStore) and isinstance(wrapped, CrashAfterWrites)
    assert abilities(wrapped) == ABILITIES[store.name]
    assert wrapped.name == store.name


async def test_the_crash_wrapper_claims_through_the_store_and_counts_no_write(store: RunStore) -> None:
    if not isinstance(store, ClaimsRunnable):
        pytest.skip(f"{store.name} has no claim_runnable")
    wrapped = CrashAfterWrites(store, 1_000)
    head, facts = new_run(run_id(1))
    await wrapped.create(head, facts)
    assert isinstance(wrapped, ClaimsRunnable)
    leases = await wrapped.claim_runnable("w", 30, BASE_TIME + timedelta(seconds=1), 10)
    assert [lease.run_id for lease in leases] == [run_id(1)]
    assert wrapped.writes == 1  # the create; a claim writes a lease, not a fact

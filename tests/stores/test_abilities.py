"""The optional abilities of the stores (``orchestration.store``): each adapter satisfies exactly the
protocols it implements, ``isinstance`` says so (a dispatcher relies on it), and the crash-test
wrapper has the abilities of the store it wraps, no more and no fewer."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest

from orchestration.errors import VersionConflict
from orchestration.store import ClaimsRunnable, NotifiesRunnable, RunStore
from stores import CrashAfterWrites
from tests.stores.builders import BASE_TIME, new_run, run_id, start_attempt
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


async def test_a_store_tells_each_write_under_way_once_before_answering(store: RunStore) -> None:
    """``flushing``: once per write, before its answer (memory: never, it cannot tell); a write
    refused before its flush never (sqlite, filesystem), one sent to a server whatever its
    answer (postgres)."""
    tells = store.name != "memory"
    events: list[str] = []

    def told(name: str) -> Callable[[], None]:
        return lambda: events.append(f"{name} flushing")

    head, facts = new_run(run_id(1), key="k1")
    created = await store.create(head, facts, flushing=told("create"))
    events.append("create answered")
    assert created.created and events == ["create flushing"] * tells + ["create answered"]
    write = start_attempt(head)
    events.clear()
    await store.append(run_id(1), write.expected_version, write.facts, write.head, flushing=told("append"))
    events.append("append answered")
    assert events == ["append flushing"] * tells + ["append answered"]
    assert await store.load(run_id(1)) == write.head
    # Refused (the version moved on): nothing written; told only where the statement went out.
    events.clear()
    with pytest.raises(VersionConflict):
        await store.append(run_id(1), write.expected_version, write.facts, write.head, flushing=told("stale"))
    await anyio.sleep(0.01)  # a call from the writer's thread would have arrived by now
    assert events == (["stale flushing"] if store.name == "postgres" else [])
    assert [f.seq for f in await store.read_facts(run_id(1))] == [1, 2]

"""Chain versions kept as data, on every store: each distinct snapshot of a chain name numbered from 1
in the order first seen, kept once however often it is seen, with where it came from and its label;
numbered alike by concurrent keepers; removed by a clean-up only when no run holds it and it is
neither current nor its name's newest."""

from __future__ import annotations

from datetime import timedelta

import anyio

from orchestration.core import ChainSnapshot
from orchestration.store import KeepsChainVersions, RunStore
from tests.stores.builders import BASE_TIME, chain_snapshot, new_run, run_id


def review(persona: str, name: str = "build") -> ChainSnapshot:
    """The builders' chain, named ``name``, with the reviewer's persona replaced."""
    base = chain_snapshot()
    specialists = tuple(
        spec.model_copy(update={"persona": persona}) if spec.name == "reviewer" else spec
        for spec in base.specialists
    )
    return base.model_copy(update={"name": name, "specialists": specialists})


def versions_of(store: RunStore) -> KeepsChainVersions:
    assert isinstance(store, KeepsChainVersions), f"{store.name} keeps no chain versions"
    return store


async def test_each_snapshot_is_kept_once_and_numbered_in_order(store: RunStore) -> None:
    kept = versions_of(store)
    one, two = review("You review."), review("You review for security first.")
    first = await kept.keep_chain_version(one, "config", "2026.1", BASE_TIME)
    again = await kept.keep_chain_version(one, "call", "other", BASE_TIME + timedelta(hours=1))
    second = await kept.keep_chain_version(two, "call", None, BASE_TIME + timedelta(hours=2))
    assert (first.ordinal, second.ordinal) == (1, 2)
    # Seen again: the version as first kept (its source, label and time).
    assert again == first
    assert (again.source, again.label, again.first_seen) == ("config", "2026.1", BASE_TIME)
    listed = await kept.chain_versions("build")
    assert [(v.ordinal, v.chain_hash, v.source, v.label) for v in listed] == [
        (1, one.content_hash(), "config", "2026.1"),
        (2, two.content_hash(), "call", None),
    ]
    assert listed[1].chain == two and listed[1].first_seen == BASE_TIME + timedelta(hours=2)
    assert await kept.chain_versions("other") == []


async def test_names_are_numbered_apart(store: RunStore) -> None:
    kept = versions_of(store)
    a = await kept.keep_chain_version(review("A", name="alpha"), "config", None, BASE_TIME)
    b = await kept.keep_chain_version(review("A", name="beta / team"), "config", None, BASE_TIME)
    assert (a.ordinal, b.ordinal) == (1, 1)
    assert [v.name for v in await kept.chain_versions("beta / team")] == ["beta / team"]


async def test_concurrent_keeps_number_alike(store: RunStore) -> None:
    kept = versions_of(store)
    chains = [review(f"Persona {n % 4}") for n in range(12)]
    got: list[int] = []

    async def keep(chain: ChainSnapshot) -> None:
        got.append((await kept.keep_chain_version(chain, "call", None, BASE_TIME)).ordinal)

    async with anyio.create_task_group() as tg:
        for chain in chains:
            tg.start_soon(keep, chain)
    listed = await kept.chain_versions("build")
    assert [v.ordinal for v in listed] == [1, 2, 3, 4]
    assert len({v.chain_hash for v in listed}) == 4
    by_hash = {v.chain_hash: v.ordinal for v in listed}
    assert sorted(got) == sorted(by_hash[c.content_hash()] for c in chains)


async def test_a_clean_up_keeps_what_runs_hold_the_current_and_the_newest(store: RunStore) -> None:
    kept = versions_of(store)
    head, facts = new_run(run_id(1), at=BASE_TIME)
    held = head.chain
    snapshots = [review("Old one"), held, review("Current"), review("Newest")]
    for n, chain in enumerate(snapshots):
        await kept.keep_chain_version(chain, "config", None, BASE_TIME + timedelta(minutes=n))
    assert (await store.create(head, facts)).created
    removed = await kept.forget_chain_versions(keep=[snapshots[2].content_hash()])
    remaining = await kept.chain_versions(held.name)
    # "Old one" went; the run's, the current and the newest stay, with their numbers.
    assert removed == 1
    assert [v.ordinal for v in remaining] == [2, 3, 4]
    assert await kept.forget_chain_versions(keep=[snapshots[2].content_hash()]) == 0
    # A number is never given twice: the next version follows the newest.
    after = await kept.keep_chain_version(review("Later"), "call", None, BASE_TIME)
    assert after.ordinal == 5

"""``RunStore.versions`` on every store (issue 24, upkeep per server): the versions of many runs in
one read — what a runtime's watcher of calls in flight reads once per interval instead of one
record per call — with runs that do not exist (never made, deleted) left out."""

from __future__ import annotations

import pytest

from orchestration.errors import InvalidArgument
from orchestration.store import RunStore, Tombstone
from tests.stores.builders import INVALID_RUN_IDS, cancel, new_run, run_id, start_attempt


async def test_versions_answers_each_run_and_leaves_out_the_missing(store: RunStore) -> None:
    heads = {}
    for n in range(1, 5):
        head, facts = new_run(run_id(n))
        heads[n] = (await store.create(head, facts)).head
    # Run 2 moves on twice (a call started, then a cancel from elsewhere); run 3 once.
    write = start_attempt(heads[2])
    moved = await store.append(run_id(2), write.expected_version, write.facts, write.head)
    write = cancel(moved)
    await store.append(run_id(2), write.expected_version, write.facts, write.head)
    write = start_attempt(heads[3])
    ended = await store.append(run_id(3), write.expected_version, write.facts, write.head)
    write = cancel(ended)
    ended = await store.append(run_id(3), write.expected_version, write.facts, write.head)
    # Run 3 is then deleted (pruned): it is left out, as a run that never existed is.
    await store.delete_run(Tombstone.of(ended, "pruned", ended.created_at))
    asked = [run_id(n) for n in (1, 2, 3, 4)] + [run_id(9)]
    assert await store.versions(asked) == {run_id(1): 1, run_id(2): 3, run_id(4): 1}


async def test_versions_of_nothing_is_nothing(store: RunStore) -> None:
    assert await store.versions([]) == {}


async def test_versions_of_many_runs_in_one_call(store: RunStore) -> None:
    ids = [run_id(n) for n in range(1, 301)]
    for rid in ids:
        head, facts = new_run(rid)
        await store.create(head, facts)
    assert await store.versions(ids) == dict.fromkeys(ids, 1)


@pytest.mark.parametrize("bad", INVALID_RUN_IDS[:3])
async def test_versions_refuses_a_malformed_run_id(store: RunStore, bad: str) -> None:
    with pytest.raises(InvalidArgument):
        await store.versions([run_id(1), bad])

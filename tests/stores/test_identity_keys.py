"""Idempotency keys belong to the identity that sends them (issue 22, finding 8), on every store: the
same key sent by two identities makes two runs (and two forks), neither answer names the other's
run, and a run an identity started with a key before keys were namespaced still answers that
identity's repeats. A caller without an identity (stdio, the CLI) keeps one namespace, as before."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.facts import RunCreated
from orchestration.core.fold import head_from_creation
from orchestration.engine import Runtime
from orchestration.errors import Conflict
from orchestration.ops import ForkRequest, fork_run
from orchestration.store import RunStore
from tests.stores.builders import new_run, run_id
from tests.stores.test_fork import runtime_on as fork_runtime
from tests.unit.helpers import ScriptedWorker, play

OLD = run_id(1)


def runtime_on(store: RunStore) -> Runtime:
    return fork_runtime(store, Catalog.builtin(), ScriptedWorker())


def start(key: str, by: str | None, request: str = "the same request") -> StartRequest:
    return StartRequest(request, chain=("writer",), idempotency_key=key, started_by=by)


async def test_one_key_sent_by_two_identities_makes_two_runs(store: RunStore) -> None:
    runtime = runtime_on(store)
    alices, created = await runtime.start(start("k-1", "alice"))
    carols, carol_created = await runtime.start(start("k-1", "carol"))
    assert created and carol_created
    assert carols.run_id != alices.run_id and carols.started_by == "carol"
    # Each identity's repeat finds its own run.
    assert (await runtime.start(start("k-1", "alice")))[0].run_id == alices.run_id
    assert (await runtime.start(start("k-1", "carol")))[0].run_id == carols.run_id
    # Another request under the key conflicts with the sender's own run only.
    with pytest.raises(Conflict) as refused:
        await runtime.start(start("k-1", "carol", "something else"))
    assert carols.run_id in str(refused.value) and alices.run_id not in str(refused.value)
    assert "'k-1'" in str(refused.value) and "token:" not in str(refused.value)
    # A caller without an identity (stdio, the CLI) has its own namespace, the key as sent.
    local, local_created = await runtime.start(start("k-1", None))
    assert local_created and local.run_id not in (alices.run_id, carols.run_id)
    assert local.idempotency_key == "k-1"


async def test_one_fork_key_sent_by_two_identities_makes_two_forks(store: RunStore) -> None:
    runtime = runtime_on(store)
    source, _ = await runtime.start(start("source", "alice"))
    await play(runtime, source.run_id)
    fork = ForkRequest(run_id=source.run_id, from_task="writer", idempotency_key="f-1", started_by="alice")
    alices, created = await fork_run(runtime, fork)
    carols, carol_created = await fork_run(runtime, replace(fork, started_by="carol"))
    assert created and carol_created and carols.run_id != alices.run_id
    assert (await fork_run(runtime, fork))[0].run_id == alices.run_id
    # Forks and starts share an identity's keys: carol's "f-1" is her fork's, never alice's.
    with pytest.raises(Conflict) as refused:
        await runtime.start(start("f-1", "carol"))
    assert carols.run_id in str(refused.value) and alices.run_id not in str(refused.value)


async def test_a_key_used_before_keys_were_namespaced_still_answers_its_repeats(store: RunStore) -> None:
    runtime = runtime_on(store)
    # A run alice started with key "old" before this change: the key is stored as she sent it.
    _, facts = new_run(OLD, key="old", request="the same request")
    assert isinstance(facts[0], RunCreated)
    created = facts[0].model_copy(
        update={"started_by": "alice", "request_hash": start("old", "alice").request_hash()}
    )
    await store.create(head_from_creation(created), [created])

    again, made = await runtime.start(start("old", "alice"))
    assert (again.run_id, made) == (OLD, False)
    with pytest.raises(Conflict):
        await runtime.start(start("old", "alice", "something else"))
    # Another identity's "old" is another key: a run of its own, alice's run unnamed.
    carols, carol_made = await runtime.start(start("old", "carol"))
    assert carol_made and carols.run_id != OLD
    # A local caller (one identity, keys as sent) finds the run as it always did.
    assert (await runtime.start(start("old", None)))[0].run_id == OLD

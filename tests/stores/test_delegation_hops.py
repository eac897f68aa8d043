"""What a delegation carries is recorded and sent on (issue 22, finding 2), on every store: a run
started through a delegation records it (``run_created.delegation``, in the head), its agent steps
send one hop more with this server added (``_meta["construct-mcp/delegation"]``), a restarted
process sends the recorded count again with the same idempotency key, and a start that lists this
server or has more hops than the chain's ``max_depth`` is refused with nothing recorded. The
agent is the scripted construct-mcp of ``tests/unit/server/test_agent_runs.py``; the same through
real servers is ``tests/acceptance/test_delegation_loops.py``."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.types import CallToolResult

from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.hops import DELEGATION_META
from orchestration.core.models import Delegation
from orchestration.core.vocabulary import RunStatus
from orchestration.errors import DelegationDepthExceeded, DelegationLoop
from orchestration.ops.forking import ForkRequest, fork_run
from orchestration.store import RunStore
from tests.stores.test_agent_answers import runtime_with
from tests.unit.child_chains import child_runtime, drive_tree
from tests.unit.helpers import play
from tests.unit.server.test_agent_runs import FakeRemote


async def test_a_delegated_run_records_its_hops_and_its_calls_send_one_more(store: RunStore) -> None:
    remote = FakeRemote(polls=1)
    runtime = runtime_with(store, remote)
    incoming = Delegation(hops=2, servers=("srv-a", "srv-b"))
    head, _ = await runtime.start(
        StartRequest(request="Build a cache", chain="delegated", delegation=incoming)
    )
    assert (await store.load(head.run_id)).delegation == incoming
    assert (await store.read_fact(head.run_id, 1)).delegation == incoming  # type: ignore[union-attr]
    assert (await play(runtime, head.run_id)).status == RunStatus.COMPLETED
    worker = runtime.worker.agents  # type: ignore[union-attr]
    sent = [
        meta
        for (name, _), meta in zip(remote.calls, remote.metas, strict=True)
        if name == "orchestrate_start"
    ]
    assert sent == [{DELEGATION_META: {"hops": 3, "servers": ["srv-a", "srv-b", worker.server_id]}}]


async def test_a_restarted_server_sends_the_recorded_hop_count_with_the_same_key(store: RunStore) -> None:
    """The process dies during the start (after the remote made its run, before the answer): the
    next attempt, by another process (another server id), repeats it with the same key and the hop
    count the run recorded."""

    class Crash(BaseException):
        """Stands for SIGKILL: nothing of the process's own handles it."""

    class DiesDuringTheFirstStart(FakeRemote):
        async def call_tool(self, name: str, *args: Any, **kwargs: Any) -> CallToolResult:
            answer = await super().call_tool(name, *args, **kwargs)
            if name == "orchestrate_start" and self.starts() == 1:
                raise Crash
            return answer

    remote, clock = DiesDuringTheFirstStart(polls=1), ManualClock()
    first = runtime_with(store, remote, clock=clock)
    incoming = Delegation(hops=1, servers=("srv-a",))
    head, _ = await first.start(StartRequest(request="Build a cache", chain="delegated", delegation=incoming))
    await first.drive(head.run_id)
    await first.submit_host_output(head.run_id, "architect", "the design")
    with pytest.raises(BaseException):  # noqa: B017 - the "SIGKILL", bare or in a group
        await first.drive(head.run_id)
    clock.advance(60)  # the lease runs out
    second = runtime_with(store, remote, clock=clock, owner="p2")
    assert second.server_id != first.server_id
    assert (await play(second, head.run_id)).status == RunStatus.COMPLETED
    pairs = zip(remote.calls, remote.metas, strict=True)
    starts = [(args, meta) for (name, args), meta in pairs if name == "orchestrate_start"]
    assert len(starts) == 2 and len(remote.runs) == 1
    assert {args["idempotency_key"] for args, _ in starts} == {f"construct:{head.run_id}:review:1"}
    assert [meta[DELEGATION_META]["hops"] for _, meta in starts] == [2, 2]  # type: ignore[index]


async def test_a_start_that_loops_or_is_too_deep_is_refused_and_records_nothing(store: RunStore) -> None:
    runtime = runtime_with(store, FakeRemote())
    me = runtime.server_id
    with pytest.raises(DelegationLoop):
        await runtime.start(
            StartRequest(
                request="Loop", chain="delegated", delegation=Delegation(hops=2, servers=("srv-a", me))
            )
        )
    with pytest.raises(DelegationDepthExceeded):
        await runtime.start(StartRequest(request="Deep", chain="delegated", delegation=Delegation(hops=4)))
    assert (await store.list_runs()).runs == []
    head, _ = await runtime.start(
        StartRequest(request="Fine", chain="delegated", delegation=Delegation(hops=3))
    )
    assert head.delegation == Delegation(hops=3)


async def test_child_runs_and_forks_carry_their_parents_delegation(store: RunStore) -> None:
    """A run's child runs (a step's, a host's) and its forks are as far from the delegation's
    start as the run: their own agent steps go on counting from its hops."""
    runtime = child_runtime(store)
    incoming = Delegation(hops=2, servers=("srv-a",))
    start = StartRequest(request="Outer", chain="outer", worker_backend="provider", delegation=incoming)
    parent, _ = await runtime.start(start)
    assert (await drive_tree(runtime, parent.run_id)).status == RunStatus.COMPLETED
    children = [r for r in (await store.list_runs()).runs if r.parent is not None]
    assert children and all(c.delegation == incoming for c in children), children
    fork, _ = await fork_run(runtime, ForkRequest(run_id=parent.run_id, from_task="build"))
    assert fork.delegation == incoming
    inline, _ = await runtime.start(StartRequest(request="Inline", chain="inner", delegation=incoming))
    await runtime.drive(inline.run_id)  # its engineer awaits the host
    host_child, _ = await runtime.children.start_for_host(
        StartRequest(request="Inner", chain="inner"), inline.run_id, "engineer"
    )
    assert host_child.delegation == incoming

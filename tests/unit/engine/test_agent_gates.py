"""Who answers a gate (issue 21 §3): a person, or the calling agent itself (``approvers =
["agent"]`` on a step, or the chain's own ``approvers``). The catalog reads and refuses the
settings, :func:`~orchestration.core.approvals.gate_approvers` says whose each gate is (budget and
exhausted gates included), the runtime refuses the agent on a person's gate, and a chain-level
policy makes the run record format 5 while a chain without one is stored and hashed as before."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core import AGENT_APPROVER, agent_may_decide, gate_approvers
from orchestration.core.facts import RunCreated, dump_fact, parse_fact
from orchestration.core.fold import apply
from orchestration.core.models import ChainSnapshot, ExecutionContract, GateState, RunHead
from orchestration.core.routing import chain_format
from orchestration.engine.runtime import Runtime
from orchestration.errors import ConfigError, Forbidden
from stores.memory import MemoryStore
from tests.unit.helpers import make_runtime, to_gate

VERDICT = {"specialist": "reviewer", "output_schema": "verdict", "route_on": "verdict"}
CHAINS: dict[str, Any] = {
    # the chain's policy covers every gate without its own; the reviewer's gate is alice's
    "autonomous": {
        "approvers": ["agent"],
        "steps": [
            "architect",
            {"specialist": "engineer", "approve_after": True},
            {"specialist": "tester", "approve_before": True, "approvers": ["alice"]},
        ],
    },
    # a step the agent may decide, and so may bob; the chain has no policy
    "agent-step": {
        "steps": [
            "architect",
            {"specialist": "engineer", "approve_after": True, "approvers": ["agent", "bob"]},
        ]
    },
    "person": {"steps": ["architect", {"specialist": "engineer", "approve_after": True}]},
    "loop-agent": {
        "approvers": ["agent"],
        "steps": [
            "architect",
            {"specialist": "engineer", "max_visits": 1},
            {
                **VERDICT,
                "routes": {"approve": "end", "revise": "engineer", "reject": "fail"},
                "on_exhausted": "ask",
            },
        ],
    },
    # a chain-level policy is allowed on a chain without step gates: its budget gates take it
    "budget-only": {"approvers": ["carol"], "steps": ["architect"]},
}
CATALOG = Catalog.builtin().extended({"chains": CHAINS}, "agent-gates-test", Path("."))


def _load(chain: dict[str, Any]) -> Catalog:
    return Catalog.builtin().extended({"chains": {"bad": chain}}, "bad-test", Path("."))


def _gate(position: str, task_id: str) -> GateState:
    return GateState(gate_id=f"{position}:{task_id}", task_id=task_id, position=position)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- catalog


def test_the_chain_policy_is_read_into_the_snapshot() -> None:
    snapshot = CATALOG.resolve("autonomous")
    assert snapshot.approvers == (AGENT_APPROVER,)
    assert snapshot.step("engineer").approvers is None
    assert snapshot.step("tester").approvers == ("alice",)
    assert CATALOG.resolve("agent-step").step("engineer").approvers == ("agent", "bob")
    assert CATALOG.resolve("default").approvers is None


@pytest.mark.parametrize(
    ("approvers", "where", "said"),
    [
        ([], "approvers", "at least 1"),
        (["agent", "agent"], "approvers", "listed twice"),
        (["Agent"], "approvers", "spelled 'agent'"),
        (["AGENT"], "approvers", "spelled 'agent'"),
        ([" alice"], "approvers", "surrounding blanks"),
        ([""], "approvers[0]", "must not be empty"),
        ("agent", "approvers", "must be a list"),
    ],
)
def test_bad_approvers_are_refused_at_load_on_the_chain_and_on_a_step(
    approvers: object, where: str, said: str
) -> None:
    with pytest.raises(ConfigError, match=said) as caught:
        _load({"approvers": approvers, "steps": ["architect"]})
    assert f"chains.bad.{where}" in str(caught.value)
    step = {"specialist": "engineer", "approve_after": True, "approvers": approvers}
    with pytest.raises(ConfigError, match=said) as caught:
        _load({"steps": [step]})
    assert f"chains.bad.steps[0].{where}" in str(caught.value)


# ---------------------------------------------------------------------------- whose gate it is


def test_a_steps_gates_take_its_approvers_else_the_chains() -> None:
    catalog_head = _head(CATALOG.resolve("autonomous"))
    assert gate_approvers(catalog_head, _gate("after", "engineer")) == ("agent",)
    assert gate_approvers(catalog_head, _gate("before", "tester")) == ("alice",)
    assert agent_may_decide(catalog_head, _gate("after", "engineer"))
    assert not agent_may_decide(catalog_head, _gate("before", "tester"))
    person = _head(CATALOG.resolve("person"))
    assert gate_approvers(person, _gate("after", "engineer")) is None
    assert not agent_may_decide(person, _gate("after", "engineer"))
    # An exhausted loop's gate is its routing step's: with no approvers there, the chain's.
    loop = _head(CATALOG.resolve("loop-agent"))
    assert gate_approvers(loop, _gate("exhausted", "reviewer")) == ("agent",)


def test_a_budget_gate_takes_the_chains_policy_never_a_steps_agent() -> None:
    # The chain's policy decides it, whatever the step whose call hit the budget says.
    autonomous = _head(CATALOG.resolve("autonomous"))
    assert gate_approvers(autonomous, _gate("budget", "tester")) == ("agent",)
    assert gate_approvers(_head(CATALOG.resolve("budget-only")), _gate("budget", "architect")) == ("carol",)
    # Without one: the step's persons (the rule before chains had a policy), never the agent.
    agent_step = _head(CATALOG.resolve("agent-step"))
    assert gate_approvers(agent_step, _gate("budget", "engineer")) == ("bob",)
    assert gate_approvers(agent_step, _gate("after", "engineer")) == ("agent", "bob")
    agent_only = CATALOG.resolve("agent-step")
    steps = tuple(s.model_copy(update={"approvers": ("agent",)}) for s in agent_only.steps)
    assert (
        gate_approvers(_head(agent_only.model_copy(update={"steps": steps})), _gate("budget", "engineer"))
        is None
    )


def _head(chain: ChainSnapshot) -> RunHead:
    """A run head of ``chain`` as the runtime makes it (only its chain and tasks matter here)."""
    return apply(None, _created(chain))


def _created(chain: ChainSnapshot) -> RunCreated:
    return RunCreated(
        seq=1,
        at=datetime(2026, 1, 1, tzinfo=UTC),
        run_id="run-agent-gates",
        request="Build it",
        chain=chain,
        chain_hash=chain.content_hash(),
        contract=ExecutionContract(),
        request_hash="h",
        format=chain_format(chain),
    )


# -------------------------------------------------------------------------- the runtime refuses


async def test_the_agent_decides_its_own_gate_and_is_refused_a_persons() -> None:
    runtime = make_runtime(catalog=CATALOG)
    head = await to_gate(runtime, "autonomous")
    assert head.format == 5
    for who in (None, "alice"):  # only the agent decides this one
        with pytest.raises(Forbidden, match=r"only by the calling agent \(approver 'agent'\)"):
            await runtime.approve(head.run_id, "approve", "after:engineer", approver=who)
    head = await runtime.approve(head.run_id, "approve", "after:engineer", "looks right", approver="agent")
    gate = head.gate("after:engineer")
    assert gate is not None and (gate.status, gate.approver, gate.verified) == ("approved", "agent", False)
    # The next gate is alice's: the agent is told it is a person's, by name.
    head = await _wait_at(runtime, head.run_id, "before:tester")
    with pytest.raises(Forbidden) as refused:
        await runtime.approve(head.run_id, "approve", "before:tester", approver="agent")
    assert str(refused.value) == (
        f"gate before:tester of run {head.run_id} is a person's (alice), not the agent's: ask the "
        "user, then send their decision without approver 'agent'"
    )
    assert refused.value.code == "forbidden"
    head = await runtime.approve(head.run_id, "approve", "before:tester", approver="alice")
    assert head.gate("before:tester") is not None


async def test_on_a_gate_with_no_policy_the_agent_is_refused_and_a_person_decides() -> None:
    runtime = make_runtime(catalog=CATALOG)
    head = await to_gate(runtime, "person")
    assert head.format == 1  # nothing new in the chain: the run is what it was
    with pytest.raises(
        Forbidden, match=r"after:engineer of run .* is a person's, not the agent's: ask the user"
    ):
        await runtime.approve(head.run_id, "approve", "after:engineer", approver="agent")
    head = await runtime.approve(head.run_id, "approve", "after:engineer")  # nobody named: a person
    assert head.gate("after:engineer") is not None


async def _wait_at(runtime: Runtime, run_id: str, gate_id: str) -> RunHead:
    while True:
        await runtime.drive(run_id)
        head = await runtime.status(run_id)
        gate = head.gate(gate_id)
        if gate is not None and gate.status == "requested":
            return head
        snap = await runtime.snapshot(run_id)
        assert snap.host_task is not None, head.status
        await runtime.submit_host_output(run_id, snap.host_task.task_id, "the work")


# ------------------------------------------------------------------------------- record format


def test_a_chain_policy_is_format_5_and_a_chain_without_one_is_stored_and_hashed_as_before() -> None:
    with_policy = CATALOG.resolve("autonomous")
    without = CATALOG.resolve("person")
    assert chain_format(with_policy) == 5
    assert chain_format(without) == 1
    assert chain_format(CATALOG.resolve("agent-step")) == 3  # a step's approvers, as before
    # Unset, the field is left out of the record, so the snapshot (and its hash) is as before.
    assert "approvers" not in without.model_dump(mode="json")
    stripped = with_policy.model_copy(update={"approvers": None})
    assert stripped.content_hash() != with_policy.content_hash()
    assert "approvers" not in stripped.model_dump(mode="json")
    # And it reads back from the stored fact.
    read = parse_fact(dump_fact(_created(with_policy)))
    assert isinstance(read, RunCreated) and read.chain.approvers == ("agent",) and read.format == 5


async def test_a_run_of_a_chain_policy_reads_back_with_it_from_the_store() -> None:
    store = MemoryStore()
    runtime = make_runtime(store, catalog=CATALOG)
    head = await to_gate(runtime, "autonomous")
    loaded = await store.load(head.run_id)
    assert loaded.chain.approvers == ("agent",) and loaded.format == 5

"""Costs and hard budgets (issue 14, part 2): a budget refuses the exact call that would go over,
before any request leaves; ``on_budget = "ask"`` waits at a gate whose approval raises the budget;
parallel calls reserve their most while in flight; hosts' reported usage is all a host task counts.

The provider runs call the fake provider over real HTTP: every reply reports 11 input and 7 output
tokens, and the server's output limit is 100 tokens, which is what each call reserves."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Literal

import anyio
import httpx2
import pytest

from orchestration.chains.catalog import Catalog
from orchestration.chains.prompts import TaskPrompt
from orchestration.core import StartRequest
from orchestration.core.budget import refusal, with_costs
from orchestration.core.clock import ManualClock, SystemClock
from orchestration.core.costs import Budget, BudgetLimits, HostUsage
from orchestration.core.facts import ApprovalDecided, AttemptStarted, HostOutputSubmitted, TaskCompleted
from orchestration.core.fold import fold
from orchestration.core.models import ChainStep, ExecutionContract, Telemetry, TypedError
from orchestration.core.outcomes import AttemptOutcome, AttemptSucceeded
from orchestration.core.pricing import DEFAULT_PRICES, PRICES_AS_OF, Price, price_table
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from orchestration.errors import InvalidArgument
from orchestration.workers.model_calls import make_http_client
from orchestration.workers.port import DeltaSink
from orchestration.workers.provider_worker import (
    ProviderEndpoint,
    ProviderSettings,
    ProviderWorker,
    contract_resolver,
)
from orchestration.workers.retry import RetryPolicy
from server.cli.grammar import build_parser
from server.cli.main import _runs_with
from server.mcp.elicit import gate_message
from server.views.run_view import run_view
from server.views.timeline import render_timeline
from stores.memory import MemoryStore
from tests.fakes.fake_provider import FakeProvider
from tests.unit.helpers import provider_contract, sequential_ids
from tests.unit.parallel import PARALLEL_CATALOG

MODEL = "claude-test-1"
#: $1000 / $2000 per million tokens: a reply (11 in, 7 out) costs $0.025, a call's most $0.2
PRICE = Price(input_per_mtok=1000.0, output_per_mtok=2000.0)
CHAIN = ("architect", "engineer", "reviewer")


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider({}) as provider:
        yield provider


_clients: list[httpx2.AsyncClient] = []


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while _clients:
        await _clients.pop().aclose()


def runtime_for(fake: FakeProvider, store: MemoryStore | None = None, max_tokens: int = 100) -> Runtime:
    settings = ProviderSettings(
        endpoints={"anthropic": ProviderEndpoint("anthropic", fake.base_url, "k" * 20, "ANTHROPIC_API_KEY")},
        default_model=MODEL,
        max_attempts=3,
        max_tokens=max_tokens,
    )
    http = make_http_client()
    _clients.append(http)
    worker = ProviderWorker(settings, http, rng=lambda: 0.0, policy=RetryPolicy(base_delay_seconds=0.01))
    resolver = with_costs(
        contract_resolver("provider", settings), prices=price_table({MODEL: PRICE}), max_tokens=max_tokens
    )
    return Runtime(
        store or MemoryStore(),
        Catalog.builtin(),
        clock=SystemClock(),
        new_id=sequential_ids(),
        resolve_contract=resolver,
        worker=worker,
    )


async def start(runtime: Runtime, budget: Budget | None, chain: tuple[str, ...] = CHAIN) -> str:
    head, _ = await runtime.start(
        StartRequest("Build it", chain=chain, worker_backend="provider", budget=budget)
    )
    await runtime.drive(head.run_id)
    return head.run_id


# -- the rule, at the exact call -------------------------------------------------------------


@pytest.mark.parametrize(
    "budget",
    [
        # 2 calls spend 2 x 18 tokens; the third would need 36 + 100 > 120
        Budget(max_total_tokens=120),
        # 2 calls cost 2 x $0.025; the third's most is $0.2: 0.05 + 0.2 > 0.24
        Budget(max_cost_usd=0.24),
    ],
    ids=["tokens", "dollars"],
)
async def test_the_budget_refuses_the_third_call_before_its_request(
    fake: FakeProvider, budget: Budget
) -> None:
    runtime = runtime_for(fake)
    run_id = await start(runtime, budget)
    head = await runtime.status(run_id)
    assert head.status == RunStatus.FAILED
    assert head.error is not None and head.error.code == "budget_exhausted"
    assert "reviewer" in head.error.message
    # Exactly two requests reached the provider; the third call was never started.
    assert fake.calls() == {"architect": 1, "engineer": 1}
    assert len(fake.requests()) == 2
    assert head.task("reviewer").status == TaskStatus.FAILED
    facts = await runtime.store.read_facts(run_id)
    assert [f.task_id for f in facts if isinstance(f, AttemptStarted)] == ["architect", "engineer"]
    # The running totals in the head are the fold of the recorded usage.
    assert head.spent is not None
    assert (head.spent.run.input_tokens, head.spent.run.output_tokens) == (22, 14)
    assert head.spent.run.cost_usd == pytest.approx(0.05)
    assert fold(facts).spent == head.spent


async def test_a_budget_that_allows_every_call_lets_the_run_complete(fake: FakeProvider) -> None:
    """The same run with the third call just inside: 36 + 100 <= 136."""
    runtime = runtime_for(fake)
    head = await runtime.status(await start(runtime, Budget(max_total_tokens=136)))
    assert head.status == RunStatus.COMPLETED
    assert len(fake.requests()) == 3


async def test_a_step_budget_refuses_its_step_only(fake: FakeProvider) -> None:
    runtime = runtime_for(fake)
    budget = Budget(steps={"engineer": BudgetLimits(max_total_tokens=99)})
    head = await runtime.status(await start(runtime, budget))
    assert head.status == RunStatus.FAILED and head.error is not None
    assert head.error.code == "budget_exhausted" and "step engineer's budget" in head.error.message
    assert fake.calls() == {"architect": 1}


@pytest.mark.parametrize("on_budget", ["fail", "ask"])
async def test_a_reply_over_max_tokens_is_the_providers_error_and_the_run_spends_no_more(
    fake: FakeProvider, on_budget: Literal["fail", "ask"]
) -> None:
    """Issue 22, finding 12: a provider that reports 1,200 output tokens for a call whose
    max_tokens is 300 (all a 300-token budget allows) overshoots once, by what it reported: that
    usage is recorded and charged as reported, the answer is not used (``over_max_tokens``, not
    retried), and no other call starts."""
    fake.set_scenario({"default": [{"text": "a long answer", "output_tokens": 1200}]})
    runtime = runtime_for(fake, max_tokens=300)
    run_id = await start(runtime, Budget(max_total_tokens=300, on_budget=on_budget))
    head = await runtime.status(run_id)
    assert len(fake.requests()) == 1 and fake.requests()[0]["body"]["max_tokens"] == 300
    architect = head.task("architect")
    assert architect.status == TaskStatus.FAILED and architect.error is not None
    assert architect.error.code == "over_max_tokens" and not architect.error.retryable
    assert (
        "reported 1200 output tokens" in architect.error.message
        and "max_tokens=300" in architect.error.message
    )
    assert head.status == RunStatus.FAILED and head.error is not None
    assert head.error.code == "over_max_tokens"
    facts = await runtime.store.read_facts(run_id)
    assert not any(isinstance(f, TaskCompleted) for f in facts)
    assert head.spent is not None
    assert (head.spent.run.input_tokens, head.spent.run.output_tokens) == (11, 1200)


async def test_a_stream_past_what_max_tokens_can_hold_is_stopped_and_fails_the_task(
    fake: FakeProvider,
) -> None:
    """Issue 25: a streamed answer whose text passes max_tokens x 8 characters (here 300 tokens,
    2,400 characters) cannot have kept to the limit the budget counted on: the stream is stopped
    there (the provider sees the connection close before its answer ends), the task fails with
    over_max_tokens, not retried, and the call is charged max_tokens output tokens."""
    fake.set_scenario({"default": [{"text": "x" * 6000, "chunk_chars": 100, "chunk_delay_seconds": 0.005}]})
    runtime = runtime_for(fake, max_tokens=300)
    run_id = await start(runtime, Budget(max_total_tokens=1000))
    head = await runtime.status(run_id)
    architect = head.task("architect")
    assert architect.status == TaskStatus.FAILED and architect.error is not None
    assert architect.error.code == "over_max_tokens" and not architect.error.retryable
    assert "passed 2400 characters" in architect.error.message
    with anyio.fail_after(5):
        # The fake, on another thread, records the stream once a write finds the connection
        # closed: after the client stopped reading, so possibly after the task failed.
        while not fake.streams():  # noqa: ASYNC110 - the fake runs on another thread
            await anyio.sleep(0.01)
    [stream] = fake.streams()
    assert not stream["finished"] and stream["deltas"] < 60
    assert head.spent is not None and head.spent.run.output_tokens == 300
    assert len(fake.requests()) == 1
    # Without a budget nothing is counted: the same answer is used whole.
    fake.set_scenario({"default": [{"text": "x" * 6000, "chunk_chars": 100}]})
    free = runtime_for(fake, max_tokens=300)
    done = await free.status(await start(free, None, ("architect",)))
    assert done.status == RunStatus.COMPLETED


async def test_a_reply_within_max_tokens_is_used(fake: FakeProvider) -> None:
    """The bound is the request's max_tokens, not the budget: 300 output tokens for a call of
    max_tokens 300 is an answer (and a run without a budget checks nothing)."""
    fake.set_scenario({"default": [{"text": "just fits", "output_tokens": 300}]})
    runtime = runtime_for(fake, max_tokens=300)
    head = await runtime.status(await start(runtime, Budget(max_total_tokens=10_000), chain=("writer",)))
    assert head.status == RunStatus.COMPLETED
    fake.set_scenario({"default": [{"text": "past the limit", "output_tokens": 1200}]})
    head = await runtime.status(await start(runtime, None, chain=("writer",)))
    assert head.status == RunStatus.COMPLETED


# -- ask: a gate that raises the budget --------------------------------------------------------


async def test_ask_waits_at_a_gate_and_approving_with_an_amount_goes_on(fake: FakeProvider) -> None:
    runtime = runtime_for(fake)
    run_id = await start(runtime, Budget(max_total_tokens=120, on_budget="ask"))
    head = await runtime.status(run_id)
    assert head.status == RunStatus.AWAITING_APPROVAL
    gate = head.gate("budget:1")
    assert gate is not None and gate.status == "requested" and gate.task_id == "reviewer"
    assert gate.note is not None and "36 spent" in gate.note and "up to 100" in gate.note
    assert len(fake.requests()) == 2
    view = run_view(await runtime.snapshot(run_id))
    assert view.next_action.kind == "approve" and view.next_action.position == "budget"
    assert view.budget is not None and (view.budget.spent_tokens, view.budget.max_total_tokens) == (36, 120)
    form = gate_message(await runtime.snapshot(run_id), "budget:1")
    assert gate.note in form and "the budget is raised by its original amount again" in form

    # 10 more tokens are not enough (36 + 100 > 130): a second gate.
    await runtime.approve(run_id, "approve", "budget:1", budget_raise=BudgetLimits(max_total_tokens=10))
    await runtime.drive(run_id)
    head = await runtime.status(run_id)
    assert head.status == RunStatus.AWAITING_APPROVAL and head.gate("budget:2") is not None
    assert len(fake.requests()) == 2
    # The default raise is the original budget again: 130 + 120 allows the call.
    await runtime.approve(run_id, "approve", "budget:2")
    await runtime.drive(run_id)
    head = await runtime.status(run_id)
    assert head.status == RunStatus.COMPLETED
    assert len(fake.requests()) == 3
    view = run_view(await runtime.snapshot(run_id))
    assert view.budget is not None and view.budget.max_total_tokens == 250
    assert view.totals.input_tokens == 33 and view.totals.cost_usd == pytest.approx(0.075)
    timeline = render_timeline(head, await runtime.store.read_facts(run_id))
    assert "budget raised by 10 tokens" in timeline and "[11 in / 7 out tokens, $0.0250]" in timeline


async def test_a_raise_goes_only_with_approving_a_budget_gate(fake: FakeProvider) -> None:
    runtime = runtime_for(fake)
    run_id = await start(runtime, Budget(max_total_tokens=120, on_budget="ask"))
    with pytest.raises(InvalidArgument, match="budget raise"):
        await runtime.approve(run_id, "reject", "budget:1", budget_raise=BudgetLimits(max_total_tokens=5))
    await runtime.approve(run_id, "reject", "budget:1")
    assert (await runtime.status(run_id)).status == RunStatus.REJECTED
    assert len(fake.requests()) == 2


async def test_a_dollar_budget_needs_a_price_for_every_model(fake: FakeProvider) -> None:
    runtime = runtime_for(fake)
    with pytest.raises(InvalidArgument, match=r"claude-unpriced has none"):
        await runtime.start(
            StartRequest(
                "x",
                chain=CHAIN,
                worker_backend="provider",
                model="claude-unpriced",
                budget=Budget(max_cost_usd=1),
            )
        )
    with pytest.raises(InvalidArgument, match="not a step"):
        await runtime.start(
            StartRequest(
                "x",
                chain=CHAIN,
                worker_backend="provider",
                budget=Budget(steps={"nope": BudgetLimits(max_total_tokens=1)}),
            )
        )


# -- restarts: the record decides ---------------------------------------------------------------


async def test_an_orphaned_call_is_charged_at_its_most_and_the_retry_checked(fake: FakeProvider) -> None:
    """A process died during the engineer's call: its provider may have billed it, so the fold
    charges it at its most (100 tokens) when the retry starts, and the rule checks the retry with
    the orphan's reservation still held: 18 + 100 + 100 > 200 refuses it."""
    store = MemoryStore()
    runtime = runtime_for(fake, store)
    head, _ = await runtime.start(
        StartRequest("Build it", chain=CHAIN, worker_backend="provider", budget=Budget(max_total_tokens=200))
    )
    await runtime.drive(head.run_id)  # completes: 3 x 18 = 54 tokens
    facts = await store.read_facts(head.run_id)
    second = next(f for f in facts if isinstance(f, AttemptStarted) and f.task_id == "engineer")
    crashed = fold(facts[: second.seq])  # the engineer's call in flight, no outcome
    engineer = crashed.task("engineer")
    assert engineer.status == TaskStatus.RUNNING
    refused = refusal(crashed, engineer)
    assert refused is not None and not refused.wait and "18 spent, up to 100 held" in refused.message


# -- parallel steps: calls in flight reserve their most ----------------------------------------


@dataclass
class Counting:
    """A worker whose calls take a while, counting how many are in flight at once."""

    in_flight: int = 0
    most: int = 0

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await anyio.sleep(0.05)
        self.in_flight -= 1
        return AttemptSucceeded(f"{step.name} done", Telemetry(output_tokens=7))


async def test_parallel_calls_start_only_while_their_reservations_fit() -> None:
    """Three branches ready at once, each call reserving 10 tokens (tests.unit.helpers) and
    spending 7: 25 tokens let two calls be in flight (20), not three (30); the third starts once
    both outcomes replaced their reservations (14 + 10 <= 25); the writer after them would need
    21 + 10 and is refused."""
    worker = Counting()
    runtime = Runtime(
        MemoryStore(),
        PARALLEL_CATALOG,
        clock=ManualClock(),
        new_id=sequential_ids(),
        resolve_contract=provider_contract,
        worker=worker,
        settings=RuntimeSettings(cancel_poll_seconds=0.01),
    )
    head, _ = await runtime.start(
        StartRequest("x", chain="fan-continue", worker_backend="provider", budget=Budget(max_total_tokens=25))
    )
    with anyio.fail_after(20):
        await runtime.drive(head.run_id)
    head = await runtime.status(head.run_id)
    assert worker.most == 2
    assert [head.task(t).status for t in "abc"] == [TaskStatus.DONE] * 3
    assert head.status == RunStatus.FAILED and head.error is not None
    assert head.error.code == "budget_exhausted" and "writer" in head.error.message
    assert head.spent is not None and head.spent.run.total_tokens == 21


async def test_without_a_budget_the_same_branches_run_together() -> None:
    """The control for the test above: without a budget, the three branches are in flight together."""
    worker = Counting()
    runtime = Runtime(
        MemoryStore(),
        PARALLEL_CATALOG,
        clock=ManualClock(),
        new_id=sequential_ids(),
        resolve_contract=provider_contract,
        worker=worker,
        settings=RuntimeSettings(cancel_poll_seconds=0.01),
    )
    head, _ = await runtime.start(StartRequest("x", chain="fan-continue", worker_backend="provider"))
    with anyio.fail_after(20):
        await runtime.drive(head.run_id)
    assert (await runtime.status(head.run_id)).status == RunStatus.COMPLETED
    assert worker.most == 3


# -- host tasks: only what the host reports counts -----------------------------------------------


async def test_host_usage_is_recorded_and_counts_against_the_budget() -> None:
    runtime = Runtime(
        MemoryStore(),
        Catalog.builtin(),
        clock=ManualClock(),
        new_id=sequential_ids(),
        resolve_contract=with_costs(provider_contract, prices={}, max_tokens=None),
    )
    head, _ = await runtime.start(StartRequest("x", chain=CHAIN, budget=Budget(max_total_tokens=1000)))
    run_id = head.run_id
    await runtime.drive(run_id)
    usage = HostUsage(input_tokens=600, output_tokens=500, cost_usd=0.02)
    await runtime.submit_host_output(run_id, "architect", "the design", usage)
    await runtime.drive(run_id)
    head = await runtime.status(run_id)
    # 1100 reported > 1000: the next host task is not handed out.
    assert head.status == RunStatus.FAILED and head.error is not None
    assert head.error.code == "budget_exhausted" and "1100 spent" in head.error.message
    facts = await runtime.store.read_facts(run_id)
    submitted = next(f for f in facts if isinstance(f, HostOutputSubmitted))
    assert submitted.usage == usage
    done = next(f for f in facts if isinstance(f, TaskCompleted))
    assert done.telemetry.reported_by_host and done.telemetry.cost_usd == 0.02
    view = run_view(await runtime.snapshot(run_id))
    attempt = view.tasks[0].attempts[0]
    assert attempt.telemetry.reported_by_host and attempt.telemetry.input_tokens == 600
    assert "reported by the host: 600 in / 500 out tokens, $0.0200" in render_timeline(head, facts)


async def test_host_tasks_without_reported_usage_spend_nothing() -> None:
    runtime = Runtime(
        MemoryStore(),
        Catalog.builtin(),
        clock=ManualClock(),
        new_id=sequential_ids(),
        resolve_contract=with_costs(provider_contract, prices={}, max_tokens=None),
    )
    head, _ = await runtime.start(StartRequest("x", chain=("architect",), budget=Budget(max_total_tokens=1)))
    await runtime.drive(head.run_id)
    await runtime.submit_host_output(head.run_id, "architect", "the design")
    await runtime.drive(head.run_id)
    head = await runtime.status(head.run_id)
    assert head.status == RunStatus.COMPLETED and head.spent is None


# -- prices ---------------------------------------------------------------------------------------


def test_default_prices_are_dated_and_overridable() -> None:
    assert DEFAULT_PRICES["claude-sonnet-4-5"].source == f"default {PRICES_AS_OF}"
    table = price_table({"claude-sonnet-4-5": Price(input_per_mtok=1, output_per_mtok=2)})
    assert table["claude-sonnet-4-5"].source == "config" and table["gpt-4o"] == DEFAULT_PRICES["gpt-4o"]


async def test_a_run_without_a_budget_still_shows_its_cost(fake: FakeProvider) -> None:
    runtime = runtime_for(fake)
    run_id = await start(runtime, None)
    head = await runtime.status(run_id)
    assert head.status == RunStatus.COMPLETED and head.format < 4
    view = run_view(await runtime.snapshot(run_id))
    assert view.budget is None
    assert view.totals.cost_usd == pytest.approx(0.075)
    assert view.tasks[0].attempts[0].telemetry.cost_usd == pytest.approx(0.025)


async def test_the_cli_approves_a_budget_gate_with_an_amount(fake: FakeProvider) -> None:
    runtime = runtime_for(fake)
    run_id = await start(runtime, Budget(max_total_tokens=120, on_budget="ask"))
    out = io.StringIO()
    argv = ["runs", "approve", run_id, "--gate-id", "budget:1", "--json"]
    with pytest.raises(InvalidArgument, match="must be positive"):
        await _runs_with(runtime, build_parser().parse_args([*argv, "--raise-tokens", "0"]), out)
    assert await _runs_with(runtime, build_parser().parse_args([*argv, "--raise-tokens", "16"]), out) == 0
    head = await runtime.status(run_id)
    assert head.status == RunStatus.COMPLETED and len(fake.requests()) == 3
    decided = [f for f in await runtime.store.read_facts(run_id) if isinstance(f, ApprovalDecided)]
    assert [(d.channel, d.budget_raise) for d in decided] == [("cli", BudgetLimits(max_total_tokens=16))]


async def test_a_parallel_run_asks_at_a_budget_gate_and_goes_on_once_approved() -> None:
    worker = Counting()
    runtime = Runtime(
        MemoryStore(),
        PARALLEL_CATALOG,
        clock=ManualClock(),
        new_id=sequential_ids(),
        resolve_contract=provider_contract,
        worker=worker,
        settings=RuntimeSettings(cancel_poll_seconds=0.01),
    )
    budget = Budget(max_total_tokens=25, on_budget="ask")
    head, _ = await runtime.start(
        StartRequest("x", chain="fan-continue", worker_backend="provider", budget=budget)
    )
    with anyio.fail_after(20):
        await runtime.drive(head.run_id)
    head = await runtime.status(head.run_id)
    assert head.status == RunStatus.AWAITING_APPROVAL and worker.most == 2
    gate = head.gate("budget:1")
    assert gate is not None and gate.task_id == "writer" and head.task("writer").status == TaskStatus.PENDING
    await runtime.approve(head.run_id, "approve", "budget:1")
    with anyio.fail_after(20):
        await runtime.drive(head.run_id)
    head = await runtime.status(head.run_id)
    assert head.status == RunStatus.COMPLETED and head.spent is not None and head.spent.run.total_tokens == 28

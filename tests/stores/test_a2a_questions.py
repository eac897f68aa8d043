"""An A2A agent's question as a gate of the run, against a real peer (the a2a-sdk's own server
around the scripted executor of :mod:`tests.fakes.a2a_peer`, which asks "Which branch?" and
completes with the answer), on every store: the gate shows the question, naming the step and the
agent; approving it with a comment records the answer first, then sends it once as the task's next
message (its id derived from the run, the task, the attempt and the question), and the step
completes with the remote's artifact; a second question is a second gate; a reject fails the step
and cancels the remote task; so does a cancel at the gate; and a send cut short by a crash is made
again on restart with the same message id (marked a possible duplicate only when it had begun)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import orchestration.engine.drive as drive_module
from orchestration.chains import Catalog
from orchestration.core import StartRequest
from orchestration.core.agent_steps import answer_message_id, message_id
from orchestration.core.decide import Action, AwaitAgent, AwaitApproval, next_action
from orchestration.core.facts import AgentAnswerSending, AgentAnswerSent, AgentQuestionAsked, ApprovalDecided
from orchestration.core.fold import fold
from orchestration.core.models import RunHead
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.agent_questions import answer_to_send
from orchestration.engine.agent_waits import awaited
from orchestration.engine.runtime import Runtime
from orchestration.errors import InvalidArgument, InvalidState
from orchestration.store import RunStore
from orchestration.workers.a2a_agents import A2AWorker
from server.views.next_step import next_step
from server.views.run_view import run_view
from tests.fakes.a2a_peer import ScriptedExecutor, serving
from tests.stores.test_a2a_agent_steps import TOKEN, catalog, runtime
from tests.unit.engine.test_crash_prefixes import BoundaryStore
from tests.unit.helpers import play


@pytest.fixture
def executor() -> ScriptedExecutor:
    return ScriptedExecutor(work_seconds=0.1, slow_seconds=30)


@pytest.fixture
def peer(executor: ScriptedExecutor) -> Iterator[str]:
    with serving(executor, token=TOKEN) as url:
        yield url


async def follow_all(rt: Runtime, run_id: str) -> None:
    """What the dispatcher's follower does: follow each remote task the run awaits."""
    for wait in awaited(await rt.status(run_id)):
        await rt.agent_waits.follow(run_id, wait)


async def at_question(rt: Runtime, message: str = "ask me") -> str:
    """A run of the delegated chain whose review step's remote task asks its question; its id."""
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    await rt.drive(head.run_id)
    await rt.submit_host_output(head.run_id, "architect", "the design")
    await rt.drive(head.run_id)
    assert (await rt.status(head.run_id)).status == RunStatus.AWAITING_AGENT
    await follow_all(rt, head.run_id)
    return head.run_id


async def fact_types(store: RunStore, run_id: str) -> list[str]:
    head = await store.load(run_id)
    return [f.type for f in await store.read_facts(run_id, 0, head.last_seq)]


async def test_the_question_is_a_gate_whose_answer_is_sent_once_and_completes_the_step(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    rt, _, _ = runtime(store, peer, catalog_=catalog("ask me"))
    run_id = await at_question(rt)
    waiting = await rt.status(run_id)
    assert waiting.status == RunStatus.AWAITING_APPROVAL
    gate = waiting.gate("question:review:1")
    assert gate is not None and gate.status == "requested" and gate.note == "Which branch?"
    assert gate.agent == "peer" and gate.task_id == "review"
    remote = waiting.task("review").attempts[-1].remote_run_id
    # the run's view asks the question, naming the step and the agent; nobody follows the task
    action = next_step(await rt.snapshot(run_id))
    assert action.kind == "approve" and action.gate_id == "question:review:1"
    assert "Which branch?" in action.guards and "peer" in action.guards and "'review'" in action.guards
    assert set(action.choices) == {"approve", "reject"}
    assert awaited(waiting) == []
    # the run's gates (what the page shows) carry the question too, and its decisions
    [shown] = run_view(await rt.snapshot(run_id), "full").gates
    assert shown.agent == "peer" and shown.decisions == ["approve", "reject"]
    assert shown.description is not None and "peer" in shown.description
    assert "Which branch?" in shown.description
    # an approval without the answer is refused, and so is a revise
    with pytest.raises(InvalidArgument):
        await rt.approve(run_id, "approve", "question:review:1", None, "ann")
    with pytest.raises(InvalidArgument):
        await rt.approve(run_id, "revise", "question:review:1", "main", "ann")
    answered = await rt.approve(run_id, "approve", "question:review:1", "main", "ann", channel="stdio")
    assert answered.status == RunStatus.AWAITING_AGENT
    assert executor.answers == []  # recorded first; the follower sends it
    await follow_all(rt, run_id)
    done = await play(rt, run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert (await rt.snapshot(run_id)).outputs["review"] == "answered: main"
    sent = answer_message_id(run_id, "review", 1, 1)
    assert [(t, m, text) for t, _, m, text in executor.answers] == [(remote, sent, "main")]
    assert executor.message_ids == [message_id(f"construct:{run_id}:review:1"), sent]
    facts = await store.read_facts(run_id, 0, done.last_seq)
    [decided] = [f for f in facts if f.type == "approval_decided"]
    assert (decided.approver, decided.channel, decided.comment) == ("ann", "stdio", "main")
    [sending] = [f for f in facts if f.type == "agent_answer_sending"]
    assert sending.possible_duplicate_call is False
    types = [f.type for f in facts]
    asked = types.index("agent_question_asked")
    assert types[asked : asked + 4] == [
        "agent_question_asked",
        "approval_decided",
        "agent_answer_sending",
        "agent_answer_sent",
    ]
    assert max(f.format for f in facts) == 8


async def test_a_data_part_of_the_question_is_shown_as_json(store: RunStore, peer: str) -> None:
    rt, _, _ = runtime(store, peer, catalog_=catalog("ask data"))
    run_id = await at_question(rt)
    gate = (await rt.status(run_id)).gate("question:review:1")
    assert gate is not None and gate.note is not None
    text, data = gate.note.split("\n")
    assert text == "Which branch?" and json.loads(data) == {"choices": ["main", "dev"]}
    await rt.cancel(run_id)


async def test_a_second_question_is_a_second_gate_each_answer_its_own_fact(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    rt, _, _ = runtime(store, peer, catalog_=catalog("ask me"))
    run_id = await at_question(rt)
    await rt.approve(run_id, "approve", "question:review:1", "again: which one?", "ann")
    await follow_all(rt, run_id)
    waiting = await rt.status(run_id)
    assert waiting.status == RunStatus.AWAITING_APPROVAL
    second = waiting.gate("question:review:2")
    assert second is not None and second.note == "Which file?" and second.status == "requested"
    await rt.approve(run_id, "approve", "question:review:2", "src/app.py", "bob")
    await follow_all(rt, run_id)
    done = await play(rt, run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert (await rt.snapshot(run_id)).outputs["review"] == "answered: src/app.py"
    assert [(m, text) for _, _, m, text in executor.answers] == [
        (answer_message_id(run_id, "review", 1, 1), "again: which one?"),
        (answer_message_id(run_id, "review", 1, 2), "src/app.py"),
    ]
    facts = await store.read_facts(run_id, 0, done.last_seq)
    decided = [f for f in facts if f.type == "approval_decided" and f.gate_id.startswith("question:")]
    assert [(f.gate_id, f.approver) for f in decided] == [
        ("question:review:1", "ann"),
        ("question:review:2", "bob"),
    ]


async def test_a_rejected_question_fails_the_step_and_cancels_the_remote_task(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    rt, _, _ = runtime(store, peer, catalog_=catalog("ask me"))
    run_id = await at_question(rt)
    remote = (await rt.status(run_id)).task("review").attempts[-1].remote_run_id
    await rt.approve(run_id, "reject", "question:review:1", "not telling", "ann")
    done = await play(rt, run_id)
    assert done.status == RunStatus.FAILED
    review = (await rt.snapshot(run_id)).head.task("review")
    assert review.error is not None and review.error.code == "agent_input_declined"
    assert "not telling" in review.error.message and len(review.attempts) == 1  # not retried
    assert executor.cancelled == [remote] and executor.answers == []
    facts = await store.read_facts(run_id, 0, done.last_seq)
    [cancel] = [f for f in facts if f.type == "remote_run_cancelled"]
    assert cancel.cancelled is True


async def test_cancelling_the_run_at_the_question_cancels_the_remote_task(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    rt, _, _ = runtime(store, peer, catalog_=catalog("ask me"))
    run_id = await at_question(rt)
    remote = (await rt.status(run_id)).task("review").attempts[-1].remote_run_id
    cancelled = await rt.cancel(run_id, reason="no time")
    assert cancelled.status == RunStatus.CANCELLED
    assert executor.cancelled == [remote]
    assert "remote_run_cancelled" in await fact_types(store, run_id)


class Crash(BaseException):
    """Stands for SIGKILL: nothing of the process's own handles it."""


async def test_a_crash_before_the_send_sends_the_same_message_once_on_restart(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    """The answer is recorded and the process dies before sending it: the restarted follower
    sends it (the same message id), not marked a duplicate: no send had begun."""
    first, _, clock = runtime(store, peer, catalog_=catalog("ask me"))
    run_id = await at_question(first)
    await first.approve(run_id, "approve", "question:review:1", "main", "ann")
    second, _, _ = runtime(store, peer, owner="p2", clock=clock, catalog_=catalog("ask me"))
    await follow_all(second, run_id)
    done = await play(second, run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert [m for _, _, m, _ in executor.answers] == [answer_message_id(run_id, "review", 1, 1)]
    facts = await store.read_facts(run_id, 0, done.last_seq)
    assert [f.possible_duplicate_call for f in facts if f.type == "agent_answer_sending"] == [False]


async def test_a_send_cut_short_is_made_again_with_the_same_id_marked_a_possible_duplicate(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    """The process dies during the send (``agent_answer_sending`` recorded, nothing after): the
    restarted follower sends the same message id, marked ``possible_duplicate_call``."""
    first, worker, clock = runtime(store, peer, catalog_=catalog("ask me"))
    run_id = await at_question(first)
    await first.approve(run_id, "approve", "question:review:1", "main", "ann")

    async def crash(self: A2AWorker, *args: Any) -> Any:
        raise Crash

    worker.answer_question = partial(crash, worker)  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await follow_all(first, run_id)
    assert (await fact_types(store, run_id))[-1] == "agent_answer_sending"
    second, _, _ = runtime(store, peer, owner="p2", clock=clock, catalog_=catalog("ask me"))
    await follow_all(second, run_id)
    done = await play(second, run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    sent = answer_message_id(run_id, "review", 1, 1)
    assert [m for _, _, m, _ in executor.answers] == [sent]
    facts = await store.read_facts(run_id, 0, done.last_seq)
    sending = [f for f in facts if f.type == "agent_answer_sending"]
    assert [(f.message_id, f.possible_duplicate_call) for f in sending] == [(sent, False), (sent, True)]
    assert (await second.snapshot(run_id)).head.task("review").attempts[0].telemetry.possible_duplicate_call


async def test_a_send_that_reached_the_agent_before_a_crash_is_not_made_again(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    """The process dies after the agent took the answer, before ``agent_answer_sent``: the
    restarted follower sees the task no longer asks that question, records the answer as sent
    and sends nothing more; the step completes with one answer at the agent."""
    first, worker, clock = runtime(store, peer, catalog_=catalog("ask me"))
    run_id = await at_question(first)
    await first.approve(run_id, "approve", "question:review:1", "main", "ann")
    original = A2AWorker.answer_question

    async def send_then_crash(self: A2AWorker, *args: Any) -> Any:
        await original(self, *args)
        raise Crash

    worker.answer_question = partial(send_then_crash, worker)  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await follow_all(first, run_id)
    assert (await fact_types(store, run_id))[-1] == "agent_answer_sending"
    second, _, _ = runtime(store, peer, owner="p2", clock=clock, catalog_=catalog("ask me"))
    await follow_all(second, run_id)
    done = await play(second, run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert [m for _, _, m, _ in executor.answers] == [answer_message_id(run_id, "review", 1, 1)]
    types = await fact_types(store, run_id)
    assert types.count("agent_answer_sending") == 1 and types.count("agent_answer_sent") == 1
    assert (await second.snapshot(run_id)).outputs["review"] == "answered: main"


async def test_every_prefix_of_a_run_that_asks_decides_as_the_uninterrupted_run(
    peer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one rule, for the question's facts: after every durable write of a run whose agent
    asked twice, the fold of the log decides as the run did (the drive's decisions, recorded),
    and a prefix that ends at a follower's write says what a follower does next: wait at the
    question's gate, send the decided answer (a possible duplicate once its send had begun), or
    follow the task."""
    decided: dict[int, Action] = {}

    def recording(head: RunHead, now: datetime) -> Action:
        action = next_action(head, now)
        decided.setdefault(head.last_seq, action)
        return action

    monkeypatch.setattr(drive_module, "next_action", recording)
    store = BoundaryStore()
    rt, _, _ = runtime(store, peer, catalog_=catalog("ask me"))
    run_id = await at_question(rt)
    await rt.approve(run_id, "approve", "question:review:1", "again", "ann")
    await follow_all(rt, run_id)
    await rt.approve(run_id, "approve", "question:review:2", "src/app.py", "ann")
    await follow_all(rt, run_id)
    final = await play(rt, run_id)
    assert final.status == RunStatus.COMPLETED, final.error
    facts = await store.read_facts(run_id)
    now = rt.clock.now()
    seen: set[str] = set()
    for prefix_len in store.boundaries:
        folded = fold(facts[:prefix_len])
        last = facts[prefix_len - 1]
        action = next_action(folded, now)
        attempt = folded.task("review").attempts[-1] if folded.task("review").attempts else None
        wait = None if attempt is None else AwaitAgent("review", attempt.number, attempt.remote_run_id or "")
        if isinstance(last, AgentQuestionAsked):
            assert action == AwaitApproval(last.gate_id) and awaited(folded) == []
        elif isinstance(last, ApprovalDecided) and last.gate_id.startswith("question:"):
            assert action == wait and wait is not None
            gate = answer_to_send(folded, wait)
            assert gate is not None and gate.gate_id == last.gate_id and attempt is not None
            assert not attempt.answer_sending  # a first send: not a duplicate
        elif isinstance(last, AgentAnswerSending):
            assert action == wait and wait is not None and attempt is not None
            gate = answer_to_send(folded, wait)
            assert gate is not None and attempt.answer_sending  # its resend would be marked
        elif isinstance(last, AgentAnswerSent):
            assert action == wait and wait is not None and answer_to_send(folded, wait) is None
        else:
            if prefix_len in decided:
                assert action == decided[prefix_len], f"prefix {prefix_len}"
            continue
        seen.add(last.type)
    assert seen == {"agent_question_asked", "approval_decided", "agent_answer_sending", "agent_answer_sent"}


async def test_a_question_in_a_parallel_chain_holds_only_its_branch(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    """Two A2A steps side by side: the one whose agent asks waits at its gate while the other
    completes; the run shows the gate (``awaiting_approval``), and once answered goes on to the
    writer, which sees both outputs."""
    steps = [
        {"specialist": "architect", "after": []},
        {"name": "left", "agent": "peer", "message": "ask {outputs.architect}", "after": ["architect"]},
        {"name": "right", "agent": "peer", "message": "right {outputs.architect}", "after": ["architect"]},
        {"specialist": "writer", "after": ["left", "right"]},
    ]
    raw = {"agents": {"peer": {"protocol": "a2a", "url": peer}}, "chains": {"delegated": {"steps": steps}}}
    parallel = Catalog.builtin().extended(raw, "construct.toml", Path("."))
    rt, _, _ = runtime(store, peer, catalog_=parallel)
    head, _ = await rt.start(StartRequest(request="the cache", chain="delegated"))
    await rt.drive(head.run_id)
    await rt.submit_host_output(head.run_id, "architect", "the design")
    await rt.drive(head.run_id)
    await follow_all(rt, head.run_id)
    waiting = await rt.status(head.run_id)
    assert waiting.status == RunStatus.AWAITING_APPROVAL
    assert waiting.task("right").status.value == "done"
    gate = waiting.gate("question:left:1")
    assert gate is not None and gate.status == "requested" and gate.note == "Which branch?"
    await rt.approve(head.run_id, "approve", "question:left:1", "main", "ann")
    await follow_all(rt, head.run_id)
    done = await play(rt, head.run_id)
    assert done.status == RunStatus.COMPLETED, done.error
    snap = await rt.snapshot(head.run_id)
    assert snap.outputs["left"] == "answered: main" and snap.outputs["right"].startswith("reviewed:")
    assert len(executor.answers) == 1


async def test_a_question_whose_step_ran_out_of_time_is_moot(
    store: RunStore, peer: str, executor: ScriptedExecutor
) -> None:
    """The step's time runs out while its agent's question waits: the drive fails the step with
    ``deadline_exceeded`` and cancels the remote task; the gate, left undecided, takes no
    decision (``invalid_state``) and is no longer offered, and the run goes on (the step's
    ``on_failure = "continue"``)."""
    step = {
        "name": "review",
        "agent": "peer",
        "message": "ask me",
        "timeout_seconds": 60,
        "on_failure": "continue",
    }
    raw = {
        "agents": {"peer": {"protocol": "a2a", "url": peer}},
        "chains": {"delegated": {"steps": ["architect", step, "writer"]}},
    }
    timed = Catalog.builtin().extended(raw, "construct.toml", Path("."))
    rt, _, clock = runtime(store, peer, catalog_=timed)
    run_id = await at_question(rt)
    remote = (await rt.status(run_id)).task("review").attempts[-1].remote_run_id
    clock.advance(61)
    await rt.drive(run_id)
    head = await rt.status(run_id)
    review = (await rt.snapshot(run_id)).head.task("review")
    assert review.error is not None and review.error.code == "deadline_exceeded"
    assert executor.cancelled == [remote]
    with pytest.raises(InvalidState):
        await rt.approve(run_id, "approve", "question:review:1", "main", "ann")
    action = next_step(await rt.snapshot(run_id))
    assert action.kind != "approve" or action.gate_id != "question:review:1"
    view_gate = next(
        g for g in run_view(await rt.snapshot(run_id), "full").gates if g.gate_id.startswith("q")
    )
    assert view_gate.decisions == []
    done = await play(rt, run_id)
    assert done.status == RunStatus.COMPLETED_WITH_FAILURES, (head.status, done.error)

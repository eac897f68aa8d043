"""An A2A agent's question as a gate of the run (what a user sees: docs/chains.md, Agents).

A remote A2A task that stops at ``input-required`` does not fail its step: the follower of the
remote task (:mod:`orchestration.engine.agent_waits`) records ``agent_question_asked``, which
requests a ``question`` gate of this run whose note is the remote's question (its text parts; a
data part as JSON), naming the step (``task_id``) and the agent. The attempt parks there: the run
is ``awaiting_approval``, nobody follows the remote task, no lease or slot is held.

The gate is decided as any gate (``orchestrate_approve``, the CLI, the run page, a form), by the
same approvers (the step's ``approvers``, else the chain's):

- ``approve`` with ``comment``: the comment is the answer (required, as the text sent back).
  ``approval_decided`` records it first, with who answered, whether verified, and the channel;
  the run is ``awaiting_agent`` again and its follower sends the answer as the remote task's next
  message (the same ``taskId`` and ``contextId``), then follows the task on. The send is
  bracketed by two facts, as a provider call is: ``agent_answer_sending`` before it,
  ``agent_answer_sent`` after. The message id is derived from the run, the task, the attempt and
  the question's number (:func:`~orchestration.core.agent_steps.answer_message_id`), so an
  answer resent after a crash is the same message. A send never begun (the process died between
  the decision and the send) is made as the first. A send found begun but not ended (the process
  died during it) is first checked against the task: one that no longer asks that question took
  the answer (``agent_answer_sent`` is recorded, nothing resent); one that still asks, or cannot
  be read, gets the same message again, marked ``possible_duplicate_call``.
- ``reject``: the step fails with ``agent_input_declined`` (not retried; the run then fails or
  goes on by the step's ``on_failure``), and the remote task is cancelled (``tasks/cancel``) in
  the write that records the decision, as a cancel of the run at the gate does.
- ``revise`` is refused: there is no work of this run to redo.

A remote task that asks again makes the next gate (``question:<task>:2``, ...), each answer its
own fact. A send the agent refuses is the attempt's failed outcome, retried by the step's policy:
the next attempt follows the same remote task, and a question it still asks is asked again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestration.core.clock import Clock
from orchestration.core.decide import AwaitAgent
from orchestration.core.facts import AgentAnswerSending, AgentAnswerSent, AgentQuestionAsked, Fact
from orchestration.core.fold import apply_write
from orchestration.core.models import GateState, RunHead
from orchestration.engine.changes import ChangeFeed
from orchestration.errors import RunNotFound, VersionConflict
from orchestration.store import RunStore
from orchestration.workers.agent_calls import RemoteQuestion

log = logging.getLogger("construct.agent_waits")


def question_gate_id(task_id: str, number: int) -> str:
    """The id of the ``number``-th question gate of task ``task_id`` (1, 2, ...)."""
    return f"question:{task_id}:{number}"


def questions_of(head: RunHead, task_id: str) -> list[GateState]:
    """The task's ``question`` gates, in the order they were asked."""
    return [g for g in head.gates if g.position == "question" and g.task_id == task_id]


def answer_to_send(head: RunHead, wait: AwaitAgent) -> GateState | None:
    """The question gate whose answer the followed attempt ``wait`` has still to send: decided
    ``approved``, no ``agent_answer_sent`` yet. None: nothing to send."""
    last = head.task(wait.task_id).attempts[-1]
    if last.number != wait.attempt or last.question is None:
        return None
    gate = head.gate(last.question)
    return gate if gate is not None and gate.status == "approved" else None


def already_asked(head: RunHead, wait: AwaitAgent, question: RemoteQuestion) -> bool:
    """Whether ``question`` is one the attempt's remote task asked already and that was answered:
    the remote shows it until it takes the answer, so it is not asked twice."""
    if question.asked_id is None:
        return False
    return any(
        g.asked_id == question.asked_id and g.attempt == wait.attempt
        for g in questions_of(head, wait.task_id)
    )


def question_asked(
    head: RunHead, wait: AwaitAgent, agent: str, question: RemoteQuestion, clock: Clock
) -> Fact:
    """The ``agent_question_asked`` fact of ``question``, the task's next question gate."""
    number = len(questions_of(head, wait.task_id)) + 1
    return AgentQuestionAsked(
        seq=head.last_seq + 1,
        at=clock.now(),
        task_id=wait.task_id,
        attempt=wait.attempt,
        agent=agent,
        remote_run_id=wait.remote_run_id,
        context_id=question.context_id,
        gate_id=question_gate_id(wait.task_id, number),
        number=number,
        question=question.text,
        asked_id=question.asked_id,
    )


def answer_sending(head: RunHead, wait: AwaitAgent, gate: GateState, message_id: str, clock: Clock) -> Fact:
    """The ``agent_answer_sending`` fact before the answer at ``gate`` is sent: a possible
    duplicate when a send of it was begun before and never recorded as ended."""
    last = head.task(wait.task_id).attempts[-1]
    return AgentAnswerSending(
        seq=head.last_seq + 1,
        at=clock.now(),
        task_id=wait.task_id,
        attempt=wait.attempt,
        gate_id=gate.gate_id,
        message_id=message_id,
        possible_duplicate_call=last.answer_sending,
    )


def answer_sent(head: RunHead, wait: AwaitAgent, gate: GateState, message_id: str, clock: Clock) -> Fact:
    """The ``agent_answer_sent`` fact once the agent took the answer at ``gate``."""
    return AgentAnswerSent(
        seq=head.last_seq + 1,
        at=clock.now(),
        task_id=wait.task_id,
        attempt=wait.attempt,
        gate_id=gate.gate_id,
        message_id=message_id,
    )


async def write_while(
    store: RunStore,
    changes: ChangeFeed,
    run_id: str,
    build: Callable[[RunHead], Fact | None],
) -> RunHead | None:
    """Record the fact ``build`` makes of the run as it is (None: nothing to record now) in one
    compare-and-swap write, read again and built again after a conflict. The head written, or
    None when nothing was."""
    while True:
        try:
            head = await store.load(run_id)
        except RunNotFound:
            return None
        fact = build(head)
        if fact is None:
            return None
        try:
            stored = await store.append(run_id, head.version, [fact], apply_write(head, [fact]))
        except VersionConflict:
            continue
        log.info("%s recorded", fact.type, extra={"action": fact.type, "run_id": run_id})
        await changes.recorded([fact], stored)
        return stored


__all__ = [
    "already_asked",
    "answer_sending",
    "answer_sent",
    "answer_to_send",
    "question_asked",
    "question_gate_id",
    "questions_of",
    "write_while",
]

"""Runs ``awaiting_agent``: an agent step's remote run followed outside any drive, holding no lease
and no dispatcher slot (what a user sees: docs/chains.md, Agents).

A follower only reads the remote run; the step's outcome is recorded in one compare-and-swap write,
made only while the task is still in that attempt waiting on that remote run, so of several
followers (processes, the sweep) one write wins, and a cancel, a deadline or an earlier recorder
leaves nothing to write. A write that ends the wait cancels the remote runs first and records each
result in that same write (:func:`giving_up`). A remote A2A task that asks a question is recorded
as a gate of the run and the follower stops; once the gate is answered, the follower sends the
answer before it polls again (:mod:`orchestration.engine.agent_questions`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import anyio
from anyio.abc import TaskGroup

from orchestration.core.action_facts import outcome_fact
from orchestration.core.agent_steps import answer_message_id
from orchestration.core.clock import Clock
from orchestration.core.decide import AwaitAgent, StartAttempt
from orchestration.core.facts import Fact, RemoteRunCancelled, RunCancelled
from orchestration.core.fold import apply_write
from orchestration.core.graph import awaits_agent, has_agent_steps, parked_question
from orchestration.core.models import GateState, RunHead, TypedError
from orchestration.core.outcomes import AttemptOutcome
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.agent_questions import (
    already_asked,
    answer_sending,
    answer_sent,
    answer_to_send,
    question_asked,
    write_while,
)
from orchestration.engine.changes import ChangeFeed, ChangeListener
from orchestration.engine.delegation import agent_worker, build_call
from orchestration.errors import RunNotFound, VersionConflict
from orchestration.store import RunStore
from orchestration.workers.agent_calls import AgentDelegate, AgentEndpoint, AnswersQuestions, RemoteQuestion
from orchestration.workers.agent_polls import TERMINAL_STATUSES, PollPacing, protocol_message
from orchestration.workers.port import TaskWorker

log = logging.getLogger("construct.agent_waits")

#: poll errors that are an answer this code cannot read (not a failure to reach the agent)
_UNREADABLE = frozenset({"malformed_response", "tool_error"})

#: the statuses a run awaiting an agent may show (a parallel run's summary puts a host task, a
#: gate or a child before it); the sweep reads every page of the first, the newest of the others
_SWEPT = (
    RunStatus.AWAITING_AGENT,
    RunStatus.AWAITING_HOST,
    RunStatus.AWAITING_APPROVAL,
    RunStatus.AWAITING_CHILDREN,
)


class AgentRuntime(Protocol):
    """What :class:`AgentWaits` uses of the runtime that made it."""

    store: RunStore
    clock: Clock
    changes: ChangeFeed
    worker: TaskWorker | None

    @property
    def stopping(self) -> bool: ...

    def add_listener(self, listener: ChangeListener) -> None: ...


def awaited(head: RunHead) -> list[AwaitAgent]:
    """The remote runs the run awaits, one per task whose attempt waits for its agent (none in a
    chain without agent steps: only their attempts wait for a remote run)."""
    if head.status.is_terminal or not has_agent_steps(head.chain):
        return []
    out = []
    for task in head.tasks:
        if awaits_agent(task):
            last = task.attempts[-1]
            assert last.remote_run_id is not None
            out.append(AwaitAgent(task.task_id, last.number, last.remote_run_id))
    return out


def held(head: RunHead) -> list[AwaitAgent]:
    """The remote runs the run holds: those it awaits (:func:`awaited`), and those whose question
    is a gate of the run (parked: :mod:`orchestration.engine.agent_questions`). A write that ends
    the hold of one cancels it (:func:`giving_up`)."""
    if head.status.is_terminal or not has_agent_steps(head.chain):
        return []
    out = []
    for task in head.tasks:
        if awaits_agent(task) or parked_question(task) is not None:
            last = task.attempts[-1]
            assert last.remote_run_id is not None
            out.append(AwaitAgent(task.task_id, last.number, last.remote_run_id))
    return out


def _still_awaits(head: RunHead, wait: AwaitAgent) -> bool:
    return wait in awaited(head)


class AgentWaits:
    """The followers of the runs awaiting agents, in one runtime (see the module's docstring)."""

    def __init__(self, runtime: AgentRuntime) -> None:
        self._runtime = runtime
        self.store = runtime.store
        self.clock = runtime.clock
        self.changes = runtime.changes
        #: ``(run_id, task_id, attempt)`` of every remote run followed in this process now
        self.following: set[tuple[str, str, int]] = set()
        self._tg: TaskGroup | None = None
        self._stop: anyio.Event | None = None
        runtime.add_listener(self.changed)

    # -- running the followers -----------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the followers until :meth:`stop` (or cancelled): the dispatcher's part."""
        self._stop = anyio.Event()
        if self._runtime.stopping:
            self._stop.set()  # stopped before it ran
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            try:
                await self._stop.wait()
            finally:
                self._tg = None
                tg.cancel_scope.cancel()

    def stop(self) -> None:
        """Stop every follower (a server shutting down: the next sweep picks their runs up)."""
        if self._stop is not None:
            self._stop.set()

    async def changed(self, head: RunHead) -> None:
        """After every write: follow what the run now awaits (when the followers run here)."""
        if self._tg is not None:
            for wait in awaited(head):
                self._spawn(head.run_id, wait)

    def _spawn(self, run_id: str, wait: AwaitAgent) -> bool:
        key = (run_id, wait.task_id, wait.attempt)
        if self._tg is None or key in self.following or self._runtime.stopping:
            return False
        self.following.add(key)
        self._tg.start_soon(self._follow_guarded, run_id, wait, key)
        return True

    async def _follow_guarded(self, run_id: str, wait: AwaitAgent, key: tuple[str, str, int]) -> None:
        try:
            await self.follow(run_id, wait)
        except Exception as exc:  # logged; the sweep tries again
            log.warning(
                "following remote run %s of run %s stopped: %s",
                wait.remote_run_id,
                run_id,
                exc,
                extra={"action": "agent_wait_failed", "run_id": run_id},
            )
        finally:
            self.following.discard(key)

    async def sweep(self, limit: int = 100) -> int:
        """Start a follower for every run awaiting an agent that nobody here follows (every run
        ``awaiting_agent``, page by page; of the runs whose summary shows another pause first,
        the newest ``limit`` of each status). Returns how many were started."""
        started = 0
        for status in _SWEPT:
            cursor: str | None = None
            while True:
                page = await self.store.list_runs(frozenset({status}), limit, cursor)
                for head in page.runs:
                    started += sum(self._spawn(head.run_id, wait) for wait in awaited(head))
                cursor = page.next_cursor
                if cursor is None or status != RunStatus.AWAITING_AGENT:
                    break
        return started

    # -- one remote run ------------------------------------------------------------------------

    async def follow(self, run_id: str, wait: AwaitAgent) -> bool:
        """Follow the remote run ``wait`` names until it ends (or its polls fail), and record the
        step's outcome; False when the run stopped awaiting it meanwhile (nothing written)."""
        head = await self.store.load(run_id)
        delegate = agent_worker(self._runtime.worker)
        if not _still_awaits(head, wait) or delegate is None:
            return False
        call = await build_call(
            self.store,
            head,
            StartAttempt(wait.task_id, wait.attempt, follows=wait.attempt, remote_run_id=wait.remote_run_id),
        )
        endpoint = delegate.endpoints.get(call.agent.agent) or AgentEndpoint(name=call.agent.agent)
        pacing = PollPacing.for_endpoint(endpoint, delegate.rng)
        while not self._runtime.stopping:
            gate = answer_to_send(head, wait)
            if gate is not None:
                # The question's answer was decided: send it before anything else.
                error = await self._send_answer(run_id, wait, gate, call.agent.agent, delegate)
                head = await self.store.load(run_id)
                if not _still_awaits(head, wait):
                    return False
                if error is not None:
                    previous = _previous_errors(head, wait.task_id)
                    return await self._record(
                        run_id, wait, delegate.failure(head.contract, call, previous, error)
                    )
                continue
            answer = await delegate.remote_status(
                call.agent.agent, wait.remote_run_id, endpoint.follow_wait_seconds
            )
            head = await self.store.load(run_id)
            if not _still_awaits(head, wait):
                return False
            previous = _previous_errors(head, wait.task_id)
            asked = answer.question
            if answer.error is None and asked is not None and not already_asked(head, wait, asked):
                agent = call.agent.agent
                return await self._ask(run_id, wait, agent, asked)
            if answer.error is not None and answer.error.code not in _UNREADABLE:
                return await self._record(
                    run_id, wait, delegate.failure(head.contract, call, previous, answer.error)
                )
            status = None if answer.error is not None else answer.status
            if status in TERMINAL_STATUSES:
                outcome = await delegate.delegate(head.contract, call, previous, _already_recorded)
                return await self._record(run_id, wait, outcome)
            now = anyio.current_time()
            delay = pacing.after(status, endpoint.follow_wait_seconds, answer.answered_in, now)
            if pacing.stalled(now):
                message = protocol_message(
                    call.agent.agent, wait.remote_run_id, status, endpoint.unknown_status_seconds
                )
                error = TypedError(code="agent_protocol", message=message, retryable=True)
                return await self._record(
                    run_id, wait, delegate.failure(head.contract, call, previous, error)
                )
            await anyio.sleep(delay)
        return False

    async def _ask(self, run_id: str, wait: AwaitAgent, agent: str, question: RemoteQuestion) -> bool:
        """Record the remote task's ``question`` as the run's next question gate, while the
        attempt still awaits that task (the follower stops: nobody follows a parked task)."""

        def build(head: RunHead) -> Fact | None:
            if not _still_awaits(head, wait) or already_asked(head, wait, question):
                return None
            return question_asked(head, wait, agent, question, self.clock)

        return await write_while(self.store, self.changes, run_id, build) is not None

    async def _send_answer(
        self, run_id: str, wait: AwaitAgent, gate: GateState, agent: str, delegate: AgentDelegate
    ) -> TypedError | None:
        """Send the answer decided at ``gate`` as the remote task's next message, between
        ``agent_answer_sending`` and ``agent_answer_sent`` (see
        :mod:`orchestration.engine.agent_questions`); the send's typed error, or None (sent, or
        the run moved on: nothing to send)."""
        assert gate.number is not None and gate.comment is not None
        sent_id = answer_message_id(run_id, wait.task_id, wait.attempt, gate.number)

        def sent(head: RunHead) -> Fact | None:
            if not _still_awaits(head, wait) or answer_to_send(head, wait) != gate:
                return None
            return answer_sent(head, wait, gate, sent_id, self.clock)

        if await self._answer_taken(run_id, wait, gate, agent, delegate):
            # A send begun before a crash reached the agent: the task moved on; nothing is resent.
            await write_while(self.store, self.changes, run_id, sent)
            return None

        def sending(head: RunHead) -> Fact | None:
            if not _still_awaits(head, wait) or answer_to_send(head, wait) != gate:
                return None
            return answer_sending(head, wait, gate, sent_id, self.clock)

        begun = await write_while(self.store, self.changes, run_id, sending)
        if begun is None:
            return None
        context = gate.context_id
        if not isinstance(delegate, AnswersQuestions):
            return TypedError(code="agent_protocol", message=f"agent {agent} cannot be sent an answer")
        error = await delegate.answer_question(agent, wait.remote_run_id, context, sent_id, gate.comment)
        if error is not None:
            return error
        await write_while(self.store, self.changes, run_id, sent)
        return None

    async def _answer_taken(
        self, run_id: str, wait: AwaitAgent, gate: GateState, agent: str, delegate: AgentDelegate
    ) -> bool:
        """Whether a send of the answer at ``gate`` begun before (``agent_answer_sending``
        recorded, not ``agent_answer_sent``: the process died during it) reached the agent: its
        task no longer asks that question. False when no send had begun, or the task still asks,
        or its state cannot be read (the answer is sent again, marked a possible duplicate)."""
        head = await self.store.load(run_id)
        if not _still_awaits(head, wait) or not head.task(wait.task_id).attempts[-1].answer_sending:
            return False
        answer = await delegate.remote_status(agent, wait.remote_run_id, 0.0)
        if answer.error is not None or answer.status is None:
            return False
        asked = answer.question
        if asked is not None and (asked.asked_id is None or asked.asked_id == gate.asked_id):
            return False
        log.info(
            "remote task %s took the answer to %s before the crash: not sent again",
            wait.remote_run_id,
            gate.gate_id,
            extra={"action": "remote_answer_taken", "run_id": run_id},
        )
        return True

    async def _record(self, run_id: str, wait: AwaitAgent, outcome: AttemptOutcome) -> bool:
        """Record ``outcome`` as the awaited attempt's, in one compare-and-swap write made only
        while the task is still in that attempt with that remote run. True when written."""
        while True:
            try:
                head = await self.store.load(run_id)
            except RunNotFound:
                return False
            if not _still_awaits(head, wait):
                return False
            task = head.task(wait.task_id)
            attempt = task.attempts[-1]
            action = StartAttempt(wait.task_id, wait.attempt, attempt.telemetry.possible_duplicate_call)
            fact = outcome_fact(head, action, attempt.executor, outcome, self.clock.now())
            try:
                stored = await self.store.append(run_id, head.version, [fact], apply_write(head, [fact]))
            except VersionConflict:
                continue
            log.info(
                "remote run %s ended: %s recorded",
                wait.remote_run_id,
                fact.type,
                extra={"action": "agent_wait_ended", "run_id": run_id},
            )
            await self.changes.recorded([fact], stored)
            return True


async def cancel_remote_runs(
    worker: TaskWorker | None,
    head: RunHead,
    reason: str,
    seconds: float,
    done: dict[AwaitAgent, str | None],
    only: list[AwaitAgent] | None = None,
) -> None:
    """Before ``head``'s run is cancelled (or stops waiting otherwise): ``orchestrate_cancel``
    every remote run it holds (:func:`held`: awaited, or parked at a question; of ``only``, when
    given) that ``done`` has no result for yet, all at once, bounded by ``seconds`` in all, and
    put each result in ``done`` (None: cancelled; else the error code: ``not_cancelled``, the
    remote refused or could not be reached; ``timeout``, no answer within the bound). Best
    effort: never raises for the agents' failures."""
    delegate = agent_worker(worker)
    todo = [w for w in (held(head) if only is None else only) if w not in done]
    if delegate is None or not todo:
        return

    async def one(wait: AwaitAgent) -> None:
        agent = head.step_of(wait.task_id).agent
        assert agent is not None
        ok = await delegate.cancel_remote(agent.agent, wait.remote_run_id, reason)
        done[wait] = None if ok else "not_cancelled"

    with anyio.move_on_after(seconds):
        async with anyio.create_task_group() as tg:
            for wait in todo:
                tg.start_soon(one, wait)
    for wait in todo:
        done.setdefault(wait, "timeout")


def remote_cancel_facts(head: RunHead, done: dict[AwaitAgent, str | None], at: datetime) -> list[Fact]:
    """The ``remote_run_cancelled`` facts of the results in ``done`` for the remote runs ``head``
    still awaits, numbered after its last fact."""
    facts: list[Fact] = []
    for wait in held(head):
        if wait not in done:
            continue
        agent = head.step_of(wait.task_id).agent
        assert agent is not None
        error = done[wait]
        facts.append(
            RemoteRunCancelled(
                seq=head.last_seq + 1 + len(facts),
                at=at,
                task_id=wait.task_id,
                attempt=wait.attempt,
                agent=agent.agent,
                remote_run_id=wait.remote_run_id,
                cancelled=error is None,
                error=error,
            )
        )
    return facts


async def giving_up(
    worker: TaskWorker | None, head: RunHead, facts: Sequence[Fact], seconds: float
) -> list[Fact]:
    """The facts of a write of ``facts`` on top of ``head``: when the write ends the wait for
    remote runs of agent steps (a cancel, a deadline, the run failing or rejected), those runs are
    cancelled there first (:func:`cancel_remote_runs`, within ``seconds``) and a
    ``remote_run_cancelled`` fact for each goes first in the write (the others renumbered)."""
    waits = held(head)
    if not waits:
        return list(facts)
    after = set(held(apply_write(head, facts)))
    ended = [w for w in waits if w not in after]
    if not ended:
        return list(facts)
    cancel = any(isinstance(f, RunCancelled) for f in facts)
    reason = (
        f"run {head.run_id} was cancelled"
        if cancel
        else f"run {head.run_id} gave up waiting: {facts[-1].type}"
    )
    done: dict[AwaitAgent, str | None] = {}
    await cancel_remote_runs(worker, head, reason, seconds, done, only=ended)
    cancels = remote_cancel_facts(head, done, facts[0].at)
    return [*cancels, *(f.model_copy(update={"seq": f.seq + len(cancels)}) for f in facts)]


def _previous_errors(head: RunHead, task_id: str) -> tuple[TypedError, ...]:
    return tuple(a.error for a in head.task(task_id).attempts if a.error is not None)


async def _already_recorded(remote_run_id: str, ended: bool = True) -> None:
    """The ``remember`` of a call that follows a recorded remote run (never called)."""


__all__ = [
    "AgentRuntime",
    "AgentWaits",
    "awaited",
    "cancel_remote_runs",
    "giving_up",
    "held",
    "remote_cancel_facts",
]

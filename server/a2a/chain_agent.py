"""What an A2A call does to runs: every chain served as an A2A agent (the wire is
:mod:`server.a2a.sdk_face`, the one module of this package that imports the A2A SDK).

A task is a run, its id the run's id. The rules are the MCP tools' (the same runtime calls, the
same roles through :data:`~server.mcp.answering.ROLE_OF`, the same "own runs only"):

- A message without a task id starts a run (``orchestrate_start``): the text parts are the
  request, ``metadata.chain`` names the chain (the configured default without it). The message's
  ``contextId`` and ``messageId`` are its idempotency key (:func:`start_key`): a resent message
  finds the run the first one started, whatever the server did meanwhile. The key also keeps the
  context id, which a task reports for as long as the run lives.
- A run that needs its caller (a host task, a gate) is ``input-required``: :class:`Question` says
  what is asked. The caller's next message names the task (``metadata.task_id``, its text the
  output: ``orchestrate_resume``) or the gate (``metadata.gate_id`` and ``metadata.decision``, its
  text the comment: ``orchestrate_approve``); a repeat records nothing twice, as the tools'. A
  message that names a context other than the task's is refused, and so is one to a run that has
  ended (:class:`TaskEnded`), unless it repeats a reply recorded before.
- The outputs of done tasks are the task's artifacts, one per task.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from orchestration.core import RunHead, RunStatus, StartRequest, TaskStatus, delegation_from_meta, shown_key
from orchestration.engine import OutputPiece, is_settled
from orchestration.errors import (
    Conflict,
    ConstructError,
    InvalidArgument,
    InvalidRequest,
    InvalidState,
    RunNotFound,
    quoted,
)
from server.identity import Caller
from server.mcp.answering import ROLE_OF
from server.mcp.services import Services
from server.views.next_step import Approve, RunHostTask

#: the most text one streamed piece of a call's output carries (older text is counted as missed)
STREAM_PIECE_CHARS = 16_000
#: the prefix of the idempotency keys of runs started over A2A
KEY_PREFIX = "a2a:"

Decision = Literal["approve", "reject", "revise"]
DECISIONS: frozenset[str] = frozenset({"approve", "reject", "revise"})


class ServerStarting(ConstructError):
    """The server's services are not up yet (or are shutting down)."""

    code = "unavailable"


class TaskEnded(InvalidState):
    """A message continues a task whose run has ended and repeats no reply recorded before: an
    ended task takes no more messages."""


@dataclass(frozen=True, slots=True)
class Question:
    """One thing a run waits for from its caller: a host task to run (``kind`` ``host_task``: the
    whole prompt and the output's schema), or a gate to decide (``gate``: its choices)."""

    kind: Literal["host_task", "gate"]
    #: the run that waits: the task's run, or one of its child runs
    run_id: str
    task_id: str
    gate_id: str | None = None
    specialist: str | None = None
    system_prompt: str | None = None
    user_prompt: str | None = None
    output_schema: dict[str, Any] | None = None
    choices: dict[str, str] | None = None
    guards: str | None = None
    instruction: str = ""

    def data(self) -> dict[str, Any]:
        """The question as the data part of an ``input-required`` message."""
        fields = {
            "kind": self.kind,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "gate_id": self.gate_id,
            "specialist": self.specialist,
            "system_prompt": self.system_prompt,
            "user_prompt": self.user_prompt,
            "output_schema": self.output_schema,
            "choices": self.choices,
            "guards": self.guards,
            "instruction": self.instruction,
        }
        return {k: v for k, v in fields.items() if v is not None}


@dataclass(frozen=True, slots=True)
class Output:
    """A done task's output: an artifact of the A2A task."""

    task_id: str
    specialist: str
    text: str


@dataclass(frozen=True, slots=True)
class RunState:
    """A run as an A2A task shows it."""

    head: RunHead
    context_id: str
    questions: tuple[Question, ...]
    outputs: tuple[Output, ...]
    #: False: the caller may not see the run's content (outputs and prompts left out)
    content: bool

    @property
    def run_id(self) -> str:
        return self.head.run_id

    @property
    def status(self) -> RunStatus:
        return self.head.status

    @property
    def needs_caller(self) -> bool:
        return bool(self.questions)


@dataclass(frozen=True, slots=True)
class Reply:
    """What a message that continues a task answers: a host task's output, or a gate's decision."""

    task_id: str | None
    gate_id: str | None
    decision: Decision | None
    text: str
    #: the run that waits, when it is a child run of the task's run
    run_id: str | None = None


def start_key(context_id: str | None, message_id: str) -> str:
    """The idempotency key of a run a message starts: the context id (empty when the message has
    none) and the message id, length-prefixed so that the context id reads back whole
    (:func:`context_of`)."""
    context = context_id or ""
    return f"{KEY_PREFIX}{len(context)}:{context}{message_id}"


def context_of(head: RunHead) -> str:
    """The context id of ``head``'s run: the one its starting message gave, else the run id (a run
    started over MCP or without a context id is a context of its own)."""
    key = shown_key(head.idempotency_key, head.started_by)
    if key is None or not key.startswith(KEY_PREFIX):
        return head.run_id
    size, _, rest = key.removeprefix(KEY_PREFIX).partition(":")
    if not size.isdigit() or int(size) == 0 or int(size) > len(rest):
        return head.run_id
    return rest[: int(size)]


class ChainAgent:
    """The runs behind the A2A face of one server process (``services`` is read at each call:
    the lifespan starts after the HTTP app is built)."""

    def __init__(self, services: Callable[[], Services | None]) -> None:
        self._services = services

    def services(self) -> Services:
        services = self._services()
        if services is None:
            raise ServerStarting("the server is starting or stopping; try again in a moment")
        return services

    @staticmethod
    def allow(caller: Caller, tool: str) -> None:
        """Raise ``forbidden`` unless ``caller`` has the role of the MCP tool doing the same."""
        caller.require(ROLE_OF[tool], tool)

    async def start(
        self, caller: Caller, text: str, metadata: Mapping[str, Any], context_id: str | None, message_id: str
    ) -> RunHead:
        """The run this message starts, or the one it started before (the same context and message
        ids from the same identity). ``metadata``: the message's, where ``chain`` and
        ``approve_before`` are ``orchestrate_start``'s arguments of those names, and the delegation
        an agent step of another server sends (the hop bound against loops)."""
        self.allow(caller, "orchestrate_start")
        if not text.strip():
            raise InvalidArgument("the message has no text: its text parts are the request of the run")
        if not message_id:
            raise InvalidArgument("the message has no messageId")
        chain = metadata.get("chain")
        if isinstance(chain, list) and chain and all(isinstance(name, str) for name in chain):
            chain = tuple(chain)  # an ad-hoc chain of specialists, as orchestrate_start's
        elif chain is not None and not isinstance(chain, str):
            raise InvalidArgument("metadata.chain must be a chain's name or a list of specialists")
        gated = metadata.get("approve_before", [])
        if not isinstance(gated, list) or not all(isinstance(step, str) for step in gated):
            raise InvalidArgument("metadata.approve_before must be a list of step names")
        key = start_key(context_id, message_id)
        services = self.services()
        most = services.settings.limits().max_id_chars
        if len(key) > most:
            raise InvalidArgument(
                f"contextId and messageId are {len(key) - len(KEY_PREFIX)} characters together with their "
                f"separator; at most {most - len(KEY_PREFIX)} are kept"
            )
        request = StartRequest(
            request=text,
            chain=chain,
            approve_before=tuple(gated),
            idempotency_key=key,
            started_by=caller.identity if caller.verified else None,
            delegation=delegation_from_meta(metadata),
        )
        head, created = await services.runtime.start(request)
        caller.check_run(head)
        if created and not is_settled(head, services.runtime.clock.now()):
            services.dispatcher.wake(head.run_id)
        return head

    async def head(self, caller: Caller, run_id: str, tool: str = "run_status") -> RunHead:
        """The run ``run_id`` if ``caller`` may act on it as ``tool`` does (``task_not_found`` for
        no run, as for a run it may not see: which runs exist is not told)."""
        self.allow(caller, tool)
        if not run_id:
            raise InvalidArgument("the request names no task: its id is required")
        try:
            head = await self.services().runtime.status(run_id)
        except InvalidArgument as exc:  # not a run id at all: no such task
            raise RunNotFound(run_id) from exc
        if not caller.may_see(head):
            raise RunNotFound(run_id)
        return head

    async def answer(
        self, caller: Caller, run_id: str, reply: Reply, context_id: str | None = None
    ) -> RunHead:
        """Hand ``reply`` to the run ``run_id`` (or its child run ``reply.run_id``). ``context_id``:
        the message's, refused (``invalid_argument``) when it is not the task's. A reply the run
        cannot take once it has ended raises :class:`TaskEnded`; a repeat of one it took answers
        as the first did."""
        if reply.task_id is not None and reply.gate_id is not None:
            raise InvalidArgument(
                "a reply names a task_id (a host task's output) or a gate_id (a decision), not both"
            )
        tool = "run_status"  # a reply that names nothing is told what the task waits for
        if reply.gate_id is not None:
            tool = "orchestrate_approve"
        elif reply.task_id is not None:
            tool = "orchestrate_resume"
        head = await self.head(caller, run_id, tool)
        if context_id and context_id != context_of(head):
            raise InvalidArgument(
                f"contextId {quoted(context_id)} is not the context of task {run_id} "
                f"({context_of(head)}): send the task's contextId, or none"
            )
        try:
            await self._hand_in(caller, head, reply)
        except (InvalidArgument, InvalidRequest, InvalidState, Conflict) as exc:
            now = await self.services().runtime.status(run_id)
            if now.status.is_terminal:
                raise TaskEnded(
                    f"task {run_id} has ended ({now.status.value}) and takes no more messages "
                    f"({exc.code}: {exc})"
                ) from exc
            raise
        head = await self.services().runtime.status(run_id)
        self.services().dispatcher.wake(run_id)
        return head

    async def _hand_in(self, caller: Caller, head: RunHead, reply: Reply) -> None:
        runtime = self.services().runtime
        run_id = head.run_id
        target = reply.run_id or run_id
        if reply.gate_id is not None:
            if target != run_id:
                await self._child_of(head, target)
            if reply.decision is None:
                raise InvalidArgument(
                    f"gate {quoted(reply.gate_id)} needs metadata.decision: approve, reject or revise"
                )
            await runtime.approve(
                target,
                reply.decision,
                reply.gate_id,
                reply.text or None,
                caller.recorded,
                channel=caller.channel,
                verified=caller.verified,
            )
        elif reply.task_id is not None:
            if target != run_id:
                await self._child_of(head, target)
            await runtime.submit_host_output(
                target,
                reply.task_id,
                reply.text,
                None,
                False,
                by=caller.recorded,
                channel=caller.channel,
                verified=caller.verified,
            )
        else:
            waits = await self.state(caller, head, outputs_of=())
            asked = ", ".join(
                f"task_id {q.task_id}" if q.kind == "host_task" else f"gate_id {q.gate_id}"
                for q in waits.questions
            )
            raise InvalidRequest(
                f"task {run_id} is {head.status.value}"
                + (
                    f"; it waits for {asked}: name it in the message's metadata"
                    if asked
                    else "; it waits for nothing"
                )
            )

    async def _child_of(self, head: RunHead, child_id: str) -> None:
        child = await self.services().runtime.status(child_id)
        if child.parent is None or child.parent.run_id != head.run_id:
            raise InvalidArgument(f"run {quoted(child_id)} is not a child run of task {head.run_id}")

    async def cancel(self, caller: Caller, run_id: str) -> RunHead:
        await self.head(caller, run_id, "orchestrate_cancel")
        return await self.services().runtime.cancel(
            run_id, "cancelled over A2A", caller.recorded, channel=caller.channel, verified=caller.verified
        )

    async def settled(self, run_id: str) -> RunHead:
        """The run once it needs its caller or ended, as a blocking ``SendMessage`` waits for it
        (at most ``[a2a] blocking_wait_seconds``; a stopping server answers at once)."""
        services = self.services()
        return await services.runtime.wait_settled(run_id, services.settings.a2a.blocking_wait_seconds)

    async def changed(
        self, run_id: str, after_seq: int, position: int, seconds: float
    ) -> tuple[RunHead, list[OutputPiece]]:
        """The run once it has a fact after ``after_seq``, or ended, or a call of it wrote text
        after ``position`` (at most ``seconds``): its head and that text."""
        runtime = self.services().runtime
        pieces = runtime.deltas.after(run_id, position, STREAM_PIECE_CHARS)
        if not pieces:
            woken = runtime.deltas.changed(run_id)
            async with anyio.create_task_group() as tg:

                async def facts() -> None:
                    await runtime.wait_for_facts(run_id, after_seq, seconds)
                    tg.cancel_scope.cancel()

                async def text() -> None:
                    await woken.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(facts)
                tg.start_soon(text)
            pieces = runtime.deltas.after(run_id, position, STREAM_PIECE_CHARS)
        return await runtime.status(run_id), pieces

    async def state(
        self, caller: Caller, head: RunHead, outputs_of: Collection[str] | None = None
    ) -> RunState:
        """``head``'s run as a task: what it asks of its caller and the outputs of its done tasks
        (of those of ``outputs_of`` only, when given: each is read from the run's facts), without
        the content when ``caller`` may not see it."""
        services = self.services()
        content = caller.sees_content(head)
        view = await services.view(head.run_id, head, caller=caller)
        actions = [view.next_action, *view.more_actions]
        questions = [await self._question(action, head, content) for action in actions]
        outputs: list[Output] = []
        if content and (outputs_of is None or outputs_of):
            texts = await services.runtime.outputs(head, None if outputs_of is None else list(outputs_of))
            specialists = {t.task_id: t.specialist for t in head.tasks if t.status == TaskStatus.DONE}
            outputs = [
                Output(task_id, specialists.get(task_id, task_id), text) for task_id, text in texts.items()
            ]
        return RunState(
            head=head,
            context_id=context_of(head),
            questions=tuple(q for q in questions if q is not None),
            outputs=tuple(outputs),
            content=content,
        )

    async def _question(self, action: object, head: RunHead, content: bool) -> Question | None:
        if isinstance(action, Approve):
            return Question(
                kind="gate",
                run_id=action.run_id or head.run_id,
                task_id=action.task_id,
                gate_id=action.gate_id,
                choices=dict(action.choices),
                guards=action.guards,
                instruction=(
                    "Reply with a message whose metadata names gate_id and decision (one of choices); "
                    "its text is the comment"
                ),
            )
        if not isinstance(action, RunHostTask):
            return None
        run_id = action.run_id or head.run_id
        system = user = None
        if content:
            runtime = self.services().runtime
            waiting = head if run_id == head.run_id else await runtime.status(run_id)
            prompt = await runtime.prompt_for(waiting, action.task_id)
            system, user = prompt.system, prompt.user
        return Question(
            kind="host_task",
            run_id=run_id,
            task_id=action.task_id,
            specialist=action.specialist,
            system_prompt=system,
            user_prompt=user,
            output_schema=action.output_schema,
            instruction=(
                "Run the prompt with your model; reply with a message whose metadata names task_id and "
                "whose text is the whole output"
                + (" (one JSON object matching output_schema)" if action.output_schema else "")
            ),
        )

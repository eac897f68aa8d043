"""What every tool does around its own work: who may call it (:data:`ROLE_OF`), waiting (bounded)
until the run settles with progress notifications, asking the user at a gate where the client can
(:mod:`server.mcp.elicit`), and turning the outcome into a tool result (an error the caller can fix is
an ``isError`` result starting with its stable code). The tools themselves are :mod:`server.mcp.tools`."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import anyio
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, InputRequiredResult, TextContent
from pydantic import BaseModel

from orchestration.core import RunHead, RunStatus
from orchestration.engine import OutputDeltas, is_settled
from orchestration.errors import ConstructError
from orchestration.tracing import link_call_to_run
from server.identity import Caller, Role, caller_of
from server.mcp.arguments import error_result
from server.mcp.elicit import (
    ask_in_call,
    brought_answer,
    brought_response,
    can_ask,
    input_required,
    is_modern,
    noted,
    open_gate,
    take_answer,
)
from server.mcp.services import Services
from server.views.children_view import settle_children
from server.views.compact import answer_data, answer_text
from server.views.run_view import Detail, RunView

log = logging.getLogger("construct.tools")

T = TypeVar("T")

MAX_WAIT_SECONDS = 300.0
#: What a waiting tool (start, resume, approve, fork) waits by default: common MCP clients give up
#: on a call after 5 s (the OpenAI Agents SDK's default) and retry it, so a default answer comes
#: well before that, and says what to call next (``next_action`` wait: ``run_status``) when the
#: run has not settled. A host that wants to block longer passes ``wait_seconds``.
DEFAULT_WAIT_SECONDS = 3.0
#: While a call waits, a progress notification goes out at least this often (at least
#: every second), to a client that sent a progress token: clients that reset their timeout on
#: progress keep the call, and a host sees that it is alive.
PROGRESS_INTERVAL_SECONDS = 0.8
#: While a task's call streams, a waiting call's progress carries the newest output: at
#: most one such notification per this many seconds, whose message is the text written since the
#: previous one (the newest :data:`OUTPUT_MESSAGE_CHARS` characters of it).
OUTPUT_INTERVAL_SECONDS = 0.25
OUTPUT_MESSAGE_CHARS = 2000

#: The tools' context type. A parametrized pydantic model is a real class, which is what the SDK's
#: context-parameter detection needs.
ToolContext = Context[Services, Any]


def services_of(ctx: ToolContext) -> Services:
    return ctx.request_context.lifespan_context


#: The role each tool needs (see :mod:`server.identity`).
ROLE_OF: dict[str, Role] = {
    "orchestrate_start": "operate",
    "orchestrate_fork": "operate",
    "orchestrate_upgrade": "operate",
    "orchestrate_resume": "operate",
    "orchestrate_cancel": "operate",
    "orchestrate_approve": "approve",
    "run_status": "read",
    "runs_list": "read",
    "run_events": "read",
    "task_prompt": "read",
}


async def caller_for(ctx: ToolContext, tool: str, run_id: str | None = None) -> Caller:
    """Who calls ``tool``, once it is checked that they may: ``forbidden`` when their identity
    lacks the tool's role, or is limited to its own runs and ``run_id`` is not one."""
    caller = caller_of(ctx.request_context.request)
    caller.require(ROLE_OF[tool], tool)
    if run_id is not None and caller.own_runs_only:
        caller.check_run(await services_of(ctx).runtime.status(run_id))
    return caller


def _ok(model: BaseModel, services: Services | None = None) -> CallToolResult:
    if services is not None and isinstance(model, RunView):
        text, structured = services.answer_of(model)  # dumped once per version (compact)
    elif isinstance(model, RunView):
        structured = answer_data(model)
        text = answer_text(structured)
    else:
        text, structured = model.model_dump_json(), model.model_dump(mode="json")
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


async def answer(
    tool: str, work: Callable[[], Awaitable[BaseModel]], services: Services | None = None
) -> CallToolResult:
    """Run ``work``; a ConstructError becomes an ``isError`` result starting with its code (with
    ``services``: see :func:`answer_or_ask`)."""
    result = await answer_or_ask(tool, work, services)
    assert isinstance(result, CallToolResult)  # work never asks (see answer_or_ask)
    return result


async def answer_or_ask(
    tool: str,
    work: Callable[[], Awaitable[BaseModel | InputRequiredResult]],
    services: Services | None = None,
) -> CallToolResult | InputRequiredResult:
    """:func:`answer` for a call that may ask the user at a gate instead: its form
    (``input_required``, see :mod:`server.mcp.elicit`) goes out as it is. With ``services``, an
    answer that is a run view they keep is dumped once (:meth:`Services.answer_of`)."""
    try:
        model = await work()
    except ConstructError as exc:
        log.info("%s refused: %s", tool, exc.code, extra={"action": "tool_error", "code": exc.code})
        # A result, not a raised ToolError: the SDK would prefix its text with "Error executing tool
        # <name>:" and hide the code from a caller that reads the start.
        return error_result(exc)
    return model if isinstance(model, InputRequiredResult) else _ok(model, services)


class Progress:
    """The progress notifications of one waiting call: one when the wait begins, one per change
    the wait observes (:meth:`report`), and, while nothing changes, the last message again every
    :data:`PROGRESS_INTERVAL_SECONDS` (:meth:`tick`). A tick reuses the last head reported, so it
    costs no store read; notifications are numbered 1, 2, ... (``progress`` rises). While a task's
    call streams in this process, :meth:`follow_output` adds the output written (a tick repeats
    the status, never text already sent)."""

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx
        self._step = 0
        self._message = ""
        self._sent_at = -math.inf

    async def report(self, head: RunHead) -> None:
        """Tell the client what ``head`` says, now."""
        self._message = f"run {head.run_id} is {head.status.value}"
        await self._send()

    async def _send(self, message: str | None = None) -> None:
        self._step += 1
        self._sent_at = anyio.current_time()
        await self._ctx.report_progress(self._step, None, self._message if message is None else message)

    async def follow_output(self, deltas: OutputDeltas, run_id: str) -> None:
        """Until cancelled: whenever the run's calls wrote output here, a notification whose
        message is that text (``task: text`` per task, the newest :data:`OUTPUT_MESSAGE_CHARS`
        characters), then a pause of :data:`OUTPUT_INTERVAL_SECONDS`. The text of calls that ended
        before the wait is not sent; a call in flight starts with what is still held of it."""
        cursors = {t.task_id: (t.attempt, t.end) for t in deltas.held(run_id) if t.ended}
        try:
            while True:
                changed = deltas.changed(run_id)
                pieces: list[str] = []
                for held in deltas.held(run_id):
                    attempt, offset = cursors.get(held.task_id, (held.attempt, 0))
                    text, _ = held.since(attempt, offset)
                    cursors[held.task_id] = (held.attempt, held.end)
                    if text:
                        pieces.append(f"{held.task_id}: {text}")
                if pieces:
                    message = "\n".join(pieces)
                    if len(message) > OUTPUT_MESSAGE_CHARS:
                        message = "…" + message[-(OUTPUT_MESSAGE_CHARS - 1) :]
                    await self._send(message)
                    await anyio.sleep(OUTPUT_INTERVAL_SECONDS)
                await changed.wait()
        except Exception as exc:  # a broken stream, a closed session
            log.debug("output progress stopped: %s", exc, extra={"action": "progress_stopped"})

    async def tick(self) -> None:
        """Repeat the last message whenever :data:`PROGRESS_INTERVAL_SECONDS` passed without one,
        until cancelled. A notification that cannot be sent (the client went away) ends the ticks,
        never the call: the call's answer decides what the client learns."""
        try:
            while True:
                due = self._sent_at + PROGRESS_INTERVAL_SECONDS
                if anyio.current_time() >= due:
                    await self._send()
                    continue
                await anyio.sleep(due - anyio.current_time())
        except Exception as exc:  # a broken stream, a closed session
            log.debug("progress ticks stopped: %s", exc, extra={"action": "progress_stopped"})


async def with_progress(ctx: ToolContext, head: RunHead, wait: Callable[[Progress], Awaitable[T]]) -> T:
    """``wait(progress)`` while :class:`Progress` ticks beside it in a task group, reporting
    ``head`` first; the ticks stop when the wait ends. The wait's error is raised as it is (not
    in an exception group), so the tools still see a ``ConstructError``."""
    progress = Progress(ctx)
    await progress.report(head)
    failed: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(progress.tick)
        group.start_soon(progress.follow_output, services_of(ctx).runtime.deltas, head.run_id)
        try:
            result = await wait(progress)
        except Exception as exc:
            failed = exc
        finally:
            group.cancel_scope.cancel()
    if failed is not None:
        raise failed
    return result


async def settle_view(
    ctx: ToolContext,
    caller: Caller,
    head: RunHead,
    wait_seconds: float,
    progress: Progress,
    detail: Detail = "compact",
    full_task: str | None = None,
) -> RunView:
    """Wait (bounded) until the run settles, reporting each change to ``progress``, then view it
    as ``caller`` is shown it."""
    services = services_of(ctx)
    if wait_seconds > 0:
        head = await _settled(services, head, wait_seconds, progress)
    return await services.view(head.run_id, head, detail, full_task, caller=caller)


async def _settled(services: Services, head: RunHead, wait_seconds: float, progress: Progress) -> RunHead:
    """The run's head once it settled, or when ``wait_seconds`` are up (see :func:`settle_view`)."""
    runtime = services.runtime
    deadline = anyio.current_time() + min(wait_seconds, MAX_WAIT_SECONDS)
    while True:
        head = await runtime.wait_settled(head.run_id, deadline - anyio.current_time(), progress.report)
        if head.status == RunStatus.AWAITING_CHILDREN:
            # What the run needs is what its children need (server.views.children_view); a child
            # that ended moves the run on: wait for that, then for the run to settle again.
            ended = await settle_children(runtime, head, deadline - anyio.current_time())
            if not ended or runtime.stopping or anyio.current_time() >= deadline:
                return head
            head = await runtime.wait_for_facts(head.run_id, head.last_seq, deadline - anyio.current_time())
            continue
        if head.status == RunStatus.AWAITING_AGENT:
            # The server follows the agent's remote run: wait for its end to be recorded (a
            # long poll for whoever follows this run in turn), then for the run to settle.
            seen = head.last_seq
            head = await runtime.wait_for_facts(head.run_id, seen, deadline - anyio.current_time())
            if head.last_seq == seen or runtime.stopping or anyio.current_time() >= deadline:
                return head
            continue
        # A durable wait (a provider's backoff) that ends within the caller's budget is not
        # worth answering "wait" for: wait through it, then for the next settled state. Not
        # when the server is stopping: nothing will move the run on in this process.
        if runtime.stopping or head.status != RunStatus.QUEUED or head.not_before is None:
            return head
        until = (head.not_before - runtime.clock.now()).total_seconds()
        if until >= deadline - anyio.current_time():
            return head
        await anyio.sleep(max(0.0, until) + 0.05)


async def settle_asking(
    ctx: ToolContext,
    caller: Caller,
    head: RunHead,
    wait_seconds: float,
    *,
    retry_safe: bool,
    detail: Detail = "compact",
    full_task: str | None = None,
) -> RunView | InputRequiredResult:
    """What a call that waits answers: the user's answer its retry brings recorded (a 2026-07-28
    connection), the run settled (bounded by ``wait_seconds``, with progress), then the user
    asked at the gate it waits at where the client can (:mod:`server.mcp.elicit`): a form in the
    call (handshake era), or an ``input_required`` answer whose retry brings the answer — only
    when ``retry_safe`` (the call, repeated with the same arguments, records nothing new)."""
    link_call_to_run(head)
    services = services_of(ctx)
    notes: list[str] = []
    brought = brought_answer(ctx, caller, head)
    if brought is not None:
        notes.extend(brought.notes)
        head = await take_answer(services, head, brought.gate_id, brought_response(ctx), caller, notes)
    answered = None if brought is None else brought.gate_id

    async def asking(progress: Progress, wait: float = wait_seconds) -> RunView | InputRequiredResult:
        deadline = anyio.current_time() + wait  # the call's whole wait: the settle's and the forms'
        view = await settle_view(ctx, caller, head, wait, progress, detail, full_task)
        if wait <= 0 or not can_ask(ctx, caller):
            return noted(view, notes)
        if is_modern(ctx):
            form = await input_required(services, view, caller, notes, answered) if retry_safe else None
            return form or noted(view, notes)
        while (gate := open_gate(view)) is not None and (left := deadline - anyio.current_time()) > 0:
            moved = await ask_in_call(ctx, view, gate, caller, (left, wait_seconds), notes)
            if moved is None:
                break
            left = deadline - anyio.current_time()
            view = await settle_view(ctx, caller, moved, left, progress, detail, full_task)
            if open_gate(view) == gate:  # the answer was not recorded: do not ask the same again
                break
        return noted(view, notes)

    if wait_seconds <= 0 or _needs_the_host(head, services.runtime.clock.now()):
        # Nothing to wait for (no wait asked, or a run that awaits this host or has ended, with
        # no gate to ask about): one progress notification when there is a wait, the view at once.
        progress = Progress(ctx)
        if wait_seconds > 0:
            await progress.report(head)
        return await asking(progress, 0.0)
    return await with_progress(ctx, head, asking)


def _needs_the_host(head: RunHead, now: datetime) -> bool:
    """Whether ``head`` is settled for good as it is: the run ended, or it awaits host output
    and nothing else (no gate open, no time about to decide), so a wait would return at once."""
    if head.status.is_terminal:
        return True
    if head.status != RunStatus.AWAITING_HOST or not is_settled(head, now):
        return False
    return not any(gate.status == "requested" for gate in head.gates)

"""A real A2A agent for tests: the a2a-sdk's own server (its request handler, its JSON-RPC and
agent-card routes, served by uvicorn) around a scripted :class:`ScriptedExecutor` (no model).

What the agent does is chosen by the message's first word:

- ``fail`` ends the task ``failed`` (status message "the reviewer crashed");
- ``ask`` stops it at ``input-required`` with the question "Which branch?" (``ask data``: with a
  data part ``{"choices": ["main", "dev"]}`` after it); the next message on that task is the
  answer: one starting ``again`` is asked "Which file?", any other completes the task with the
  artifact ``answered: <answer>`` (each answer kept in :attr:`ScriptedExecutor.answers`);
- ``auth`` stops it at ``auth-required`` ("sign in at https://login.example");
- ``data`` completes with a data artifact ``{"verdict": "approve", "score": 3}``;
- ``hello`` answers at once with the message "hello back" (no task);
- ``slow`` works for ``slow_seconds`` (cancellable) before it completes as below;
- anything else works for ``work_seconds``, then completes with two text artifacts,
  ``reviewed:`` and the message's first line, and ``ok``.

Every message id received is kept in :attr:`ScriptedExecutor.message_ids` (and, when the agent
runs as a process, appended to the file ``--log`` names), so a test can count the messages sent.

Run as a process: ``python -m tests.fakes.a2a_peer --port N [--token T] [--log FILE]
[--answer-seconds S]`` (an answer waits ``S`` seconds before the task goes on).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from a2a.helpers import new_data_part, new_task_from_user_message, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Role,
    Task,
    TaskState,
)
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp


class ScriptedExecutor(AgentExecutor):
    """The agent's logic (see the module's docstring)."""

    def __init__(
        self,
        work_seconds: float = 0.2,
        slow_seconds: float = 30.0,
        log: Path | None = None,
        answer_seconds: float = 0.0,
    ) -> None:
        self.work_seconds = work_seconds
        self.slow_seconds = slow_seconds
        #: how long an answer waits before the task goes on (its ``message/send`` waits as long)
        self.answer_seconds = answer_seconds
        self.log = log
        self.message_ids: list[str] = []
        self.metadata: list[dict[str, Any]] = []
        self.cancelled: list[str] = []
        #: ``(task id, context id, message id, text)`` of every answer to a question
        self.answers: list[tuple[str, str, str, str]] = []

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        self.message_ids.append(context.message.message_id)
        self.metadata.append(dict(context.message.metadata))
        if self.log is not None:
            with self.log.open("a") as f:
                f.write(context.message.message_id + "\n")
        if context.get_user_input().startswith("hello"):
            # answered at once with a message: no task to follow
            await event_queue.enqueue_event(new_text_message("hello back", role=Role.ROLE_AGENT))
            return
        current = context.current_task
        if current is not None and current.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await self._answered(context, current, event_queue)
            return
        task = current or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        text = context.get_user_input()
        word = text.split(maxsplit=1)[0] if text.strip() else ""
        await updater.start_work()

        def say(words: str) -> Message:
            return new_text_message(words, context_id=task.context_id, task_id=task.id, role=Role.ROLE_AGENT)

        if word == "fail":
            await updater.failed(say("the reviewer crashed"))
        elif word == "ask":
            question = say("Which branch?")
            if "data" in text.split()[1:2]:
                question.parts.append(new_data_part({"choices": ["main", "dev"]}))
            await updater.requires_input(question)
        elif word == "auth":
            await updater.requires_auth(say("sign in at https://login.example"))
        elif word == "data":
            await updater.add_artifact([new_data_part({"verdict": "approve", "score": 3})], name="verdict")
            await updater.complete()
        else:
            await asyncio.sleep(self.slow_seconds if word == "slow" else self.work_seconds)
            await updater.add_artifact([new_text_part("reviewed:")], name="verdict")
            await updater.add_artifact(
                [new_text_part(text.splitlines()[0]), new_text_part("ok")], name="notes"
            )
            await updater.complete()

    async def _answered(self, context: RequestContext, task: Task, event_queue: EventQueue) -> None:
        """The next message of a task at ``input-required``: the answer to its question."""
        assert context.message is not None
        text = context.get_user_input()
        self.answers.append((task.id, context.message.context_id, context.message.message_id, text))
        await asyncio.sleep(self.answer_seconds)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        if text.startswith("again"):
            await updater.requires_input(
                new_text_message(
                    "Which file?", context_id=task.context_id, task_id=task.id, role=Role.ROLE_AGENT
                )
            )
            return
        await updater.add_artifact([new_text_part(f"answered: {text}")], name="answer")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        self.cancelled.append(context.task_id)
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


class _Bearer(BaseHTTPMiddleware):
    def __init__(self, app: ASGIApp, token: str) -> None:
        super().__init__(app)
        self.token = token

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return await call_next(request)


def card(url: str) -> AgentCard:
    """The agent's card, naming its JSON-RPC endpoint at ``url``."""
    return AgentCard(
        name="scripted-reviewer",
        description="A scripted reviewer for tests",
        version="1.0.0",
        supported_interfaces=[AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0", url=url)],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "application/json"],
        skills=[AgentSkill(id="review", name="review", description="reviews a text", tags=["review"])],
    )


def app(port: int, executor: ScriptedExecutor, token: str | None = None) -> Starlette:
    """The agent's ASGI app on ``port``: the card at the well-known path, JSON-RPC at ``/a2a``."""
    agent_card = card(f"http://127.0.0.1:{port}/a2a")
    handler = DefaultRequestHandlerV2(
        agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=agent_card
    )
    application = Starlette(
        routes=[*create_agent_card_routes(agent_card), *create_jsonrpc_routes(handler, "/a2a")]
    )
    if token is not None:
        application.add_middleware(_Bearer, token=token)
    return application


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(executor: ScriptedExecutor, token: str | None = None) -> Iterator[str]:
    """The agent served on 127.0.0.1 by uvicorn in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app(port, executor, token), host="127.0.0.1", port=port, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the A2A peer did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token")
    parser.add_argument("--log", type=Path)
    parser.add_argument("--work-seconds", type=float, default=0.2)
    parser.add_argument("--answer-seconds", type=float, default=0.0)
    args = parser.parse_args()
    executor = ScriptedExecutor(
        work_seconds=args.work_seconds, log=args.log, answer_seconds=args.answer_seconds
    )
    uvicorn.run(app(args.port, executor, args.token), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

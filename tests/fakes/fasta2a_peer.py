"""An A2A agent built with a server we did not write: Pydantic's ``fasta2a`` (its app, broker and
in-memory storage) around a scripted worker (no model), served by uvicorn in a thread.

The worker works for ``work_seconds``, then completes the task with one text artifact,
``fasta2a reviewed: `` and the first line of the message. ``rfc3339``: the task's timestamps as
RFC 3339 in UTC; fasta2a's own storage writes a naive local time (``datetime.now().isoformat()``),
which the protobuf-based a2a-sdk cannot read (what :mod:`tests.stores.test_a2a_interop` shows).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from typing import Any

import anyio
import uvicorn
from fasta2a import FastA2A, Worker
from fasta2a.broker import InMemoryBroker
from fasta2a.storage import InMemoryStorage

from tests.fakes.a2a_peer import free_port


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class _Rfc3339Storage(InMemoryStorage):  # type: ignore[misc]
    async def submit_task(self, context_id: str, message: Any) -> Any:
        task = await super().submit_task(context_id, message)
        task["status"]["timestamp"] = _now()
        return task

    async def update_task(self, task_id: str, state: str, *args: Any, **kwargs: Any) -> Any:
        task = await super().update_task(task_id, state, *args, **kwargs)
        task["status"]["timestamp"] = _now()
        return task


class ScriptedWorker(Worker):  # type: ignore[misc]
    """Completes each task with one text artifact (see the module's docstring)."""

    def __init__(self, work_seconds: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.work_seconds = work_seconds
        self.message_ids: list[str] = []

    async def run_task(self, params: Any) -> None:
        self.message_ids.append(params["message"]["message_id"])
        text = " ".join(p.get("text", "") for p in params["message"]["parts"])
        await self.storage.update_task(params["id"], state="working")
        await anyio.sleep(self.work_seconds)
        artifact = {
            "artifact_id": str(uuid.uuid4()),
            "parts": [{"text": f"fasta2a reviewed: {text.splitlines()[0]}"}],
        }
        await self.storage.update_task(params["id"], state="completed", new_artifacts=[artifact])

    async def cancel_task(self, params: Any) -> None:
        await self.storage.update_task(params["id"], state="canceled")

    def build_message_history(self, history: list[Any]) -> list[Any]:
        return history

    def build_artifacts(self, result: Any) -> list[Any]:
        return []


@contextmanager
def serving(work_seconds: float = 0.3, *, rfc3339: bool = True) -> Iterator[tuple[str, ScriptedWorker]]:
    """The agent on a free loopback port; yields its base URL and its worker."""
    port = free_port()
    storage = _Rfc3339Storage() if rfc3339 else InMemoryStorage()
    broker = InMemoryBroker()
    worker = ScriptedWorker(work_seconds, broker=broker, storage=storage)

    @asynccontextmanager
    async def lifespan(app: FastA2A) -> AsyncIterator[None]:
        async with app.task_manager, worker.run():
            yield

    url = f"http://127.0.0.1:{port}"
    app = FastA2A(storage=storage, broker=broker, name="fasta2a-reviewer", url=url, lifespan=lifespan)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the fasta2a peer did not start")
        time.sleep(0.01)
    try:
        yield url, worker
    finally:
        server.should_exit = True
        thread.join(10)

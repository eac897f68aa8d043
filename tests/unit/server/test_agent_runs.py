"""Agent steps inside one process: the runtime drives a chain whose middle step delegates to a fake
construct-mcp (a scripted MCP session), and the real SDK client meets HTTP failures through a mock
transport. Durability (the remote run recorded, then followed after a crash, one remote run per
call), error classification, and a token that appears nowhere but in the request's header."""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.types import CallToolResult, TextContent
from mcp_types import RequestParamsMeta

import orchestration.engine.drive as drive_module
from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.decide import Action, AwaitAgent, StartAttempt, next_action
from orchestration.core.facts import AttemptStarted, RemoteRunStarted
from orchestration.core.fold import fold
from orchestration.core.models import ExecutionContract, RunHead
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.agent_waits import awaited
from orchestration.engine.runtime import Runtime
from orchestration.store import RunStore
from orchestration.workers.agent_calls import AgentEndpoint
from orchestration.workers.mcp_agents import AgentSession, AgentWorker, Workers, _Observed, connect_mcp
from orchestration.workers.retry import RetryPolicy
from stores.memory import MemoryStore
from tests.unit.engine.test_crash_prefixes import BoundaryStore
from tests.unit.helpers import play, sequential_ids

SECRET = "agent-token-" + secrets.token_hex(16)
ENDPOINT = AgentEndpoint(
    name="reviewer2",
    url="http://127.0.0.1:9/mcp",
    token_env="REVIEWER2_TOKEN",
    follow_wait_seconds=0.01,
    paused_poll_seconds=0.01,
)
REVIEW: dict[str, Any] = {
    "name": "review",
    "agent": "reviewer2",
    "tool": "orchestrate_start",
    "arguments": {"chain": "review-loop", "request": "{request}\n\n{outputs.architect}"},
}


def result(
    view: dict[str, Any] | None = None, text: str | None = None, error: bool = False
) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text if text is not None else str(view))],
        structured_content=view,
        is_error=error,
    )


class FakeRemote:
    """A construct-mcp as a session sees it: ``orchestrate_start`` keyed by idempotency key, runs
    that end after ``polls`` ``run_status`` calls. ``hang``: ``run_status`` never answers;
    ``fail_polls``: that many ``run_status`` calls lose the connection first."""

    def __init__(self, polls: int = 2, final: str = "completed") -> None:
        self.runs: dict[str, str] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.tokens: list[str | None] = []
        #: each call's ``_meta``
        self.metas: list[dict[str, Any] | None] = []
        self.polls = polls
        self.final = final
        self.hang = False
        self.fail_polls = 0

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        *,
        meta: RequestParamsMeta | None = None,
    ) -> CallToolResult:
        args = dict(arguments or {})
        self.calls.append((name, args))
        self.metas.append(dict(meta) if meta is not None else None)
        if name == "orchestrate_start":
            run_id = self.runs.setdefault(args["idempotency_key"], f"remote-{len(self.runs) + 1}")
            return result({"run_id": run_id, "status": "queued", "status_kind": "active"})
        if name == "orchestrate_cancel":
            return result({"run_id": args["run_id"], "status": "cancelled", "status_kind": "terminal"})
        assert name == "run_status"
        if args.get("detail") == "full":
            # the whole record, which the step reads its output from once the run ended
            tasks = [
                {"task_id": "engineer", "status": "done", "step": "engineer", "output": "remote code"},
                {"task_id": "reviewer", "status": "done", "step": "reviewer", "output": "remote verdict"},
            ]
            return result({"run_id": args["run_id"], "status": self.final, "tasks": tasks})
        if self.hang:
            await anyio.sleep_forever()
        if self.fail_polls:
            self.fail_polls -= 1
            raise ExceptionGroup("lost", [httpx2.RemoteProtocolError("peer closed connection")])
        polled = sum(1 for n, a in self.calls if n == "run_status" and "detail" not in a)
        if polled < self.polls:
            return result({"run_id": args["run_id"], "status": "running", "status_kind": "active"})
        tasks = [{"task_id": "engineer", "status": "done", "step": "engineer"}]
        tasks += [{"task_id": "reviewer", "status": "done", "step": "reviewer"}]
        error = None if self.final == "completed" else {"code": "rejected", "message": "no"}
        view = {"run_id": args["run_id"], "status": self.final, "status_kind": "terminal", "tasks": tasks}
        return result({**view, "error": error})

    def starts(self) -> int:
        return sum(1 for name, _ in self.calls if name == "orchestrate_start")


def connector(remote: FakeRemote) -> Callable[..., AbstractAsyncContextManager[AgentSession]]:
    @asynccontextmanager
    async def connect(
        endpoint: AgentEndpoint, token: str | None, observed: _Observed
    ) -> AsyncIterator[AgentSession]:
        remote.tokens.append(token)
        yield remote

    return connect


def catalog(step: dict[str, Any] = REVIEW) -> Catalog:
    raw = {"agents": {"reviewer2": {}}, "chains": {"delegated": {"steps": ["architect", step, "writer"]}}}
    return Catalog.builtin().extended(raw, "construct.toml", Path("."))


def runtime_for(
    store: RunStore,
    worker: AgentWorker,
    owner: str = "p1",
    clock: ManualClock | None = None,
    step: dict[str, Any] = REVIEW,
) -> Runtime:
    clock = clock or ManualClock()
    worker.clock = clock  # the retry policy's not_before is on the runtime's clock
    return Runtime(
        store,
        catalog(step),
        clock=clock,
        new_id=sequential_ids(),
        resolve_contract=lambda request, chain: ExecutionContract(worker_backend="inline", max_attempts=3),
        worker=Workers(None, worker),
        settings=RuntimeSettings(owner=owner, lease_ttl_seconds=30, cancel_poll_seconds=0.01),
    )


def agent_worker(remote: FakeRemote, **kwargs: Any) -> AgentWorker:
    return AgentWorker(
        {"reviewer2": ENDPOINT},
        env={"REVIEWER2_TOKEN": SECRET},
        connect=connector(remote),
        policy=RetryPolicy(base_delay_seconds=0),
        **kwargs,
    )


async def stored_text(store: MemoryStore, run_id: str) -> str:
    head = await store.load(run_id)
    facts = await store.read_facts(run_id, 0, head.last_seq)
    return head.model_dump_json() + "".join(f.model_dump_json() for f in facts)


async def test_a_step_delegates_a_run_and_its_output_becomes_the_steps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    store, remote = MemoryStore(), FakeRemote()
    runtime = runtime_for(store, agent_worker(remote))
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    done = await play(runtime, head.run_id)
    assert done.status == RunStatus.COMPLETED and done.format == 6  # awaiting_agent
    snap = await runtime.snapshot(head.run_id)
    assert snap.outputs["review"] == "remote verdict"
    review = snap.head.task("review")
    assert [(a.number, a.remote_run_id, a.follows) for a in review.attempts] == [(1, "remote-1", None)]
    assert review.executor == "agent:reviewer2:orchestrate_start"
    start = remote.calls[0]
    assert start == (
        "orchestrate_start",
        {
            "chain": "review-loop",
            "request": "Build a cache\n\nhost output for architect",
            "idempotency_key": f"construct:{head.run_id}:review:1",
            "wait_seconds": 0,
        },
    )
    facts = await store.read_facts(head.run_id, 0, done.last_seq)
    kinds = [f.type for f in facts if getattr(f, "task_id", None) == "review"]
    assert kinds == ["attempt_started", "remote_run_started", "task_completed"]
    # The writer's prompt carries the delegated output, as any upstream output.
    assert set(remote.tokens) == {SECRET}  # a connection per call (the start, each poll)
    assert SECRET not in await stored_text(store, head.run_id)
    assert SECRET not in caplog.text


async def test_a_restarted_parent_follows_the_recorded_remote_run() -> None:
    store, remote = MemoryStore(), FakeRemote(polls=1)
    remote.hang = True
    clock = ManualClock()
    first = runtime_for(store, agent_worker(remote), owner="p1", clock=clock)
    head, _ = await first.start(StartRequest(request="Build a cache", chain="delegated"))
    await first.drive(head.run_id)
    await first.submit_host_output(head.run_id, "architect", "the design")
    await first.drive(head.run_id)  # records remote-1 and pauses: the run awaits the agent
    recorded = await store.load(head.run_id)
    assert recorded.status == RunStatus.AWAITING_AGENT
    assert recorded.task("review").status == TaskStatus.RUNNING
    assert recorded.task("review").attempts[-1].remote_run_id == "remote-1"
    with anyio.move_on_after(0.5):
        await first.agent_waits.follow(head.run_id, awaited(recorded)[0])  # until the "crash"
    # Another process: it follows remote-1 in the same attempt, and starts nothing.
    remote.hang = False
    clock.advance(60)
    second = runtime_for(store, agent_worker(remote), owner="p2", clock=clock)
    await play(second, head.run_id)
    after = await second.snapshot(head.run_id)
    review = after.head.task("review")
    assert review.status == TaskStatus.DONE and after.outputs["review"] == "remote verdict"
    assert [(a.number, a.remote_run_id, a.follows) for a in review.attempts] == [(1, "remote-1", None)]
    assert not review.attempts[0].telemetry.possible_duplicate_call
    assert remote.starts() == 1 and remote.runs == {f"construct:{head.run_id}:review:1": "remote-1"}


async def test_a_crash_before_the_remote_run_was_recorded_reuses_the_key() -> None:
    store, remote = MemoryStore(), FakeRemote(polls=1)
    clock = ManualClock()
    first = runtime_for(store, agent_worker(remote), owner="p1", clock=clock)
    head, _ = await first.start(StartRequest(request="Build a cache", chain="delegated"))
    await first.drive(head.run_id)
    await first.submit_host_output(head.run_id, "architect", "the design")

    class Crash(BaseException):
        """Stands for SIGKILL: nothing of the process's own handles it."""

    async def crash(remote_run_id: str, ended: bool = True) -> None:
        raise Crash  # the process "dies" after the remote made the run, before it was recorded

    original = AgentWorker.delegate

    async def delegate_then_crash(
        self: AgentWorker, contract: Any, call: Any, prev: Any, remember: Any
    ) -> Any:
        return await original(self, contract, call, prev, crash)

    worker = agent_worker(remote)
    worker.delegate = partial(delegate_then_crash, worker)  # type: ignore[method-assign]
    with pytest.raises(BaseException) as crashed:
        await runtime_for(store, worker, owner="p1", clock=clock).drive(head.run_id)
    assert (
        crashed.group_contains(Crash)
        if isinstance(crashed.value, BaseExceptionGroup)
        else crashed.type is Crash
    )
    assert remote.starts() == 1
    clock.advance(60)
    await play(runtime_for(store, agent_worker(remote), owner="p2", clock=clock), head.run_id)
    after = await store.load(head.run_id)
    assert after.task("review").status == TaskStatus.DONE
    # The second call carried the first attempt's key: the remote answered with the same run.
    keys = [a["idempotency_key"] for n, a in remote.calls if n == "orchestrate_start"]
    assert keys == [f"construct:{head.run_id}:review:1"] * 2 and len(remote.runs) == 1


async def test_an_unreachable_agent_is_retried_and_the_same_run_followed() -> None:
    store, remote = MemoryStore(), FakeRemote(polls=1)
    remote.fail_polls = 1
    runtime = runtime_for(store, agent_worker(remote))
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    done = await play(runtime, head.run_id)
    assert done.status == RunStatus.COMPLETED
    review = (await runtime.snapshot(head.run_id)).head.task("review")
    first, second = review.attempts
    assert first.error is not None and first.error.code == "agent_unreachable" and first.error.retryable
    assert (second.follows, second.remote_run_id) == (1, "remote-1")
    assert remote.starts() == 1


async def test_a_failed_remote_run_fails_the_step_with_a_typed_error() -> None:
    store, remote = MemoryStore(), FakeRemote(polls=1, final="rejected")
    runtime = runtime_for(store, agent_worker(remote))
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    done = await play(runtime, head.run_id)
    assert done.status == RunStatus.FAILED
    assert done.error is not None and done.error.code == "agent_run_failed"
    assert "remote-1 ended rejected: rejected: no" in done.error.message
    assert remote.starts() == 1, "a remote run that ended is not retried"


async def test_a_generic_tool_and_a_token_echoed_in_its_error() -> None:
    calls: list[dict[str, Any]] = []

    class Search:
        async def call_tool(
            self,
            name: str,
            arguments: dict[str, Any] | None = None,
            read_timeout_seconds: float | None = None,
            *,
            meta: RequestParamsMeta | None = None,
        ) -> CallToolResult:
            calls.append(dict(arguments or {}))
            if len(calls) == 1:
                return result(text="found: three caches")
            return result(text=f"bad credentials Bearer {SECRET} ({SECRET})", error=True)

    @asynccontextmanager
    async def connect(
        endpoint: AgentEndpoint, token: str | None, observed: _Observed
    ) -> AsyncIterator[AgentSession]:
        yield Search()

    step = {
        "name": "search",
        "agent": "reviewer2",
        "tool": "search",
        "arguments": {"q": "{outputs.architect}"},
    }
    store = MemoryStore()
    worker = AgentWorker({"reviewer2": ENDPOINT}, env={"REVIEWER2_TOKEN": SECRET}, connect=connect)
    runtime = runtime_for(store, worker)
    runtime.catalog = catalog(step)
    head, _ = await runtime.start(StartRequest(request="r", chain="delegated"))
    await play(runtime, head.run_id)
    snap = await runtime.snapshot(head.run_id)
    assert snap.outputs["search"] == "found: three caches" and calls[0] == {"q": "host output for architect"}
    again, _ = await runtime.start(StartRequest(request="r2", chain="delegated"))
    failed = await play(runtime, again.run_id)
    assert failed.error is not None and failed.error.code == "tool_error" and not failed.error.retryable
    assert SECRET not in failed.error.message and "[redacted]" in failed.error.message
    assert SECRET not in await stored_text(store, again.run_id)


@pytest.mark.parametrize(
    ("value", "said"), [(None, "REVIEWER2_TOKEN is not set"), (f"{SECRET} x", "contains whitespace")]
)
async def test_a_missing_or_unusable_token_is_an_auth_error_naming_the_variable(
    value: str | None, said: str
) -> None:
    remote = FakeRemote()
    env = {} if value is None else {"REVIEWER2_TOKEN": value}
    worker = AgentWorker({"reviewer2": ENDPOINT}, env=env, connect=connector(remote))
    store = MemoryStore()
    runtime = runtime_for(store, worker)
    head, _ = await runtime.start(StartRequest(request="r", chain="delegated"))
    done = await play(runtime, head.run_id)
    assert done.error is not None and done.error.code == "auth"
    assert said in done.error.message and SECRET not in done.error.message
    assert remote.calls == [], "nothing was sent"


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [(401, "auth", False), (403, "auth", False), (503, "agent_unreachable", True)],
)
async def test_http_failures_through_the_sdk_client_are_classified(
    status: int, code: str, retryable: bool
) -> None:
    seen: list[str] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers.get("authorization", ""))
        return httpx2.Response(status, text=f"no: {request.headers.get('authorization')}")

    worker = AgentWorker(
        {"reviewer2": ENDPOINT},
        env={"REVIEWER2_TOKEN": SECRET},
        connect=partial(connect_mcp, transport=httpx2.MockTransport(answer)),
        policy=RetryPolicy(base_delay_seconds=0),
    )
    runtime = runtime_for(MemoryStore(), worker)
    head, _ = await runtime.start(StartRequest(request="r", chain="delegated"))
    await runtime.drive(head.run_id)
    await runtime.submit_host_output(head.run_id, "architect", "design")
    await runtime.drive(head.run_id)
    review = (await runtime.snapshot(head.run_id)).head.task("review")
    error = review.attempts[0].error
    assert error is not None and (error.code, error.retryable, error.http_status) == (code, retryable, status)
    assert seen and seen[0] == f"Bearer {SECRET}"
    assert SECRET not in error.message


async def test_a_refused_connection_is_unreachable() -> None:
    worker = AgentWorker(
        {"reviewer2": ENDPOINT}, env={"REVIEWER2_TOKEN": SECRET}, policy=RetryPolicy(base_delay_seconds=0)
    )
    runtime = runtime_for(MemoryStore(), worker)
    head, _ = await runtime.start(StartRequest(request="r", chain="delegated"))
    await runtime.drive(head.run_id)
    await runtime.submit_host_output(head.run_id, "architect", "design")
    with anyio.fail_after(30):
        await runtime.drive(head.run_id)
    error = (await runtime.snapshot(head.run_id)).head.task("review").attempts[0].error
    assert error is not None and error.code == "agent_unreachable" and error.retryable
    assert "ConnectError" in error.message and SECRET not in error.message


async def test_every_prefix_of_a_delegated_run_decides_as_the_uninterrupted_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one rule for agent steps: after every durable write of a delegated run (one attempt
    lost the agent, the next followed the same remote run), the fold of the log decides as the
    run did; a prefix that ends in the middle of a call (after ``attempt_started`` or
    ``remote_run_started``) follows that call."""
    decided: dict[int, Action] = {}

    def recording(head: RunHead, now: datetime) -> Action:
        action = next_action(head, now)
        decided.setdefault(head.last_seq, action)
        return action

    monkeypatch.setattr(drive_module, "next_action", recording)
    store, remote = BoundaryStore(), FakeRemote(polls=1)
    remote.fail_polls = 1
    runtime = runtime_for(store, agent_worker(remote))
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    final = await play(runtime, head.run_id)
    assert final.status == RunStatus.COMPLETED
    facts = await store.read_facts(head.run_id)
    mid_call = 0
    for prefix_len in store.boundaries:
        folded = fold(facts[:prefix_len])
        last = facts[prefix_len - 1]
        action = next_action(folded, runtime.clock.now())
        if isinstance(last, AttemptStarted | RemoteRunStarted) and last.task_id == "review":
            mid_call += 1
            known = folded.task("review").attempts[-1]
            if last.waits:
                # the remote run is awaited outside the drive: the same attempt goes on waiting
                assert action == AwaitAgent("review", last.attempt, known.remote_run_id or "")
                continue
            assert action == StartAttempt(
                "review", last.attempt + 1, False, known.follows or known.number, known.remote_run_id
            )
            continue
        assert action == decided[prefix_len], f"prefix {prefix_len}"
    # attempt 1 before its call and once its remote run was known; attempt 2 (it followed that run)
    assert mid_call == 3


async def test_agent_steps_run_side_by_side_in_a_parallel_chain() -> None:
    """Two steps that delegate, after the same step and before a writer: both calls run at once
    (each its own remote run, recorded while the other works), and the writer sees both outputs."""
    store, remote = MemoryStore(), FakeRemote(polls=3)
    both = {"chain": "review-loop", "request": "{outputs.architect}"}
    steps = [
        {"specialist": "architect", "after": []},
        {
            "name": "left",
            "agent": "reviewer2",
            "tool": "orchestrate_start",
            "arguments": both,
            "after": ["architect"],
        },
        {
            "name": "right",
            "agent": "reviewer2",
            "tool": "orchestrate_start",
            "arguments": both,
            "after": ["architect"],
        },
        {"specialist": "writer", "after": ["left", "right"]},
    ]
    raw = {"agents": {"reviewer2": {}}, "chains": {"delegated": {"steps": steps}}}
    runtime = runtime_for(store, agent_worker(remote))
    runtime.catalog = Catalog.builtin().extended(raw, "construct.toml", Path("."))
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    done = await play(runtime, head.run_id)
    assert done.status == RunStatus.COMPLETED
    snap = await runtime.snapshot(head.run_id)
    assert snap.outputs["left"] == snap.outputs["right"] == "remote verdict"
    ids = {snap.head.task(t).attempts[0].remote_run_id for t in ("left", "right")}
    assert ids == {"remote-1", "remote-2"} and remote.starts() == 2
    prompt = (await runtime.prompt_for(snap.head, "writer")).user
    assert "### left (agent:reviewer2)" in prompt and "### right (agent:reviewer2)" in prompt
    # The two calls overlapped: both runs were started before either was followed to its end.
    starts = [i for i, (name, _) in enumerate(remote.calls) if name == "orchestrate_start"]
    first_end = next(i for i, (_, args) in enumerate(remote.calls) if args.get("detail") == "full")
    assert starts[1] < first_end, remote.calls


async def test_cancelling_the_parent_cancels_the_remote_run() -> None:
    store, remote = MemoryStore(), FakeRemote()
    remote.hang = True
    runtime = runtime_for(store, agent_worker(remote))
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    await runtime.drive(head.run_id)
    await runtime.submit_host_output(head.run_id, "architect", "the design")
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.drive, head.run_id)
        with anyio.fail_after(10):
            while True:
                attempts = (await store.load(head.run_id)).task("review").attempts
                if attempts and attempts[-1].remote_run_id is not None:
                    break
                await anyio.sleep(0.01)
        cancelled = await runtime.cancel(head.run_id, reason="not needed")
    assert cancelled.status == RunStatus.CANCELLED
    assert remote.calls[-1] == (
        "orchestrate_cancel",
        {"run_id": "remote-1", "reason": f"run {head.run_id} was cancelled"},
    )


async def test_the_view_says_who_produced_a_delegated_output() -> None:
    from server.views.run_view import run_view

    store, remote = MemoryStore(), FakeRemote(polls=1)
    runtime = runtime_for(store, agent_worker(remote))
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    await runtime.drive(head.run_id)
    await runtime.submit_host_output(head.run_id, "architect", "the design")
    await runtime.drive(head.run_id)  # the review step runs; the writer waits for the host
    view = run_view(await runtime.snapshot(head.run_id))
    assert "agent:reviewer2:orchestrate_start (agent:<name>:<tool>) were produced by that MCP agent" in (
        view.semantics
    )
    review = next(t for t in view.tasks if t.task_id == "review")
    assert [(a.remote_run_id, a.follows) for a in review.attempts] == [("remote-1", None)]


async def test_a_tool_without_keys_is_called_again_after_a_crash_marked_as_a_possible_duplicate() -> None:
    calls: list[str] = []

    class Slow:
        async def call_tool(
            self,
            name: str,
            arguments: dict[str, Any] | None = None,
            read_timeout_seconds: float | None = None,
            *,
            meta: RequestParamsMeta | None = None,
        ) -> CallToolResult:
            calls.append(name)
            if len(calls) == 1:
                await anyio.sleep_forever()  # the parent "dies" during this call
            return result(text="found it")

    @asynccontextmanager
    async def connect(
        endpoint: AgentEndpoint, token: str | None, observed: _Observed
    ) -> AsyncIterator[AgentSession]:
        yield Slow()

    step = {"name": "search", "agent": "reviewer2", "tool": "search", "arguments": {"q": "{request}"}}
    store, clock = MemoryStore(), ManualClock()
    worker = AgentWorker({"reviewer2": ENDPOINT}, env={"REVIEWER2_TOKEN": SECRET}, connect=connect)
    first = runtime_for(store, worker, owner="p1", clock=clock)
    first.catalog = catalog(step)
    head, _ = await first.start(StartRequest(request="r", chain="delegated"))
    await first.drive(head.run_id)
    await first.submit_host_output(head.run_id, "architect", "the design")
    with anyio.move_on_after(0.5):
        await first.drive(head.run_id)
    clock.advance(60)
    second = runtime_for(store, worker, owner="p2", clock=clock)
    second.catalog = first.catalog
    await second.drive(head.run_id)
    snap = await second.snapshot(head.run_id)
    search = snap.head.task("search")
    assert snap.outputs["search"] == "found it" and calls == ["search", "search"]
    assert [a.telemetry.possible_duplicate_call for a in search.attempts] == [False, True]
    assert [a.follows for a in search.attempts] == [None, None]


async def test_an_agent_that_does_not_answer_in_time_is_a_retryable_timeout() -> None:
    async def answer(request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep(30)
        return httpx2.Response(500)

    slow = AgentEndpoint(name="reviewer2", url="http://127.0.0.1:9/mcp", call_timeout_seconds=0.2)
    worker = AgentWorker(
        {"reviewer2": slow},
        connect=partial(connect_mcp, transport=httpx2.MockTransport(answer)),
        policy=RetryPolicy(base_delay_seconds=0),
    )
    runtime = runtime_for(MemoryStore(), worker)
    head, _ = await runtime.start(StartRequest(request="r", chain="delegated"))
    await runtime.drive(head.run_id)
    await runtime.submit_host_output(head.run_id, "architect", "design")
    # The SDK's protocol probe waits 10 s before it falls back to the handshake, which then times
    # out after call_timeout_seconds: the first attempt fails within about 11 s.
    with anyio.move_on_after(15):
        await runtime.drive(head.run_id)
    review = (await runtime.status(head.run_id)).task("review")
    error = review.attempts[0].error
    assert error is not None and (error.code, error.retryable) == ("timeout", True), error

"""MCP Tasks through the official client, in process: a task-aware client (it declares
``io.modelcontextprotocol/tasks`` and sends ``tasks/*`` as raw requests) and a plain one on the same
server; a handshake-era client that declares it anyway gets the plain answers.

A task is what the client can carry to its end: the runs that become tasks are provider runs (the
fake provider over real HTTP does their steps), and a client answers a gate through
``inputRequests`` only when it declares elicitation (the task-aware client here does, with a
callback that fails the test if the server ever asks mid-call). A run the host's own model works on
(an inline run) is never a task: the call answers as it does for a plain client."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest
from mcp import Client, MCPError
from mcp.client.session import ClientRequestContext
from mcp.types import (
    CallToolResult,
    ClientCapabilities,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    SubscriptionFilter,
    SubscriptionsListenRequestParams,
)

from orchestration.core.facts import RunCancelled
from server.app import ConstructApp
from server.mcp.tasks import EXTENSION_ID, MISSING_CAPABILITY, RUN_ENDED_ERROR, guard_task_notifications
from server.settings.config import load_settings
from stores.filesystem import FilesystemStore
from tests.acceptance.harness import call
from tests.acceptance.task_client import (
    CreatedTask,
    TasksClient,
    cancel_task,
    conforms,
    get_task,
    listen_for_tasks,
    start_task,
    update_task,
)
from tests.fakes.fake_provider import FakeProvider

GATED = {"request": "Write the release notes", "chain": ["writer"], "approve_before": ["writer"]}
GATE = "gate:before:writer"
#: A gate after a step the provider does (slowly enough that the start answers before it is done).
GATED_LATER = {
    "request": "Research, then write the release notes",
    "chain": ["researcher", "writer"],
    "approve_before": ["writer"],
}
SCENARIO = {
    "researcher": [{"delay_seconds": 0.5, "text": "the findings"}],
    "writer": [{"text": "the notes, from the model"}],
}
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
RUN_ID = re.compile(r"run-[0-9a-f]{12}-[0-9a-f]{16}")


def approve(decision: str = "approve", comment: str | None = None) -> dict[str, Any]:
    content: dict[str, Any] = {"decision": decision}
    if comment is not None:
        content["comment"] = comment
    return {"action": "accept", "content": content}


async def never_asked(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
    """Declares elicitation; a task's forms come in ``inputRequests``, never as a request mid-call."""
    raise AssertionError(f"the server asked mid-call: {params}")


def settings_env(home: Path, fake: FakeProvider | None, **extra: str) -> dict[str, str]:
    """A server on a filesystem store under ``home``; its runs are provider runs on ``fake`` (the
    server's default backend) when given, else inline runs."""
    env = {"CONSTRUCT_HOME": str(home), "CONSTRUCT_POLL_SECONDS": "0.1", **extra}
    if fake is not None:
        env |= {
            "CONSTRUCT_WORKER_BACKEND": "provider",
            "CONSTRUCT_MODEL": "claude-test-1",
            "CONSTRUCT_ANTHROPIC_BASE_URL": fake.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-test-key",
        }
    return env


@asynccontextmanager
async def clients(
    home: Path, *, provider: bool = True, elicits: bool = True
) -> AsyncIterator[tuple[Client, Client]]:
    """A task-aware client (declaring elicitation unless ``elicits`` is False) and a plain one on
    one server."""
    with FakeProvider(SCENARIO) as fake:
        server = ConstructApp(
            load_settings(env=settings_env(home, fake if provider else None))
        ).build_server()
        kwargs: dict[str, Any] = {"elicitation_callback": never_asked} if elicits else {}
        async with Client(server, extensions=[TasksClient()], **kwargs) as aware, Client(server) as plain:
            yield aware, plain


async def until(client: Client, task_id: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Poll ``tasks/get`` until ``done`` holds (bounded)."""
    with anyio.fail_after(20):
        while True:
            task = await get_task(client, task_id)
            if done(task):
                return task
            await anyio.sleep(0.05)


async def started(client: Client, **arguments: Any) -> CreatedTask:
    result = await start_task(client, "orchestrate_start", **arguments)
    assert isinstance(result, CreatedTask), result
    return result


async def plain_answer(client: Client, **arguments: Any) -> dict[str, Any]:
    """``orchestrate_start`` answered as a tool result (no task); its structured content."""
    result = await start_task(client, "orchestrate_start", **arguments)
    assert isinstance(result, CallToolResult) and not result.is_error, result
    assert result.structured_content is not None
    return dict(result.structured_content)


def same_but_ids(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """The two answers are the same but for run ids (two runs of the same start)."""
    return RUN_ID.sub("RUN", json.dumps(one)) == RUN_ID.sub("RUN", json.dumps(other))


async def test_a_task_aware_client_gets_a_task_and_a_plain_one_the_view(tmp_path: Path) -> None:
    async with clients(tmp_path) as (aware, plain):
        task = await started(aware, **GATED, wait_seconds=30)
        # Answered at once, as the run was stored: its first write requested the gate already,
        # and the task carries the form for it (the client declares elicitation).
        assert task.status == "input_required"
        assert (task.model_extra or {})["inputRequests"].keys() == {GATE}
        # The task is the run, stored before the answer: any client sees it at once.
        view = await call(plain, "run_status", run_id=task.task_id)
        assert view["run_id"] == task.task_id
        # The plain client's start answers as it always did: the run view, settled at the gate.
        plain_view = await call(plain, "orchestrate_start", **GATED, new_run=True)
        assert plain_view["status"] == "awaiting_approval"
        assert plain_view["next_action"]["gate_id"] == "before:writer"
        # Other tools answer a task-aware client as before too.
        result = await start_task(aware, "run_status", run_id=task.task_id)
        assert isinstance(result, CallToolResult) and not result.is_error
        # tasks/* from a client that did not declare the extension: the spec's -32021.
        for send in (get_task, cancel_task):
            with pytest.raises(MCPError) as refused:
                await send(plain, task.task_id)
            assert refused.value.error.code == MISSING_CAPABILITY
            assert refused.value.error.data == {
                "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
            }
        assert (await call(plain, "run_status", run_id=task.task_id))["status"] == "awaiting_approval"


async def test_a_handshake_era_client_gets_the_plain_answers(tmp_path: Path) -> None:
    with FakeProvider(SCENARIO) as fake:
        server = ConstructApp(load_settings(env=settings_env(tmp_path, fake))).build_server()
        async with Client(server, mode="legacy", extensions=[TasksClient()]) as legacy:
            result = await start_task(legacy, "orchestrate_start", **GATED)
            assert isinstance(result, CallToolResult) and result.structured_content is not None
            run_id = result.structured_content["run_id"]
            with pytest.raises(MCPError) as missing:
                await get_task(legacy, run_id)
            assert missing.value.error.code == METHOD_NOT_FOUND


@pytest.mark.parametrize("default", ["inline", "provider"])
async def test_a_run_the_host_s_model_works_on_is_never_a_task(tmp_path: Path, default: str) -> None:
    """Inline runs (asked for, or the server's default) and their children: the plain answer, the
    same one a client without the extension gets, whose next_action is the host task."""
    async with clients(tmp_path, provider=default == "provider") as (aware, plain):
        inline = {"request": "Write the release notes", "chain": ["writer"], "new_run": True}
        if default == "provider":
            inline["worker_backend"] = "inline"
        mine = await plain_answer(aware, **inline)
        theirs = await call(plain, "orchestrate_start", **inline)
        assert mine["next_action"]["kind"] == "run_host_task" and mine["status"] == "awaiting_host"
        assert same_but_ids(mine, theirs), (mine, theirs)
        # A gated inline run, too: the gate is in the answer, no task is made of it.
        gated = await plain_answer(aware, **{**inline, **GATED})
        assert gated["next_action"]["kind"] == "approve"
        # A child run the host starts for its task, inline too.
        child = await plain_answer(
            aware,
            request="Draft the changelog",
            chain=["writer"],
            parent_run_id=mine["run_id"],
            parent_task_id="writer",
            **{k: v for k, v in inline.items() if k == "worker_backend"},
        )
        assert child["next_action"]["kind"] == "run_host_task"
        # Were the run's id asked for as a task, it is handed over: the same view, as a final result.
        done = await get_task(aware, mine["run_id"])
        assert done["status"] == "completed" and done["statusMessage"].startswith("handed over: ")
        assert done["result"]["structuredContent"]["next_action"]["kind"] == "run_host_task"


async def test_a_handed_over_result_is_the_answer_run_status_gives(tmp_path: Path) -> None:
    """Prompts too long for one answer come in parts (next_action read_prompt) in the result too."""
    async with clients(tmp_path, provider=False) as (aware, plain):
        long = await plain_answer(
            aware, request="Write the release notes. " + "Detail. " * 2000, chain=["writer"]
        )
        assert long["next_action"]["kind"] == "read_prompt", long["next_action"]["kind"]
        done = await get_task(aware, long["run_id"])
        assert done["status"] == "completed"
        status = await start_task(plain, "run_status", run_id=long["run_id"])
        assert isinstance(status, CallToolResult) and not status.is_error
        answered = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        for key in ("content", "structuredContent"):  # the SDK adds _meta, isError and resultType
            assert done["result"][key] == answered[key], key
        assert len(done["result"]["content"][0]["text"]) <= 10_000


async def test_a_gate_first_is_no_task_for_a_client_without_elicitation(tmp_path: Path) -> None:
    async with clients(tmp_path, elicits=False) as (aware, plain):
        mine = await plain_answer(aware, **GATED, new_run=True)
        theirs = await call(plain, "orchestrate_start", **GATED, new_run=True)
        assert mine["status"] == "awaiting_approval" and mine["next_action"]["gate_id"] == "before:writer"
        assert same_but_ids(mine, theirs), (mine, theirs)


async def test_a_task_that_comes_to_a_gate_it_cannot_answer_is_handed_over(tmp_path: Path) -> None:
    """No elicitation: the gate after the first step hands the task over, completed with the view
    whose next_action names the orchestrate_approve call; the client never polls for ever."""
    async with clients(tmp_path, elicits=False) as (aware, plain):
        task = await started(aware, **GATED_LATER)
        assert task.status == "working"
        done = await until(aware, task.task_id, lambda t: t["status"] != "working")
        assert done["status"] == "completed" and "inputRequests" not in done
        view = done["result"]["structuredContent"]
        assert view["status"] == "awaiting_approval" and view["next_action"]["gate_id"] == "before:writer"
        assert done["statusMessage"].startswith("handed over: ")
        assert "orchestrate_approve with {" in done["statusMessage"]
        # The model acts on it with a tool call; the run goes on to its end, which run_status
        # follows. The task is terminal: later tasks/get calls answer it as it was handed over.
        await call(
            plain, "orchestrate_approve", run_id=task.task_id, gate_id="before:writer", decision="approve"
        )
        for _ in range(100):
            view = await call(plain, "run_status", run_id=task.task_id)
            if view["status"] == "completed":
                break
            await anyio.sleep(0.05)
        assert view["status"] == "completed"
        assert await get_task(aware, task.task_id) == done


async def test_a_gate_is_answered_with_tasks_update_and_the_task_followed_to_its_result(
    tmp_path: Path,
) -> None:
    async with clients(tmp_path) as (aware, plain):
        task_id = (await started(aware, **GATED)).task_id
        waiting = await until(aware, task_id, lambda t: t["status"] == "input_required")
        form = waiting["inputRequests"][GATE]
        assert form["method"] == "elicitation/create" and form["params"]["mode"] == "form"
        assert form["params"]["requestedSchema"]["properties"]["decision"]["enum"] == ["approve", "reject"]
        assert "before:writer" in form["params"]["message"]
        # An answer that does not fit the form is refused; one for no open request is ignored.
        with pytest.raises(MCPError) as bad:
            await update_task(aware, task_id, {GATE: approve("maybe")})
        assert bad.value.error.code == INVALID_PARAMS
        ack = await update_task(aware, task_id, {"gate:after:nothing": approve()})
        assert ack["resultType"] == "complete" and set(ack) <= {"resultType", "_meta"}
        # A declined form leaves the gate pending.
        await update_task(aware, task_id, {GATE: {"action": "decline"}})
        assert (await get_task(aware, task_id))["inputRequests"].keys() == {GATE}
        # The decision, twice (a retried update): one decision, through the form's path.
        await update_task(aware, task_id, {GATE: approve(comment="ship it")})
        await update_task(aware, task_id, {GATE: approve(comment="ship it")})
        # The provider does the step, and the task completes with the final view.
        done = await until(aware, task_id, lambda t: t["status"] == "completed")
        final = done["result"]["structuredContent"]
        assert final["run_id"] == task_id and final["status"] == "completed"
        assert final["tasks"][0]["output_preview"] == "the notes, from the model"
        view = await call(plain, "run_status", run_id=task_id)
        (gate,) = view["gates"]
        assert (gate["status"], gate["channel"], gate["comment"]) == ("approved", "elicitation", "ship it")


async def test_a_rejection_fails_the_task_with_its_reason(tmp_path: Path) -> None:
    async with clients(tmp_path) as (aware, _plain):
        task_id = (await started(aware, **GATED)).task_id
        await until(aware, task_id, lambda t: t["status"] == "input_required")
        await update_task(aware, task_id, {GATE: approve("reject", "not now")})
        failed = await until(aware, task_id, lambda t: t["status"] == "failed")
        assert failed["error"]["code"] == RUN_ENDED_ERROR
        assert failed["error"]["data"]["reason"] == "rejected"
        assert "not now" in failed["error"]["message"]


async def test_tasks_cancel_cancels_the_run_and_is_an_ack_once_it_ended(tmp_path: Path) -> None:
    async with clients(tmp_path) as (aware, plain):
        task_id = (await started(aware, **GATED)).task_id
        ack = await cancel_task(aware, task_id)
        assert ack["resultType"] == "complete" and set(ack) <= {"resultType", "_meta"}
        cancelled = await get_task(aware, task_id)
        assert cancelled["status"] == "cancelled"
        assert (await call(plain, "run_status", run_id=task_id))["status"] == "cancelled"
        await cancel_task(aware, task_id)  # again: an ack
        # A run that ended otherwise stays as it ended (new_run: the same start made the first).
        other = (await started(aware, **GATED, new_run=True)).task_id
        await until(aware, other, lambda t: t["status"] == "input_required")
        await update_task(aware, other, {GATE: approve("reject")})
        await until(aware, other, lambda t: t["status"] == "failed")
        await cancel_task(aware, other)
        assert (await get_task(aware, other))["status"] == "failed"
    # Recorded as orchestrate_cancel records it: over stdio (in process), nobody named.
    facts = await FilesystemStore(tmp_path).read_facts(task_id)
    (cancel,) = [f for f in facts if isinstance(f, RunCancelled)]
    assert (cancel.reason, cancel.cancelled_by, cancel.channel, cancel.verified) == (
        "tasks/cancel",
        None,
        "stdio",
        False,
    )


@pytest.mark.parametrize("task_id", ["run-doesnotexist0000", "../../etc/passwd", "x" * 200, "RUN-UPPER"])
async def test_an_unknown_or_malformed_task_id_is_invalid_params(tmp_path: Path, task_id: str) -> None:
    async with clients(tmp_path) as (aware, _plain):
        for send in (get_task, cancel_task):
            with pytest.raises(MCPError) as refused:
                await send(aware, task_id)
            assert refused.value.error.code == INVALID_PARAMS
            assert refused.value.error.message.startswith("Failed to retrieve task: Task not found")
        with pytest.raises(MCPError) as refused:
            await update_task(aware, task_id, {GATE: approve()})
        assert refused.value.error.code == INVALID_PARAMS


async def test_a_refused_start_is_a_tool_error_and_a_repeated_key_the_same_task(tmp_path: Path) -> None:
    async with clients(tmp_path) as (aware, _plain):
        refused = await start_task(aware, "orchestrate_start", request="x", chain="no-such-chain")
        assert isinstance(refused, CallToolResult) and refused.is_error
        first = await started(aware, **GATED, idempotency_key="notes-1")
        again = await started(aware, **GATED, idempotency_key="notes-1")
        assert again.task_id == first.task_id
        conforms("CreateTaskResult", again.model_dump(by_alias=True, mode="json"))


async def test_task_notifications_are_refused_to_a_client_that_did_not_declare_tasks(tmp_path: Path) -> None:
    async with clients(tmp_path) as (aware, plain):
        task_id = (await started(aware, **GATED)).task_id
        with pytest.raises(MCPError) as refused:
            await listen_for_tasks(plain, [task_id])
        assert refused.value.error.code == MISSING_CAPABILITY


async def test_a_declaring_client_s_listen_goes_through() -> None:
    """The stream itself is the SDK's (its acknowledgement lists no task ids: none are pushed)."""
    seen: list[SubscriptionsListenRequestParams] = []

    async def listen(ctx: Any, params: SubscriptionsListenRequestParams) -> str:
        seen.append(params)
        return "listening"

    params = SubscriptionsListenRequestParams(
        notifications=SubscriptionFilter.model_validate({"taskIds": ["t"]})
    )
    declared: dict[str, dict[str, Any]] = {EXTENSION_ID: {}}
    for extensions, allowed in ((declared, True), (None, False)):
        capabilities = ClientCapabilities(extensions=extensions)
        ctx = SimpleNamespace(
            protocol_version="2026-07-28", session=SimpleNamespace(client_capabilities=capabilities)
        )
        guarded = guard_task_notifications(listen)
        if allowed:
            assert await guarded(cast(Any, ctx), params) == "listening" and seen == [params]
        else:
            with pytest.raises(MCPError):
                await guarded(cast(Any, ctx), params)

"""Every chain as an A2A agent, driven by the A2A SDK's own Python client (``a2a-sdk``) against a
real server process over HTTP: the agent card, a chain with host tasks and a gate carried to its
end through ``input-required`` replies, a resent message that finds the same task, streaming,
cancel, listing, the JSON-RPC 0.3 method names, and the identities and "own runs only" rules of
the MCP tools."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import A2AError
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client

from tests.acceptance.harness import call, free_port, full_view, read_log
from tests.acceptance.test_mcp_http import http_server_on
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

ALICE = "alice-token-" + "4c1e8b2f7a9d"
BOB = "bob-token-" + "93f0a6d2c5e18b"
TOKENS = f"""
[tokens.alice]
token = "{ALICE}"
roles = ["read", "operate", "approve"]

[tokens.bob]
token = "{BOB}"
roles = ["read", "operate", "approve"]
own_runs_only = true
"""


@asynccontextmanager
async def served(home: Path, config: str = "") -> AsyncIterator[str]:
    """The server over Streamable HTTP with ``config``; yields its base URL."""
    port = free_port()
    (home / "construct.toml").write_text(config)
    async with http_server_on(port, home, "streamable-http"):
        yield f"http://127.0.0.1:{port}"


def provider_env(fake: FakeProvider) -> dict[str, str]:
    """A server whose tasks run on the fake provider."""
    return {
        "CONSTRUCT_WORKER_BACKEND": "provider",
        "CONSTRUCT_MODEL": "claude-test-1",
        "CONSTRUCT_ANTHROPIC_BASE_URL": fake.base_url,
        "ANTHROPIC_API_KEY": "sk-ant-test-a2a-face",
    }


@asynccontextmanager
async def a2a_client(
    base: str, token: str | None = None, *, streaming: bool = False
) -> AsyncIterator[Client]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=90) as http:
        factory = ClientFactory(ClientConfig(streaming=streaming, polling=False, httpx_client=http))
        client = await factory.create_from_url(base)
        async with client:
            yield client


def message(
    text: str, message_id: str, *, task_id: str = "", context_id: str = "", **metadata: Any
) -> Message:
    sent = Message(
        message_id=message_id,
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        task_id=task_id,
        context_id=context_id,
    )
    if metadata:
        sent.metadata.update(metadata)
    return sent


async def send(client: Client, sent: Message, *, at_once: bool = False) -> Task:
    request = SendMessageRequest(
        message=sent, configuration=SendMessageConfiguration(return_immediately=at_once)
    )
    answers = [a async for a in client.send_message(request)]
    assert answers and answers[-1].HasField("task"), answers
    return answers[-1].task


def questions(task: Task) -> list[dict[str, Any]]:
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, task
    data = [MessageToDict(p.data) for p in task.status.message.parts if p.HasField("data")]
    return list(data[0]["questions"])


async def test_a_chain_with_host_tasks_and_a_gate_to_its_end(tmp_path: Path) -> None:
    async with served(tmp_path) as base:
        async with httpx.AsyncClient() as http:
            card = (await http.get(f"{base}/.well-known/agent-card.json")).json()
        assert {s["id"] for s in card["skills"]} >= {"default", "review-loop", "research"}
        assert card["supportedInterfaces"][0]["url"] == f"{base}/a2a"
        assert card["capabilities"]["streaming"] is True

        async with a2a_client(base) as client:
            first = message(
                "Add a health endpoint.",
                "m-1",
                context_id="ctx-7",
                chain="default",
                approve_before=["engineer"],
            )
            task = await send(client, first)
            assert task.context_id == "ctx-7"
            again = await send(client, first)
            assert again.id == task.id, "a resent message is the same task"

            replies = 0
            while task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
                asked = questions(task)[0]
                if asked["kind"] == "host_task":
                    assert asked["user_prompt"] and asked["system_prompt"]
                    output = f"[a2a output] {asked['task_id']}"
                    reply = message(output, f"r-{replies}", task_id=task.id, context_id=task.context_id)
                    reply.metadata.update({"task_id": asked["task_id"]})
                else:
                    assert asked["kind"] == "gate" and "approve" in asked["choices"]
                    reply = message("Ship it.", f"r-{replies}", task_id=task.id, context_id=task.context_id)
                    reply.metadata.update({"gate_id": asked["gate_id"], "decision": "approve"})
                task = await send(client, reply)
                # the same reply again records nothing twice
                assert (await send(client, reply)).id == task.id
                replies += 1
            assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
            assert replies == 4  # architect, the gate before engineer, engineer, reviewer
            outputs = {a.artifact_id: a.parts[0].text for a in task.artifacts}
            assert outputs == {t: f"[a2a output] {t}" for t in ("architect", "engineer", "reviewer")}

            got = await client.get_task(GetTaskRequest(id=task.id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED and got.context_id == "ctx-7"
            listed = await client.list_tasks(ListTasksRequest(context_id="ctx-7", include_artifacts=False))
            assert [t.id for t in listed.tasks] == [task.id] and not listed.tasks[0].artifacts

            other = await send(client, message("Another one.", "m-2"), at_once=True)
            assert other.context_id == other.id  # no context given: the task is its own context
            cancelled = await client.cancel_task(CancelTaskRequest(id=other.id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            with pytest.raises(A2AError) as refused:
                await client.cancel_task(CancelTaskRequest(id=task.id))
            assert "invalid_state" in str(refused.value)
            with pytest.raises(A2AError) as missing:
                await client.get_task(GetTaskRequest(id="run_nope"))
            assert "run_not_found" in str(missing.value)


async def test_a_stream_follows_the_task_until_it_needs_its_caller(tmp_path: Path) -> None:
    async with served(tmp_path) as base, a2a_client(base, streaming=True) as client:
        request = SendMessageRequest(message=message("Stream it.", "s-1"))
        events = [MessageToDict(e) async for e in client.send_message(request)]
        assert "task" in events[0], events
        last = events[-1]
        state = (last.get("task") or last.get("statusUpdate") or {}).get("status", {}).get("state")
        assert state == "TASK_STATE_INPUT_REQUIRED", events


async def test_a_stream_carries_a_provider_call_as_it_is_written(tmp_path: Path) -> None:
    text = "".join(f"line {i:02d} of the writer's answer\n" for i in range(60))
    scenario = {"writer": [{"text": text, "chunk_chars": 60, "chunk_delay_seconds": 0.05}]}
    with FakeProvider(scenario) as fake:
        env = provider_env(fake)
        port = free_port()
        async with (
            http_server_on(port, tmp_path, "streamable-http", env=env),
            a2a_client(f"http://127.0.0.1:{port}", streaming=True) as client,
        ):
            request = SendMessageRequest(message=message("Write it.", "w-1", chain=["writer"]))
            events = [e async for e in client.send_message(request)]
    pieces = [e.artifact_update for e in events if e.HasField("artifact_update")]
    growing = [p for p in pieces if not p.last_chunk]
    assert len(growing) >= 2, "the output arrives in pieces while the call runs"
    assert not growing[0].append and all(p.append for p in growing[1:])
    assert text.startswith("".join(p.artifact.parts[0].text for p in growing))
    whole = [p for p in pieces if p.last_chunk]
    assert [w.artifact.parts[0].text for w in whole] == [text]
    last = events[-1]
    assert (
        last.HasField("status_update") and last.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    )


async def test_a_blocking_send_waits_for_the_end_up_to_its_bound(tmp_path: Path) -> None:
    """A blocking ``SendMessage`` answers once the task ended; past ``[a2a] blocking_wait_seconds``
    it answers with the task still working, which ``GetTask`` then follows to its end."""
    text = "".join(f"line {i:02d}\n" for i in range(40))
    slow = {"writer": [{"text": text, "chunk_chars": 20, "chunk_delay_seconds": 0.1}]}  # about 2 s
    with FakeProvider(slow) as fake:
        (tmp_path / "construct.toml").write_text("[a2a]\nblocking_wait_seconds = 1\n")
        port = free_port()
        async with (
            http_server_on(port, tmp_path, "streamable-http", env=provider_env(fake)),
            a2a_client(f"http://127.0.0.1:{port}") as client,
        ):
            working = await send(client, message("Write it.", "b-1", chain=["writer"]))
            assert working.status.state in (TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_SUBMITTED)
            ended = (TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED)
            done = working
            with anyio.fail_after(30):
                for _ in range(150):
                    done = await client.get_task(GetTaskRequest(id=working.id))
                    if done.status.state in ended:
                        break
                    await anyio.sleep(0.2)
            assert done.status.state == TaskState.TASK_STATE_COMPLETED
            # another run, with a bound it fits in: the blocking send answers it completed
    with FakeProvider(slow) as fake:
        port = free_port()
        (tmp_path / "construct.toml").write_text("[a2a]\nblocking_wait_seconds = 30\n")
        async with (
            http_server_on(port, tmp_path, "streamable-http", env=provider_env(fake)),
            a2a_client(f"http://127.0.0.1:{port}") as client,
        ):
            ended = await send(client, message("Write it again.", "b-2", chain=["writer"]))
            assert ended.status.state == TaskState.TASK_STATE_COMPLETED, ended.status
            assert ended.artifacts[0].parts[0].text == text


async def test_the_json_rpc_0_3_names_and_refusals(tmp_path: Path) -> None:
    async with served(tmp_path) as base, httpx.AsyncClient() as http:
        sent = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {
                "message": {
                    "kind": "message",
                    "messageId": "old-1",
                    "role": "user",
                    "parts": [{"kind": "text", "text": "From an 0.3 client."}],
                },
                "configuration": {"blocking": True},
            },
        }
        answer = (await http.post(f"{base}/a2a", json=sent)).json()
        assert answer["result"]["status"]["state"] == "input-required", answer
        task_id = answer["result"]["id"]
        got = (
            await http.post(
                f"{base}/a2a",
                json={"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task_id}},
            )
        ).json()
        assert got["result"]["id"] == task_id
        # a reply that names nothing says what the task waits for
        vague = json.loads(json.dumps(sent))
        vague["params"]["message"] |= {"messageId": "old-2", "taskId": task_id}
        refused = (await http.post(f"{base}/a2a", json=vague)).json()
        assert (
            "invalid_request" in refused["error"]["message"]
            and "task_id architect" in refused["error"]["message"]
        )
        # a rebinding Host is refused on a loopback bind
        rebound = await http.post(f"{base}/a2a", json=sent, headers={"Host": "evil.example:80"})
        assert rebound.status_code == 403


async def test_tokens_roles_and_own_runs_only(tmp_path: Path) -> None:
    async with served(tmp_path, TOKENS) as base:
        async with httpx.AsyncClient() as http:
            card = await http.get(f"{base}/.well-known/agent-card.json")
            assert card.status_code == 200 and "bearer" in card.json()["securitySchemes"]
            bare = await http.post(
                f"{base}/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {}}
            )
            assert bare.status_code == 401 and bare.headers["www-authenticate"].startswith("Bearer")
            # a JSON-RPC error an A2A client can read, saying what is wrong
            assert bare.json()["error"]["message"].startswith("unauthorized: send 'Authorization: Bearer")
            wrong = await http.post(
                f"{base}/a2a",
                json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {}},
                headers={"Authorization": "Bearer not-a-token-of-this-server"},
            )
            assert wrong.status_code == 401 and wrong.json()["error"]["data"]["code"] == "unauthorized"
        async with a2a_client(base, ALICE) as alice, a2a_client(base, BOB) as bob:
            secret = await send(alice, message("Alice's secret plan.", "a-1"), at_once=True)
            with pytest.raises(A2AError) as hidden:
                await bob.get_task(GetTaskRequest(id=secret.id))
            assert "run_not_found" in str(hidden.value) and "secret" not in str(hidden.value)
            with pytest.raises(A2AError):
                await bob.cancel_task(CancelTaskRequest(id=secret.id))
            # the same context and message ids from another identity start another run
            own = await send(bob, message("Bob's plan.", "a-1"), at_once=True)
            assert own.id != secret.id
            assert [t.id for t in (await bob.list_tasks(ListTasksRequest())).tasks] == [own.id]
            assert secret.id in {t.id for t in (await alice.list_tasks(ListTasksRequest())).tasks}
        log = read_log(tmp_path / "server.log")
        assert ALICE not in log and BOB not in log


PARENT = """
[agents.child]
protocol = "a2a"
url = "http://127.0.0.1:CHILD_PORT"
token_env = "CHILD_TOKEN"
paused_poll_seconds = 0.2
poll_cap_seconds = 1
call_timeout_seconds = 30

[chains.delegated]
steps = [{ name = "delegate", agent = "child", message = "{request}" }]
"""


async def test_a_chain_step_delegates_to_a_chain_of_another_construct(tmp_path: Path) -> None:
    """construct to construct: the parent's agent step sends its message to the child server's
    A2A face (behind a token), follows the child's run to its end, and takes its outputs."""
    scenario = {t: [{"text": f"the child's {t}"}] for t in ("architect", "engineer", "reviewer")}
    child_home, parent_home = tmp_path / "child", tmp_path / "parent"
    child_home.mkdir()
    parent_home.mkdir()
    child_port = free_port()
    with FakeProvider(scenario) as fake:
        child_env = provider_env(fake)
        (child_home / "construct.toml").write_text(TOKENS)
        async with http_server_on(child_port, child_home, "streamable-http", env=child_env):
            (parent_home / "construct.toml").write_text(PARENT.replace("CHILD_PORT", str(child_port)))
            parent_port = free_port()
            async with (
                http_server_on(parent_port, parent_home, "streamable-http", env={"CHILD_TOKEN": ALICE}),
                McpClient(f"http://127.0.0.1:{parent_port}/mcp") as client,
            ):
                view = await call(
                    client, "orchestrate_start", chain="delegated", request="a cache", wait_seconds=0
                )
                with anyio.fail_after(60):
                    while view["status_kind"] != "terminal":
                        view = await call(client, "run_status", run_id=view["run_id"], wait_seconds=2)
                record = await full_view(client, view["run_id"])
            async with a2a_client(f"http://127.0.0.1:{child_port}", ALICE) as child:
                tasks = (await child.list_tasks(ListTasksRequest())).tasks
    assert view["status"] == "completed", record
    ask = next(t for t in record["tasks"] if t["task_id"] == "delegate")
    assert ask["output"] == "the child's architect\nthe child's engineer\nthe child's reviewer"
    assert len(tasks) == 1 and tasks[0].id == ask["attempts"][0]["remote_run_id"]
    assert tasks[0].status.state == TaskState.TASK_STATE_COMPLETED
    assert ALICE not in read_log(parent_home / "server.log")


CHILD_GATED = """
[chains.default]
steps = ["architect", { specialist = "engineer", approve_before = true }]
"""


async def test_a_gate_of_the_remote_chain_is_answered_through_the_parent(tmp_path: Path) -> None:
    """construct to construct with a gate on the remote: the child's run stops at its gate, which
    the parent's step shows as a question gate of the parent's run; approved there (the comment
    the answer), the answer reaches the child as its gate's decision, by the parent's token's
    identity, verified, and both runs complete."""
    scenario = {t: [{"text": f"the child's {t}"}] for t in ("architect", "engineer")}
    child_home, parent_home = tmp_path / "child", tmp_path / "parent"
    child_home.mkdir()
    parent_home.mkdir()
    child_port, parent_port = free_port(), free_port()
    with FakeProvider(scenario) as fake:
        (child_home / "construct.toml").write_text(TOKENS + CHILD_GATED)
        (parent_home / "construct.toml").write_text(PARENT.replace("CHILD_PORT", str(child_port)))
        async with (
            http_server_on(child_port, child_home, "streamable-http", env=provider_env(fake)),
            http_server_on(parent_port, parent_home, "streamable-http", env={"CHILD_TOKEN": ALICE}),
            McpClient(f"http://127.0.0.1:{parent_port}/mcp") as parent,
        ):
            view = await call(
                parent, "orchestrate_start", chain="delegated", request="a cache", wait_seconds=0
            )
            with anyio.fail_after(60):
                while view["next_action"]["kind"] != "approve":
                    view = await call(parent, "run_status", run_id=view["run_id"], wait_seconds=2)
            asked = view["next_action"]
            assert (
                asked["gate_id"].startswith("question:delegate") and "before:engineer" in asked["guards"]
            ), asked
            view = await call(
                parent,
                "orchestrate_approve",
                run_id=view["run_id"],
                gate_id=asked["gate_id"],
                decision="approve",
                comment="Go ahead, keep it small.",
            )
            with anyio.fail_after(60):
                while view["status_kind"] != "terminal":
                    view = await call(parent, "run_status", run_id=view["run_id"], wait_seconds=2)
            record = await full_view(parent, view["run_id"])
            async with a2a_client(f"http://127.0.0.1:{child_port}", ALICE) as child:
                (task,) = (await child.list_tasks(ListTasksRequest())).tasks
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"}) as authed,
                McpClient(
                    streamable_http_client(f"http://127.0.0.1:{child_port}/mcp", http_client=authed)
                ) as mcp,
            ):
                child_record = await full_view(mcp, task.id)
    assert view["status"] == "completed", record
    delegate = next(t for t in record["tasks"] if t["task_id"] == "delegate")
    assert delegate["output"] == "the child's architect\nthe child's engineer"
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    (gate,) = child_record["gates"]
    assert (gate["gate_id"], gate["status"], gate["comment"]) == (
        "before:engineer",
        "approved",
        "Go ahead, keep it small.",
    )
    assert (gate["approver"], gate["verified"]) == ("alice", True)

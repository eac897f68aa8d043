"""A2A push notifications from a real server process to a real webhook (a small Starlette app on
127.0.0.1 run by the test), driven by the A2A SDK's own client: each state change of a gated chain
arrives signed (checked against the key set the server publishes) with the client's token; a
webhook that answers 503 gets the notification again; a server SIGKILLed while its webhook is down
delivers the state at its restart; the configs are read, listed and deleted; the token is in no
stored record and no log line; what is refused is coded."""

from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import jwt
import pytest
import uvicorn
from a2a.client import Client
from a2a.types import (
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    SendMessageConfiguration,
    SendMessageRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import A2AError, PushNotificationNotSupportedError
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.acceptance.harness import free_port, read_log, server_env
from tests.acceptance.processes import http_server
from tests.acceptance.test_a2a_face import a2a_client, message, questions, send

pytestmark = pytest.mark.slow

CLIENT_TOKEN = "client-webhook-token-" + "5be0c1d94f27"
PUSH_CONFIG = """
[a2a]
push_signing_key_file = "{key}"
push_private_urls = true
push_max_configs = 2
"""


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    #: the webhook URL's query (the second config of a task has one)
    query: str

    @property
    def task(self) -> dict[str, Any]:
        return dict(json.loads(self.body)["task"])

    @property
    def state(self) -> str:
        return str(self.task["status"]["state"])


@dataclass
class Webhook:
    """A webhook receiver: records what it is sent; answers 503 to the next ``failing`` posts."""

    port: int
    failing: int = 0
    received: list[Received] = field(default_factory=list)
    refused: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def hook(self, request: Request) -> Response:
        body = await request.body()
        if self.failing:
            self.failing -= 1
            self.refused += 1
            return Response(status_code=503)
        self.received.append(Received(dict(request.headers), body, request.url.query))
        return Response(status_code=204)

    async def until(self, state: str, count: int = 1, seconds: float = 30) -> list[Received]:
        with anyio.fail_after(seconds):
            # the receiver has no other way to tell than what it recorded
            while len(self.first_config(state)) < count:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        return self.first_config(state)

    def first_config(self, state: str | None = None) -> list[Received]:
        """What the config ``hook-1`` (the one without a query) was sent, in ``state``."""
        return [r for r in self.received if not r.query and state in (None, r.state)]


@asynccontextmanager
async def webhook_up(hook: Webhook) -> AsyncIterator[Webhook]:
    app = Starlette(routes=[Route("/hook", hook.hook, methods=["POST"])])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=hook.port, log_config=None, lifespan="off")
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 - uvicorn sets a flag, no event
                await anyio.sleep(0.02)
        try:
            yield hook
        finally:
            server.should_exit = True


def push_home(home: Path) -> Path:
    """A home whose config offers push notifications, with a new key."""
    key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (home / "push-key.pem").write_bytes(key)
    (home / "construct.toml").write_text(PUSH_CONFIG.format(key=home / "push-key.pem"))
    return home


@asynccontextmanager
async def push_server(home: Path, port: int) -> AsyncIterator[tuple[str, Any]]:
    async with http_server(server_env(home), home / "server.log", port) as (process, _):
        yield f"http://127.0.0.1:{port}", process


async def start_with_push(client: Client, hook: Webhook, message_id: str, **metadata: Any) -> Task:
    config = TaskPushNotificationConfig(id="hook-1", url=hook.url, token=CLIENT_TOKEN)
    request = SendMessageRequest(
        message=message("Add a health endpoint.", message_id, **metadata),
        configuration=SendMessageConfiguration(task_push_notification_config=config),
    )
    answers = [a async for a in client.send_message(request)]
    return answers[-1].task


def reply_to(task: Task, n: int) -> Message:
    asked = questions(task)[0]
    if asked["kind"] == "host_task":
        reply = message(f"[output] {asked['task_id']}", f"r-{n}", task_id=task.id)
        reply.metadata.update({"task_id": asked["task_id"]})
    else:
        reply = message("Ship it.", f"r-{n}", task_id=task.id)
        reply.metadata.update({"gate_id": asked["gate_id"], "decision": "approve"})
    return reply


def check_signed(note: Received, keys: jwt.PyJWKSet, hook: Webhook, task_id: str) -> None:
    assert note.headers["x-a2a-notification-token"] == CLIENT_TOKEN
    assert note.headers["content-type"] == "application/a2a+json"
    signature = note.headers["x-a2a-notification-signature"]
    kid = jwt.get_unverified_header(signature)["kid"]
    [key] = [k for k in keys.keys if k.key_id == kid]
    claims = jwt.decode(signature, key.key, algorithms=["ES256"], audience=hook.url)
    assert claims["task_id"] == task_id == note.task["id"]
    assert claims["config_id"] == "hook-1"
    assert claims["request_body_sha256"] == hashlib.sha256(note.body).hexdigest()


def recorded(home: Path, fact_type: str) -> int:
    """How many facts of ``fact_type`` the filesystem store under ``home`` holds."""
    return sum(
        path.read_bytes().count(f'"type":"{fact_type}"'.encode())
        for path in home.rglob("*")
        if path.is_file()
    )


def no_secret_in(home: Path) -> None:
    """The client's token is in no file of the server's home: the store's records, the log."""
    for path in home.rglob("*"):
        if path.is_file():
            assert CLIENT_TOKEN.encode() not in path.read_bytes(), path


async def refused(call: Any) -> str:
    with pytest.raises(A2AError) as caught:
        await call
    return str(caught.value)


async def test_a_gated_chain_notifies_its_webhook_signed_with_the_token(tmp_path: Path) -> None:
    home = push_home(tmp_path)
    async with (
        webhook_up(Webhook(free_port())) as hook,
        push_server(home, free_port()) as (base, _),
        a2a_client(base) as client,
    ):
        async with httpx.AsyncClient() as http:
            card = (await http.get(f"{base}/.well-known/agent-card.json")).json()
            assert card["capabilities"]["pushNotifications"] is True
            keys = jwt.PyJWKSet.from_dict((await http.get(f"{base}/.well-known/a2a-push-jwks.json")).json())
        task = await start_with_push(client, hook, "m-1", chain="default", approve_before=["engineer"])
        first = (await hook.until("TASK_STATE_INPUT_REQUIRED"))[0]
        check_signed(first, keys, hook, task.id)
        again = await start_with_push(client, hook, "m-1", chain="default", approve_before=["engineer"])
        assert again.id == task.id and recorded(home, "push_configured") == 1, "a resend sets nothing twice"

        # the configs: read, listed (never with the token), a second one set and deleted
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task.id, id="hook-1")
        )
        assert (got.id, got.task_id, got.url, got.token) == ("hook-1", task.id, hook.url, "")
        second = TaskPushNotificationConfig(task_id=task.id, id="hook-2", url=hook.url + "?second=1")
        await client.create_task_push_notification_config(second)
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
        assert [c.id for c in listed.configs] == ["hook-1", "hook-2"]
        third = TaskPushNotificationConfig(task_id=task.id, id="hook-3", url=hook.url)
        assert "too_large" in await refused(client.create_task_push_notification_config(third))
        for bad in ("ftp://127.0.0.1/hook", "http://user:pw@127.0.0.1/hook"):
            config = TaskPushNotificationConfig(task_id=task.id, id="hook-2", url=bad)
            assert "invalid_argument" in await refused(client.create_task_push_notification_config(config))
        for _ in range(2):  # deleting is idempotent
            await client.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="hook-2")
            )
        missing = GetTaskPushNotificationConfigRequest(task_id=task.id, id="hook-2")
        assert "push_config_not_found" in await refused(client.get_task_push_notification_config(missing))

        replies = 0
        while task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            task = await send(client, reply_to(task, replies))
            replies += 1
        assert task.status.state == TaskState.TASK_STATE_COMPLETED and replies == 4
        done = (await hook.until("TASK_STATE_COMPLETED"))[0]
        check_signed(done, keys, hook, task.id)
        assert {a["artifactId"] for a in done.task["artifacts"]} == {"architect", "engineer", "reviewer"}
        asked = hook.first_config("TASK_STATE_INPUT_REQUIRED")
        kinds = [r.task["status"]["message"]["parts"][1]["data"]["questions"][0]["kind"] for r in asked]
        assert kinds == ["host_task", "gate", "host_task", "host_task"], kinds
        # the second config was sent the state it was set in, and nothing after it was deleted
        assert [r.state for r in hook.received if r.query] == ["TASK_STATE_INPUT_REQUIRED"]

        late = TaskPushNotificationConfig(task_id=task.id, id="hook-4", url=hook.url)
        assert "invalid_state" in await refused(client.create_task_push_notification_config(late))
    no_secret_in(home)
    assert "push_delivered" in read_log(home / "server.log") or "delivered to" in read_log(
        home / "server.log"
    )


async def test_retries_and_a_restart_deliver_at_least_once(tmp_path: Path) -> None:
    home = push_home(tmp_path)
    hook, port = Webhook(free_port(), failing=2), free_port()
    async with webhook_up(hook), push_server(home, port) as (base, _), a2a_client(base) as client:
        task = await start_with_push(client, hook, "m-1", chain="default", approve_before=["engineer"])
        assert len(await hook.until("TASK_STATE_INPUT_REQUIRED")) == 1
        assert hook.refused == 2, "503 twice, then delivered"
        assert questions(task)[0]["task_id"] == "architect"
    # the server is gone (killed on leaving); the webhook is down from now on
    async with push_server(home, port) as (base, process), a2a_client(base) as client:
        await anyio.sleep(0.5)
        answered = await send(client, reply_to(task, 0), at_once=True)
        assert answered.id == task.id
        await anyio.sleep(1.5)  # the gate's notification is tried against a webhook that is down
        process.send_signal(signal.SIGKILL)
        await process.wait()
    log_before = read_log(home / "server.log")
    assert "not delivered (could not connect); try 2" in log_before, log_before[-2000:]
    hook = Webhook(hook.port)
    async with webhook_up(hook), push_server(home, port):
        notes = await hook.until("TASK_STATE_INPUT_REQUIRED")
        asked = notes[-1].task["status"]["message"]["parts"][1]["data"]["questions"][0]
        assert asked["kind"] == "gate", asked
        assert notes[-1].headers["x-a2a-notification-token"] == CLIENT_TOKEN
    no_secret_in(home)


async def test_without_a_key_push_is_not_offered(tmp_path: Path) -> None:
    async with push_server(tmp_path, free_port()) as (base, _), a2a_client(base) as client:
        async with httpx.AsyncClient() as http:
            card = (await http.get(f"{base}/.well-known/agent-card.json")).json()
            assert card["capabilities"].get("pushNotifications", False) is False
            assert (await http.get(f"{base}/.well-known/a2a-push-jwks.json")).status_code == 404
        task = await send(client, message("Add a health endpoint.", "m-1"), at_once=True)
        config = TaskPushNotificationConfig(task_id=task.id, id="hook-1", url="https://hooks.example/a2a")
        with pytest.raises(PushNotificationNotSupportedError):
            await client.create_task_push_notification_config(config)
        async with httpx.AsyncClient() as http:
            answer = await http.post(
                f"{base}/a2a",
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "CreateTaskPushNotificationConfig",
                    "params": {"taskId": task.id, "id": "hook-1", "url": "https://hooks.example/a2a"},
                },
                headers={"A2A-Version": "1.0"},
            )
        # the server's own answer, whatever the client checks before sending
        assert answer.json()["error"]["code"] == -32003
    assert "A2A push notifications are not offered" in read_log(tmp_path / "server.log")

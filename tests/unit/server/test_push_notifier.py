"""The push notifier in process (:mod:`server.a2a.push_notifier`), its POST faked: a newer state
replaces one a failing webhook has not taken (the webhook never hears an older state after a newer
one), a deleted config hears nothing more, and a new notifier (a restart) sends the last state again
with the same ``jti``, within the resend window only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import anyio
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from orchestration.core import PushConfigured, RunHead, StartRequest
from orchestration.core.clock import ManualClock
from orchestration.engine import Runtime, delete_push_config, set_push_config
from orchestration.workers import Posted
from server.a2a.push_keys import PushKeys, seal_context
from server.a2a.push_notifier import Notice, PushNotifier
from tests.unit.helpers import make_runtime

URL = "https://hooks.example/a2a"


@dataclass
class FakeWebhook:
    down: bool = False
    tries: int = 0
    received: list[tuple[str, Mapping[str, str]]] = field(default_factory=list)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> Posted:
        self.tries += 1
        if self.down:
            return Posted(503, True, 0.05, "HTTP 503")
        self.received.append((body.decode(), headers))
        return Posted(204, False, None, "HTTP 204")

    async def until(self, count: int) -> list[str]:
        with anyio.fail_after(5):
            while len(self.received) < count:  # noqa: ASYNC110 - a fake records, nothing signals
                await anyio.sleep(0.01)
        return [body for body, _ in self.received]


async def render(head: RunHead) -> Notice:
    return Notice(head.run_id, head.version, head.status.value, head.status.value.encode())


def new_keys() -> PushKeys:
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return PushKeys(pem)


async def configured(runtime: Runtime, keys: PushKeys, config_id: str = "a") -> RunHead:
    head, _ = await runtime.start(StartRequest(request="Do it.", chain="default"))
    token = keys.seal("client-token", seal_context(head.run_id, config_id, "token"))
    config = PushConfigured(seq=0, at=head.updated_at, config_id=config_id, url=URL, sealed_token=token)
    head, _ = await set_push_config(runtime, head.run_id, config, most=10)
    return head


def notifier(runtime: Runtime, keys: PushKeys, hook: FakeWebhook, window: float = 600) -> PushNotifier:
    made = PushNotifier(runtime, keys, render, window, post=hook.post)
    runtime.add_listener(made.changed)
    return made


async def test_a_newer_state_replaces_one_not_delivered() -> None:
    runtime, keys, hook = make_runtime(), new_keys(), FakeWebhook(down=True)
    async with anyio.create_task_group() as tg:
        await tg.start(notifier(runtime, keys, hook).run)
        head = await configured(runtime, keys)
        with anyio.fail_after(5):
            while hook.tries < 2:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        await runtime.cancel(head.run_id)  # while its first state is being tried
        hook.down = False
        assert await hook.until(1) == ["cancelled"]
        await anyio.sleep(0.2)
        assert [body for body, _ in hook.received] == ["cancelled"], "the older state is never sent after"
        _, headers = hook.received[0]
        assert headers["X-A2A-Notification-Token"] == "client-token"
        claims = jwt.decode(
            headers["X-A2A-Notification-Signature"],
            jwt.PyJWKSet.from_dict(keys.jwks()).keys[0].key,
            algorithms=["ES256"],
            audience=URL,
        )
        assert claims["jti"].startswith(f"{head.run_id}:") and claims["config_id"] == "a"
        tg.cancel_scope.cancel()

    # a restart: the last state sent again, with the same jti; outside the window, not
    again = FakeWebhook()
    async with anyio.create_task_group() as tg:
        await tg.start(notifier(runtime, keys, again).run)
        assert await again.until(1) == ["cancelled"]
        resent = jwt.decode(
            again.received[0][1]["X-A2A-Notification-Signature"], options={"verify_signature": False}
        )
        assert resent["jti"] == claims["jti"]
        tg.cancel_scope.cancel()
    late = FakeWebhook()
    clock = runtime.clock
    assert isinstance(clock, ManualClock)
    clock.advance(601)
    async with anyio.create_task_group() as tg:
        await tg.start(notifier(runtime, keys, late).run)
        await anyio.sleep(0.2)
        assert late.received == []
        tg.cancel_scope.cancel()


async def test_a_deleted_config_hears_nothing_more() -> None:
    runtime, keys, hook = make_runtime(), new_keys(), FakeWebhook()
    async with anyio.create_task_group() as tg:
        await tg.start(notifier(runtime, keys, hook).run)
        head = await configured(runtime, keys)
        assert await hook.until(1) == [head.status.value]
        await delete_push_config(runtime, head.run_id, "a", None)
        await runtime.cancel(head.run_id)
        await anyio.sleep(0.2)
        assert [body for body, _ in hook.received] == [head.status.value]
        tg.cancel_scope.cancel()

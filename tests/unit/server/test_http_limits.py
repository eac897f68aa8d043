"""server/transports/http.py on raw ASGI: the message size bound and its typed refusal (held here for
an app without a bound, or counted in front of the SDK's own bound), the loopback DNS-rebinding
settings (IPv6 included), and the settings behind the session limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp.server.transport_security import RequestBodyLimitMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestration.core import Limits
from orchestration.errors import ConfigError
from server.settings.config import load_settings
from server.transports.http import (
    BodyLimitMiddleware,
    TypedBodyLimit,
    bind_host,
    max_message_bytes,
    security_settings,
)


def test_the_bound_fits_the_size_limits_escaped() -> None:
    limits = Limits()
    bound = max_message_bytes(limits)
    biggest_output = json.dumps({"output": "\U0001f600" * limits.max_output_chars}, ensure_ascii=True)
    assert len(biggest_output) > 6 * limits.max_output_chars
    assert bound > len(biggest_output) + len(json.dumps("\x01" * limits.max_request_chars))
    assert max_message_bytes(Limits(max_output_chars=10, max_request_chars=10)) < bound


class App:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)


def held(app: ASGIApp, max_bytes: int) -> ASGIApp:
    """The bound held here (an app without a bound of its own: the run pages)."""
    return BodyLimitMiddleware(app, max_bytes)


def counted(app: ASGIApp, max_bytes: int) -> ASGIApp:
    """The bound counted here in front of the SDK's own (its transports, ``max_request_body_size``)."""
    return TypedBodyLimit(RequestBodyLimitMiddleware(app, max_bytes), max_bytes)


LIMITS = [held, counted]


async def post(
    chunks: list[bytes],
    max_bytes: int,
    headers: list[tuple[bytes, bytes]] | None = None,
    limit: Any = held,
    app: Any = None,
) -> Any:
    app = app if app is not None else App()
    sent: list[Message] = []
    pending = [
        {"type": "http.request", "body": chunk, "more_body": n < len(chunks) - 1}
        for n, chunk in enumerate(chunks)
    ]

    async def receive() -> Message:
        return pending.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "headers": headers or []}
    await limit(app, max_bytes)(scope, receive, send)
    return app, sent, pending


@pytest.mark.parametrize("limit", LIMITS)
async def test_a_body_within_the_bound_reaches_the_app_whole(limit: Any) -> None:
    app, sent, _ = await post([b"a" * 60, b"b" * 40], max_bytes=100, limit=limit)
    assert app.bodies == [b"a" * 60 + b"b" * 40] and sent == []


@pytest.mark.parametrize("limit", LIMITS)
async def test_a_streamed_body_over_the_bound_is_refused_with_a_typed_error(limit: Any) -> None:
    app, sent, pending = await post([b"a" * 60, b"b" * 60, b"c" * 60], max_bytes=100, limit=limit)
    assert app.bodies == []
    assert pending == [], "the rest was read (and dropped), so that the client can read the answer"
    assert sent[0]["status"] == 413
    assert (b"content-type", b"application/json") in sent[0]["headers"]
    error = json.loads(sent[1]["body"])
    assert error["jsonrpc"] == "2.0" and error["id"] is None
    assert error["error"]["message"].startswith("too_large: the request body is over 100 bytes")


@pytest.mark.parametrize("limit", LIMITS)
async def test_a_body_far_over_the_bound_is_not_read_to_its_end(limit: Any) -> None:
    app, sent, pending = await post([b"a" * 60] * 10, max_bytes=100, limit=limit)
    assert app.bodies == [] and sent[0]["status"] == 413
    assert len(pending) == 6, "read: at most twice the bound"
    app, sent, pending = await post(
        [b"x"], max_bytes=100, headers=[(b"content-length", b"5000")], limit=limit
    )
    assert app.bodies == [] and len(pending) == 1, "a declared length far over the bound: nothing read"
    assert sent[0]["status"] == 413


class Refusing(App):
    """An app that answers 413 of its own accord (not for the size of the body)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
        await Response("no", status_code=413)(scope, receive, send)


async def test_an_answer_of_the_app_within_the_bound_passes_unchanged() -> None:
    app, sent, _ = await post([b"a" * 50], max_bytes=100, limit=counted, app=Refusing())
    assert app.bodies == [b"a" * 50]
    assert sent[0]["status"] == 413 and sent[1]["body"] == b"no"


async def test_the_counting_limit_leaves_the_bound_to_the_app_behind_it() -> None:
    """Counted, not held: without the SDK's bound behind it, a body over the bound reaches the app
    (so the SDK's bound is the one that holds, and the answer is still the typed one)."""
    app, sent, _ = await post([b"a" * 60] * 3, max_bytes=100, limit=TypedBodyLimit)
    assert app.bodies == [b"a" * 180] and sent == []


@pytest.mark.parametrize(("host", "bound"), [("::1", "::1"), ("[::1]", "::1"), (" 127.0.0.1 ", "127.0.0.1")])
def test_bind_host(host: str, bound: str) -> None:
    assert bind_host(host) == bound


def test_loopback_binds_get_dns_rebinding_protection_ipv6_included() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"):
        settings = security_settings(host)
        assert settings is not None and settings.enable_dns_rebinding_protection, host
        assert "[::1]:*" in settings.allowed_hosts and "127.0.0.1:*" in settings.allowed_hosts
        assert "http://[::1]:*" in settings.allowed_origins
    assert "127.0.0.2:*" in (security_settings("127.0.0.2") or pytest.fail()).allowed_hosts
    assert security_settings("0.0.0.0") is None


def test_session_and_subscription_settings(tmp_path: Path) -> None:
    defaults = load_settings(env={}, home=tmp_path)
    assert (defaults.max_subscriptions, defaults.http_max_sessions, defaults.http_session_idle_seconds) == (
        100,
        200,
        600.0,
    )
    settings = load_settings(
        env={
            "CONSTRUCT_MAX_SUBSCRIPTIONS": "5",
            "CONSTRUCT_HTTP_MAX_SESSIONS": "7",
            "CONSTRUCT_HTTP_SESSION_IDLE_SECONDS": "1.5",
        },
        home=tmp_path,
    )
    assert (settings.max_subscriptions, settings.http_max_sessions, settings.http_session_idle_seconds) == (
        5,
        7,
        1.5,
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"CONSTRUCT_HTTP_MAX_SESSIONS": "0"}, home=tmp_path)
    assert caught.value.field == "CONSTRUCT_HTTP_MAX_SESSIONS"

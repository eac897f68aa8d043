"""server/auth.py: which hosts count as loopback, and the bearer-token middleware on raw ASGI."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from orchestration.errors import ConfigError
from server.auth import BearerTokenMiddleware, check_exposure, is_loopback
from server.config import load_settings

TOKEN = "a-token-of-24-characters"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_check_exposure() -> None:
    check_exposure("127.0.0.1", None)
    check_exposure("0.0.0.0", TOKEN)
    with pytest.raises(ConfigError, match=r"0\.0\.0\.0 would serve runs to the network"):
        check_exposure("0.0.0.0", None)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.sent: list[dict[str, Any]] = []

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls.append(scope["type"])

    async def send(self, message: Message) -> None:
        self.sent.append(dict(message))


async def receive() -> Message:
    return {"type": "http.request", "body": b""}


async def request(headers: list[tuple[bytes, bytes]]) -> Recorder:
    recorder = Recorder()
    guarded = BearerTokenMiddleware(recorder.app, TOKEN)
    await guarded({"type": "http", "headers": headers}, receive, recorder.send)
    return recorder


async def test_the_middleware_lets_through_only_the_token() -> None:
    ok = await request([(b"authorization", f"Bearer {TOKEN}".encode())])
    assert ok.calls == ["http"] and ok.sent == []
    for headers in (
        [],
        [(b"authorization", b"Bearer nope")],
        [(b"authorization", f"bearer  {TOKEN}".encode())],
        [(b"authorization", f"Bearer {TOKEN}".encode()), (b"authorization", b"Bearer other")],
    ):
        refused = await request(headers)
        assert refused.calls == []
        assert refused.sent[0]["status"] == 401
        assert (b"www-authenticate", b'Bearer realm="construct-mcp"') in refused.sent[0]["headers"]


async def test_lifespan_events_pass() -> None:
    recorder = Recorder()
    guarded = BearerTokenMiddleware(recorder.app, TOKEN)
    await guarded({"type": "lifespan"}, receive, recorder.send)
    assert recorder.calls == ["lifespan"]


def test_a_short_token_is_refused_and_the_token_stays_out_of_repr(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="at least 16"):
        BearerTokenMiddleware(Recorder().app, "short")
    settings = load_settings(env={"CONSTRUCT_AUTH_TOKEN": TOKEN}, home=tmp_path)
    assert settings.auth_token == TOKEN
    assert TOKEN not in repr(settings)
    assert settings.source_of("auth_token") == "CONSTRUCT_AUTH_TOKEN"

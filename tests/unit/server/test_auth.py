"""server/transports/auth.py: which hosts count as loopback, and the bearer-token middleware on raw ASGI."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from orchestration.errors import ConfigError
from server.settings.config import load_settings
from server.transports.auth import BearerTokenMiddleware, RedactQueryStrings, check_exposure, is_loopback

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
        [(b"authorization", f"Basic {TOKEN}".encode())],
        [(b"authorization", f"Bearer{TOKEN}".encode())],
        [(b"authorization", f"Bearer {TOKEN}x".encode())],
        [(b"authorization", TOKEN.encode())],
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


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
async def test_the_scheme_is_case_insensitive(scheme: str) -> None:
    for value in (f"{scheme} {TOKEN}", f"{scheme}  {TOKEN} "):
        ok = await request([(b"authorization", value.encode())])
        assert ok.calls == ["http"] and ok.sent == [], value


@pytest.mark.parametrize("token", ["", "   ", " " * 20, "fifteen-chars-x", "  fifteen-chars-x\n  "])
def test_a_blank_or_short_token_is_refused_once_trimmed(token: str, tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="at least 16") as raised:
        load_settings(env={"CONSTRUCT_AUTH_TOKEN": token}, home=tmp_path)
    assert raised.value.field == "CONSTRUCT_AUTH_TOKEN"
    if token.strip():
        assert token.strip() not in str(raised.value), "the value is not echoed"
    config = tmp_path / "construct.toml"
    config.write_text(f"auth_token = {token!r}\n".replace("'", '"'))
    with pytest.raises(ConfigError, match="at least 16"):
        load_settings(env={}, home=tmp_path)


def test_a_token_is_trimmed() -> None:
    settings = load_settings(env={"CONSTRUCT_AUTH_TOKEN": f"  {TOKEN}\n"}, home="/nonexistent-home")
    assert settings.auth_token == TOKEN


def test_the_access_log_never_shows_a_query_string() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", f"/mcp?token={TOKEN}&x=1", "1.1", 200),
        None,
    )
    assert RedactQueryStrings().filter(record)
    line = record.getMessage()
    assert TOKEN not in line
    assert line == '127.0.0.1:5000 - "GET /mcp?[redacted] HTTP/1.1" 200'


@pytest.mark.parametrize("token", ["a token with spaces inside", "jeton-\u00e9t\u00e9-0123456789"])
def test_a_token_that_cannot_travel_in_a_header_is_refused(token: str, tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="printable ASCII"):
        load_settings(env={"CONSTRUCT_AUTH_TOKEN": token}, home=tmp_path)

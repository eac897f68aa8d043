"""Which messages the transports answer themselves (``server/transports/invalid_messages.py``): only
what the SDK would drop, read as a notification or answer with its validator's text; requests,
notifications and responses of the right shape pass (tests/acceptance/test_invalid_messages.py has
the real transports)."""

from __future__ import annotations

import json

import pytest

from server.transports.invalid_messages import refusals


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {"name": "x"}},
        {"jsonrpc": "2.0", "id": 2, "method": "ping", "params": None},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 3, "result": {}},
        {"jsonrpc": "2.0", "id": {"odd": "but a response: never answered"}, "error": {"code": 1}},
    ],
)
def test_what_the_sdk_may_take_passes(message: dict[str, object]) -> None:
    assert refusals(json.dumps(message)) is None


def test_what_is_refused_says_why_and_quotes_nothing() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    (error,) = refusals(deep) or []
    assert error["id"] is None and error["error"]["code"] == -32700, error  # past the parser's depth
    assert "nested too deeply" in error["error"]["message"]
    (error,) = refusals('{"jsonrpc": "2.0", "id": {"secret": "s3cr3t"}, "method": "x"}') or []
    assert error["id"] is None and "s3cr3t" not in json.dumps(error)
    (error,) = refusals(b'{"jsonrpc": "2.0", "id": "s3cr3t", "method": ') or []
    assert error["error"]["code"] == -32700 and "s3cr3t" not in json.dumps(error)
    many = refusals(json.dumps([{"jsonrpc": "2.0", "id": n, "method": "ping"} for n in range(500)]))
    assert many is not None and len(many) == 100  # bounded

"""server/web/pages.py on raw ASGI: the run pages check the bearer token before they read a body
(issue 22, finding 4), and bound the body only after; the page routes read no body at all."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.types import Message

from server.identity import NamedToken
from server.web.pages import with_run_pages

TOKEN = "bob-token-" + "2a9c6e0f4b7d1358"
TOKENS = [NamedToken("bob", TOKEN, frozenset({"read", "approve"}))]
MAX_BYTES = 1000
GATE = "/runs/api/runs/run-0000000000000-0000000000000000/gates/before:engineer"


class Body:
    """A request body of ``chunks`` that records how much of it the app pulled."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.pulled = 0

    async def receive(self) -> Message:
        if self.pulled == len(self.chunks):
            return {"type": "http.disconnect"}
        self.pulled += 1
        return {
            "type": "http.request",
            "body": self.chunks[self.pulled - 1],
            "more_body": self.pulled < len(self.chunks),
        }


async def _not_mcp(_scope: Any, _receive: Any, _send: Any) -> None:
    raise AssertionError("a /runs request reached the /mcp app")


async def request(
    path: str, body: Body, *, token: str | None = None, method: str = "POST", declared: int | None = None
) -> tuple[int, dict[str, Any]]:
    """``method path`` with ``body`` to the run pages (with tokens); its status and JSON answer."""
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "http_version": "1.1",
    }
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    app = with_run_pages(_not_mcp, lambda: None, TOKENS, "127.0.0.1", MAX_BYTES)
    await app(scope, body.receive, send)
    answer = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(answer)


@pytest.mark.parametrize("token", [None, "x" * 20])
async def test_a_request_without_a_valid_token_is_answered_before_its_body_is_read(token: str | None) -> None:
    for chunks, declared in (([b"a" * 600] * 10, None), ([b"a" * 500], 500), ([b"a"], 15_000_000)):
        body = Body(chunks)
        status, answer = await request(GATE, body, token=token, declared=declared)
        assert (status, answer["error"]) == (401, "unauthorized")
        assert body.pulled == 0, "the body was read before the token was checked"


async def test_with_the_token_the_body_bound_applies() -> None:
    over = Body([b"a" * 600] * 3)
    status, answer = await request(GATE, over, token=TOKEN)
    assert status == 413 and answer["error"]["message"].startswith("too_large: the request body is over 1000")
    declared = Body([b"a"])
    status, answer = await request(GATE, declared, token=TOKEN, declared=15_000_000)
    assert status == 413 and declared.pulled == 0, "a declared length far over the bound: nothing read"
    # Within the bound, the body reaches the endpoint whole (which parses it).
    within = Body([b"not ", b"json"])
    status, answer = await request(GATE, within, token=TOKEN)
    assert (status, answer["error"]) == (400, "invalid_argument") and within.pulled == 2
    assert "not JSON" in answer["message"]


@pytest.mark.parametrize("path", ["/runs", "/runs/run-0000000000000-0000000000000000", "/runs/nothing/here"])
async def test_the_pages_read_no_body(path: str) -> None:
    """The pages need no token (they hold no data) and answer only GET: a body sent to them is never
    read, so it cannot be held either."""
    body = Body([b"a" * 600] * 10)
    status, answer = await request(path, body)
    assert status in (404, 405) and answer["error"] in ("not_found", "method_not_allowed")
    assert body.pulled == 0

"""Coded JSON-RPC errors (issue 22, finding 10), in process over both protocol eras: a
``prompts/get`` the prompts cannot answer, a resource URI no template matches, a method the server
does not serve and params of the wrong shape (over real transports: tests/acceptance/
test_invalid_messages.py) are each a JSON-RPC error whose message starts with a project code (also
in ``data.code``), and none logs a traceback."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from server.app import ConstructApp
from server.mcp import chain_prompts
from server.mcp.services import Services
from server.settings.config import load_settings

LIMIT = 1000


@pytest.fixture
def server(tmp_path: Path) -> MCPServer[Services]:
    env = {
        "CONSTRUCT_HOME": str(tmp_path),
        "CONSTRUCT_ORCHESTRATION_STORE": "memory",
        "CONSTRUCT_MAX_REQUEST_CHARS": str(LIMIT),
    }
    return ConstructApp(load_settings(env=env)).build_server()


def refused(caught: pytest.ExceptionInfo[MCPError], code: str, jsonrpc: int = INVALID_PARAMS) -> str:
    error = caught.value.error
    assert error.code == jsonrpc, error
    assert error.message.startswith(f"{code}: "), error
    assert isinstance(error.data, dict) and error.data["code"] == code, error
    return error.message


#: (prompt, arguments, how the refusal starts: its code first)
PROMPT_MISTAKES: list[tuple[str, dict[str, Any] | None, str]] = [
    ("nope", {"request": "x"}, "invalid_argument: unknown prompt 'nope'; the prompts are: "),
    ("defualt", {"request": "x"}, "invalid_argument: unknown prompt 'defualt' (did you mean"),
    ("default", {}, "invalid_argument: request is required"),
    ("default", None, "invalid_argument: request is required"),
    ("default", {"request": "x", "extra": "y"}, "invalid_argument: unknown argument 'extra'"),
    ("default", {"request": "r" * (LIMIT + 1)}, f"too_large: request is over {LIMIT} characters"),
]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_prompt_mistakes_are_coded_and_log_no_traceback(
    server: MCPServer[Services], mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with Client(server, mode=mode) as client:
        for name, arguments, start in PROMPT_MISTAKES:
            with pytest.raises(MCPError) as caught:
                await client.get_prompt(name, arguments)
            assert refused(caught, start.split(":")[0]).startswith(start), caught.value.error
            assert "r" * 101 not in caught.value.error.message
        # within the bound, it renders
        rendered = await client.get_prompt("default", {"request": "r" * LIMIT})
        assert ("r" * LIMIT) in str(rendered.messages[0].content)
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_uri_no_template_matches_is_invalid_argument(server: MCPServer[Services], mode: str) -> None:
    async with Client(server, mode=mode) as client:
        for uri in ("foo://bar", "run://run-abc/nothing/here"):
            with pytest.raises(MCPError) as caught:
                await client.read_resource(uri)
            message = refused(caught, "invalid_argument")
            assert message.startswith(f"invalid_argument: no resource has the URI '{uri}'"), message
            assert caught.value.error.data == {"code": "invalid_argument", "uri": uri}
        # a run that is not there stays run_not_found
        with pytest.raises(MCPError) as caught:
            await client.read_resource("run://run-abc")
        refused(caught, "run_not_found")  # the code in data too
        assert caught.value.error.data == {"code": "run_not_found", "uri": "run://run-abc"}


async def test_a_server_bug_is_internal_error_logged_once(
    server: MCPServer[Services], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: object) -> str:
        raise RuntimeError("a bug, with a detail the client must not see")

    monkeypatch.setattr(chain_prompts, "chain_prompt_text", broken)
    async with Client(server) as client:
        with pytest.raises(MCPError) as caught:
            await client.get_prompt("default", {"request": "x"})
    message = refused(caught, "internal_error", INTERNAL_ERROR)
    assert "detail" not in message and "prompts/get" in message, message
    failed = [r for r in caplog.records if getattr(r, "action", None) == "request_failed"]
    assert len(failed) == 1 and failed[0].exc_info is not None

"""On stdio, a message far over the size limits is refused without being held whole
(``server/transports/stdio.py``): the caller gets a ``too_large`` error for its request, and the session
goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from tests.acceptance.harness import call, read_log, server_env, stdio_client_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_message_over_the_bound_is_too_large_and_the_session_goes_on(
    tmp_path: Path, mode: str
) -> None:
    # Bound: 12 bytes a character of the limits (1,000 + 1,000 + the 20,000 of a comment) + 1 MiB.
    env = server_env(tmp_path, CONSTRUCT_MAX_OUTPUT_CHARS="1000", CONSTRUCT_MAX_REQUEST_CHARS="1000")
    async with stdio_client_for(env, tmp_path / "server.log", mode=mode) as client:
        view = await call(client, "orchestrate_start", request="small limits", chain=["writer"])
        arguments = {"run_id": view["run_id"], "task_id": "writer", "output": "\x01" * 1_000_000}  # 6 MB
        with pytest.raises(MCPError) as refused:
            await client.call_tool("orchestrate_resume", arguments)
        assert refused.value.error.message.startswith("too_large: the message is over ")
        view = await call(
            client, "orchestrate_resume", run_id=view["run_id"], task_id="writer", output="done"
        )
        assert view["status"] == "completed"
    assert "action=message_too_large" in read_log(tmp_path / "server.log")

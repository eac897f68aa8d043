"""Write ``server/mcp/tools_list.json``: the SDK's ``tools/list`` result for the default settings, as
the stdio transport writes it, which ``serve`` answers the first ``tools/list`` with before the SDK
is imported (see :mod:`server.mcp.server_card`). Run it after changing a tool; the test
``tests/unit/server/test_early_initialize.py`` fails until then.

    .venv/bin/python scripts/tools_list.py
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mcp.server.stdio import stdio_server  # noqa: E402

from server.app import ConstructApp  # noqa: E402
from server.mcp.server_card import TOOLS_LIST_FILE  # noqa: E402
from server.settings.config import load_settings  # noqa: E402

LINES = [
    '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
    '"capabilities":{},"clientInfo":{"name":"tools-list","version":"0"}}}',
    '{"jsonrpc":"2.0","method":"notifications/initialized"}',
    '{"jsonrpc":"2.0","id":2,"method":"tools/list"}',
]
PREFIX = '{"jsonrpc":"2.0","id":2,"result":'


class _Written:
    """Stands in for stdout: keeps what is written, and says when both answers are."""

    def __init__(self) -> None:
        self.text = ""
        self.both = anyio.Event()

    async def write(self, text: str) -> None:
        self.text += text
        if self.text.count("\n") >= 2:
            self.both.set()

    async def flush(self) -> None:
        pass


async def default_tools_list() -> str:
    """The ``tools/list`` result the SDK writes for a server with the default settings."""
    out = _Written()

    async def lines() -> AsyncIterator[str]:
        for line in LINES:
            yield line + "\n"
        await out.both.wait()  # the input stays open until both answers are out

    with tempfile.TemporaryDirectory() as home:
        settings = load_settings(env={"CONSTRUCT_HOME": home, "CONSTRUCT_ORCHESTRATION_STORE": "memory"})
        server = ConstructApp(settings).build_server()
        stdin: Any = lines()
        stdout: Any = out
        async with stdio_server(stdin=stdin, stdout=stdout) as (read, write):
            lowlevel = server._lowlevel_server
            await lowlevel.run(read, write, lowlevel.create_initialization_options())
    answer = out.text.splitlines()[1]
    assert answer.startswith(PREFIX) and answer.endswith("}"), answer[:200]
    return answer[len(PREFIX) : -1]


def main() -> None:
    TOOLS_LIST_FILE.write_text(anyio.run(default_tools_list) + "\n", encoding="utf-8")
    print(f"wrote {TOOLS_LIST_FILE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

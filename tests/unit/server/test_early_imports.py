"""``serve`` on stdio answers ``initialize`` and ``tools/list`` before it imports anything heavy
(``server/__main__.py``): at the moment the answers are written, none of the MCP SDK, pydantic, the
HTTP stacks, OpenTelemetry or the domain is imported. (How soon that is, is measured by
``bench/startup.py``, not here.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from server.__main__ import inline_card
from server.transports.handshake import initialize_answer, tools_list_answer

REPO = Path(__file__).resolve().parents[3]

#: packages the early answer must not wait for (each costs from tens of milliseconds to most of a second)
HEAVY = frozenset(
    {
        "mcp",
        "mcp_types",
        "pydantic",
        "pydantic_core",
        "pydantic_settings",
        "httpx",
        "httpx2",
        "opentelemetry",
        "anyio",
        "starlette",
        "uvicorn",
        "jsonschema",
        "aiosqlite",
        "asyncpg",
        "orchestration",
        "stores",
    }
)
#: the first-party modules the early answer may use: the entry point and what it needs
FIRST_PARTY_ALLOWED = frozenset(
    {
        "server",
        "server.__main__",
        "server.mcp",
        "server.mcp.server_card",
        "server.settings",
        "server.settings.early",
        "server.transports",
        "server.transports.handshake",
    }
)

INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "h", "version": "1"},
        },
    }
)

INITIALIZED = '{"jsonrpc": "2.0", "method": "notifications/initialized"}'
TOOLS_LIST = '{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}'

# Runs the entry point's early step as `construct-mcp serve` does, waits for the answers, then reports
# which modules were imported by then (nothing else runs in between: the main thread only waits).
PROBE = """
import json, sys
from server.__main__ import answer_early
early = answer_early(sys.argv[1:])
early.wait()
sys.stderr.write(json.dumps({"answered": len(early.answered), "modules": sorted(sys.modules)}))
"""


def too_heavy(modules: list[str]) -> list[str]:
    """The modules in ``modules`` that the early answer must not have imported."""
    return [
        m
        for m in modules
        if m.split(".")[0] in HEAVY or (m.split(".")[0] == "server" and m not in FIRST_PARTY_ALLOWED)
    ]


def early_modules(tmp_path: Path, *preamble: str) -> tuple[bytes, dict[str, object]]:
    """Run :data:`PROBE` (after ``preamble``) as ``serve`` with a fresh home; its stdout and report."""
    run = subprocess.run(
        [sys.executable, "-c", "\n".join([*preamble, PROBE]), "serve"],
        input=(INITIALIZE + "\n" + INITIALIZED + "\n" + TOOLS_LIST + "\n").encode(),
        capture_output=True,
        cwd=REPO,
        env={"CONSTRUCT_HOME": str(tmp_path), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=True,
    )
    report: dict[str, object] = json.loads(run.stderr.decode().splitlines()[-1])
    return run.stdout, report


def test_the_answers_are_written_before_anything_heavy_is_imported(tmp_path: Path) -> None:
    stdout, report = early_modules(tmp_path)
    card = inline_card()
    assert card.tools_list is not None
    initialized = initialize_answer(INITIALIZE.encode(), card)
    listed = tools_list_answer(TOOLS_LIST.encode(), card.tools_list)
    assert initialized is not None and listed is not None
    assert stdout == (initialized.line + "\n" + listed.line + "\n").encode()
    assert report["answered"] == 2
    modules = report["modules"]
    assert isinstance(modules, list)
    assert too_heavy(modules) == []


def test_a_heavy_import_before_the_answer_is_seen(tmp_path: Path) -> None:
    # The guard itself: a planted import of the SDK's types and of a domain module is reported.
    _, report = early_modules(tmp_path, "import mcp_types", "import orchestration.errors")
    modules = report["modules"]
    assert isinstance(modules, list)
    found = too_heavy(modules)
    assert "mcp_types" in found and "orchestration.errors" in found and "pydantic" in found

"""Where ``serve``'s log goes: a host application that keeps the server's stderr gets every event;
a person's terminal (a host program run by hand passes its own stderr on to the server) gets
warnings and errors only, unless ``CONSTRUCT_LOG_LEVEL`` asks for more."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.acceptance.harness import REPO

pytestmark = pytest.mark.slow

MESSAGES = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "orchestrate_start", "arguments": {"request": "Add rate limiting"}},
    },
]


def _serve(home: Path, *, terminal: bool, **extra: str) -> tuple[str, str]:
    """``construct-mcp serve`` on stdio for the three messages, its stderr a terminal (a pty) or a
    pipe; its stdout and its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSTRUCT_")}
    env |= {"CONSTRUCT_HOME": str(home), "PYTHONPATH": str(REPO), **extra}
    command = [sys.executable, "-c", "from server.cli.main import main; raise SystemExit(main())", "serve"]
    primary, secondary = pty.openpty() if terminal else (None, None)
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=secondary if terminal else subprocess.PIPE,
        env=env,
        cwd=home,
    )
    if secondary is not None:
        os.close(secondary)
    assert process.stdin is not None and process.stdout is not None
    for message in MESSAGES:
        process.stdin.write((json.dumps(message) + "\n").encode())
    process.stdin.flush()
    answers = [process.stdout.readline() for _ in range(2)]  # initialize's and the call's
    process.stdin.close()
    deadline = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if process.poll() is None:
        process.kill()
    process.stdout.close()
    if primary is None:
        assert process.stderr is not None
        err = process.stderr.read().decode()
        process.stderr.close()
    else:
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(primary)
        err = b"".join(chunks).decode()
    return b"".join(answers).decode(), err


def test_a_terminal_gets_warnings_only(tmp_path: Path) -> None:
    out, err = _serve(tmp_path, terminal=True)
    assert '"run_id"' in out  # the call was answered
    assert " INFO " not in err, err


def test_a_terminal_gets_every_event_when_asked(tmp_path: Path) -> None:
    out, err = _serve(tmp_path, terminal=True, CONSTRUCT_LOG_LEVEL="INFO")
    assert '"run_id"' in out
    assert "action=run_created" in err, err


def test_a_host_application_keeps_every_event(tmp_path: Path) -> None:
    out, err = _serve(tmp_path, terminal=False)
    assert '"run_id"' in out
    assert "action=server_started" in err and "action=run_created" in err, err


def test_serve_started_in_a_terminal_says_what_it_is_and_what_to_run_instead(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSTRUCT_")}
    env |= {"CONSTRUCT_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "server", "serve"],
        stdin=secondary,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    os.close(secondary)
    assert process.stderr is not None and process.stdout is not None
    first = process.stderr.readline().decode()
    os.close(primary)  # the person closes the terminal: end of input
    try:
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        out = process.stdout.read()
        process.stdout.close()
        process.stderr.close()
    assert first.startswith("construct-mcp serve: this is an MCP server for a host application")
    assert "'construct-mcp demo'" in first and "--transport streamable-http" in first
    assert out == b""  # stdout stays the protocol's


def test_serve_started_by_a_host_says_nothing_of_the_kind(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSTRUCT_")}
    env |= {"CONSTRUCT_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "server", "serve"],
        input=b"",  # a host's pipe, closed at once
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert b"this is an MCP server for a host application" not in done.stderr, done.stderr
    assert done.stdout == b""

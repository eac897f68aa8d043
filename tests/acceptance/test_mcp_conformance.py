"""The official MCP conformance suite (``@modelcontextprotocol/conformance``) against
``construct-mcp serve --transport streamable-http``, for the scenarios that apply to any server.

The suite and the Node >= 22 it needs are npm packages pinned in ``tests/conformance/package.json``
(Node comes as the registry's ``node`` package, so the machine's own Node version does not matter)::

    cd tests/conformance && npm ci

``.ci/run`` does that before the tests. Without the install the tests skip, saying what to run;
with ``CI=true`` they fail instead, because a CI run that skipped them would prove nothing.

One server (a filesystem store in a temporary home) answers every scenario; each scenario is one
``npx --no-install conformance server --url ... --scenario NAME`` run, and a failure prints the
suite's report and the server's log.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.harness import SERVER_COMMAND, free_port, read_log, server_env
from tests.acceptance.node_tools import SUITE_DIR, node_path, require

pytestmark = pytest.mark.slow


#: The scenarios that hold any MCP server to the protocol (names as ``conformance list --server``
#: gives them, suite 0.1.16).
SCENARIOS = [
    "server-initialize",
    "ping",
    "tools-list",
    # Calls a tool this server does not have ("test_error_handling"): a tool-level failure must be an
    # isError result with a text message, which is what this server answers for any failing call.
    "tools-call-error",
    "server-sse-multiple-streams",
    "resources-list",
    # Subscribe to / unsubscribe from "test://watched-resource" (a URI of the reference server).
    "resources-subscribe",
    "resources-unsubscribe",
    "prompts-list",
    "dns-rebinding-protection",
]

#: The suite's other server scenarios, and why they are not run here.
NOT_RUN = {
    # They call the reference server's fixture tools, resources and prompts (test_image_content,
    # test://static-text, test_simple_prompt, json_schema_2020_12_tool, ...), which a real server
    # does not have; they test the fixtures, not the protocol.
    "tools-call-simple-text": "fixture tool test_simple_text (it 'passes' only because an unknown "
    "tool's error result also carries text)",
    "tools-call-image": "fixture tool test_image_content",
    "tools-call-audio": "fixture tool test_audio_content",
    "tools-call-embedded-resource": "fixture tool test_embedded_resource",
    "tools-call-mixed-content": "fixture tool test_multiple_content_types",
    "tools-call-with-logging": "fixture tool test_tool_with_logging",
    "tools-call-with-progress": "fixture tool test_tool_with_progress",
    "tools-call-sampling": "fixture tool test_sampling",
    "tools-call-elicitation": "fixture tool test_elicitation",
    "elicitation-sep1034-defaults": "fixture tool test_elicitation_sep1034_defaults",
    "elicitation-sep1330-enums": "fixture tool test_elicitation_sep1330_enums",
    "json-schema-2020-12": "fixture tool json_schema_2020_12_tool",
    "server-sse-polling": "fixture tool test_reconnection (closes its SSE stream mid-call)",
    "resources-read-text": "fixture resource test://static-text",
    "resources-read-binary": "fixture resource test://static-binary",
    "resources-templates-read": "fixture template test://template/{id}/data",
    "prompts-get-simple": "fixture prompt test_simple_prompt",
    "prompts-get-with-args": "fixture prompt test_prompt_with_arguments",
    "prompts-get-embedded-resource": "fixture prompt test_prompt_with_embedded_resource",
    "prompts-get-with-image": "fixture prompt test_prompt_with_image",
    # Optional capabilities this server does not declare, exercised on fixtures as well.
    "logging-set-level": "the logging capability: this server logs to stderr only (logging "
    "notifications are deprecated in the 2026-07-28 protocol)",
    "completion-complete": "the completions capability, on the fixture prompt test_prompt_with_arguments",
}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ALL_PASSED = re.compile(r"^Passed: (\d+)/\1, 0 failed", re.MULTILINE)


@pytest.fixture(scope="module")
def suite() -> None:
    """Skip locally, fail in CI (``CI=true``), when the suite is not installed."""
    require("conformance", "the MCP conformance suite")


def conformance(*args: str) -> subprocess.CompletedProcess[str]:
    """One run of the suite's CLI (``npx --no-install conformance ...``), output without colours."""
    result = subprocess.run(
        ["npx", "--no-install", "conformance", *args],
        cwd=SUITE_DIR,
        env={**os.environ, "PATH": node_path(), "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    result.stdout = _ANSI.sub("", result.stdout)
    result.stderr = _ANSI.sub("", result.stderr)
    return result


@pytest.fixture(scope="module")
def server(suite: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``construct-mcp serve --transport streamable-http`` on a free loopback port with a filesystem
    store in a fresh home; yields the endpoint URL and the server's log file; stops it with SIGTERM."""
    home = tmp_path_factory.mktemp("conformance-home")
    log_path = home / "server.log"
    port = free_port()
    command = [*SERVER_COMMAND, "serve", "--transport", "streamable-http", "--port", str(port)]
    env = {**server_env(home), "PATH": os.environ.get("PATH", "")}
    with (
        log_path.open("wb") as log,
        subprocess.Popen(
            [*command, "--store", "filesystem"], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL
        ) as process,
    ):
        try:
            _wait_until_listening(process, port, log_path)
            yield f"http://127.0.0.1:{port}/mcp", log_path
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_until_listening(process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited early:\n{read_log(log_path)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the server did not listen on port {port} within 30 s:\n{read_log(log_path)}")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_conformance_scenario(scenario: str, server: tuple[str, Path]) -> None:
    url, log_path = server
    result = conformance("server", "--url", url, "--scenario", scenario)
    report = result.stdout + result.stderr
    assert result.returncode == 0 and _ALL_PASSED.search(report), (
        f"conformance scenario {scenario!r} failed (exit status {result.returncode}):\n{report}\n"
        f"--- server log (last 4000 characters) ---\n{read_log(log_path)[-4000:]}"
    )


def test_every_server_scenario_of_the_suite_is_run_or_said_why_not(suite: None) -> None:
    """A new version of the suite brings new scenarios: each must be run above or listed, with the
    reason, in NOT_RUN."""
    result = conformance("list", "--server")
    assert result.returncode == 0, result.stdout + result.stderr
    listed = set(re.findall(r"^\s*- ([a-z0-9-]+)", result.stdout, re.MULTILINE))
    assert listed, result.stdout
    assert listed == set(SCENARIOS) | set(NOT_RUN), result.stdout

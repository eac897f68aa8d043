"""MCP Tasks with a client nobody here wrote: the official MCP Inspector CLI
(``@modelcontextprotocol/inspector``, pinned in ``tests/conformance/package.json`` with the Node 22
it needs). With ``--protocol-era modern`` it declares the tasks extension and follows a task with
``tasks/get`` to its result; it declares no elicitation. Each case is one
``npx --no-install mcp-inspector --cli <server over stdio> --method tools/call ...`` run that must end
on its own, exit 0 and print the run's answer:

* an inline chain (the host's own model does its tasks): no task, the plain answer naming the host
  task (a task here was polled for ever: nothing the Inspector can do finishes it);
* a provider chain: a task, followed to the completed run;
* a provider chain whose first need is a gate: no task (the Inspector fills no forms), the plain
  answer naming the ``orchestrate_approve`` call;
* a provider chain that reaches a gate after its first step: a task, handed over at the gate as a
  completed one whose result is the run's view (``next_action``: approve).

Without the install the tests skip, saying what to run (``cd tests/conformance && npm ci``); with
``CI=true`` they fail instead, as the conformance tests do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.harness import SERVER_COMMAND, server_env
from tests.acceptance.node_tools import SUITE_DIR, node_path, require
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

#: Seconds one Inspector run may take; each takes a few.
RUN_SECONDS = 90
#: The server's log line when it answers a tools/call with a task.
TASK_CREATED = "action=task_created"

SCENARIO = {
    "researcher": [{"delay_seconds": 0.5, "text": "the findings"}],
    "writer": [{"text": "the notes, from the model"}],
}


@pytest.fixture(scope="module")
def inspector() -> None:
    """Skip locally, fail in CI (``CI=true``), when the Inspector is not installed."""
    require("mcp-inspector", "the MCP Inspector CLI")


def start_with_inspector(home: Path, server: dict[str, str], **arguments: Any) -> tuple[dict[str, Any], str]:
    """``orchestrate_start`` with ``arguments``, called by the Inspector CLI on a modern-era stdio
    connection to ``python -m server serve`` (environment ``server``, home ``home``). Returns the
    call's result (a ``CallToolResult``) and the server's log; fails unless the Inspector ends within
    :data:`RUN_SECONDS` with exit code 0."""
    # The Inspector hands a stdio server only the variables given with -e (and a safe few of its own).
    env_flags = [flag for key, value in server.items() for flag in ("-e", f"{key}={value}")]
    tool_args = [
        f"{key}={json.dumps(value) if not isinstance(value, str) else value}"
        for key, value in arguments.items()
    ]
    command = [
        "npx",
        "--no-install",
        "mcp-inspector",
        "--cli",
        *env_flags,
        *SERVER_COMMAND,
        "serve",
        "--protocol-era",
        "modern",
        "--format",
        "json",
        "--method",
        "tools/call",
        "--tool-name",
        "orchestrate_start",
        "--tool-arg",
        *tool_args,
    ]
    # HOME: the Inspector keeps its catalog and client config under ~/.mcp-inspector.
    (home / "inspector").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PATH": node_path(),
        "HOME": str(home / "inspector"),
        "NO_COLOR": "1",
        "NPM_CONFIG_UPDATE_NOTIFIER": "false",
    }
    # Its own process group: a run that does not end is killed whole (npx, the Inspector, the server).
    with subprocess.Popen(
        command,
        cwd=SUITE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=RUN_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            _, stderr = process.communicate()
            raise AssertionError(
                f"the Inspector did not finish within {RUN_SECONDS} s (a task it cannot carry to its "
                f"end?); the server's log:\n{stderr}"
            ) from None
    assert process.returncode == 0, f"exit {process.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    result = json.loads(stdout)["result"]
    assert result.get("isError") in (None, False), result
    return result, stderr


def provider_env(home: Path, fake: FakeProvider) -> dict[str, str]:
    return server_env(
        home,
        CONSTRUCT_WORKER_BACKEND="provider",
        CONSTRUCT_MODEL="claude-test-1",
        CONSTRUCT_ANTHROPIC_BASE_URL=fake.base_url,
        ANTHROPIC_API_KEY="sk-ant-test-key",
    )


def test_an_inline_chain_answers_the_inspector_with_the_host_task(inspector: None, tmp_path: Path) -> None:
    result, log = start_with_inspector(
        tmp_path, server_env(tmp_path), request="Write the notes", chain=["writer"]
    )
    view = result["structuredContent"]
    assert view["status"] == "awaiting_host", view
    action = view["next_action"]
    assert (action["kind"], action["task_id"], action["tool"]) == (
        "run_host_task",
        "writer",
        "orchestrate_resume",
    )
    assert action["user_prompt"] and action["system_prompt"]
    assert TASK_CREATED not in log, log


def test_a_provider_chain_is_a_task_the_inspector_follows_to_its_end(inspector: None, tmp_path: Path) -> None:
    with FakeProvider(SCENARIO) as fake:
        result, log = start_with_inspector(
            tmp_path, provider_env(tmp_path, fake), request="Write the notes", chain=["researcher", "writer"]
        )
        assert fake.calls() == {"researcher": 1, "writer": 1}
    # A task (the Inspector declared the extension), polled to the completed run's view.
    assert TASK_CREATED in log, log
    view = result["structuredContent"]
    assert view["status"] == "completed" and view["next_action"]["kind"] == "none", view
    assert view["tasks"][-1]["output_preview"] == "the notes, from the model"


def test_a_gate_first_answers_the_inspector_with_the_approve_call(inspector: None, tmp_path: Path) -> None:
    with FakeProvider(SCENARIO) as fake:
        result, log = start_with_inspector(
            tmp_path,
            provider_env(tmp_path, fake),
            request="Write the notes",
            chain=["writer"],
            approve_before=["writer"],
        )
    assert TASK_CREATED not in log, log
    view = result["structuredContent"]
    assert view["status"] == "awaiting_approval", view
    action = view["next_action"]
    assert (action["kind"], action["gate_id"], action["tool"]) == (
        "approve",
        "before:writer",
        "orchestrate_approve",
    )


def test_a_task_that_reaches_a_gate_is_handed_to_the_inspector(inspector: None, tmp_path: Path) -> None:
    with FakeProvider(SCENARIO) as fake:
        result, log = start_with_inspector(
            tmp_path,
            provider_env(tmp_path, fake),
            request="Research, then write the notes",
            chain=["researcher", "writer"],
            approve_before=["writer"],
        )
    assert TASK_CREATED in log, log
    view = result["structuredContent"]
    assert view["status"] == "awaiting_approval", view
    assert view["tasks"][0]["output_preview"] == "the findings"
    assert (view["next_action"]["kind"], view["next_action"]["gate_id"]) == ("approve", "before:writer")

"""Every chain as an A2A agent, driven by another SDK than ours: the A2A JavaScript SDK's client
(``@a2a-js/sdk``, pinned with its Node in ``tests/a2a_js``) runs ``tests/a2a_js/a2a_client.mjs``
against a real server process. The script builds its client from the agent card, starts a gated
chain over the stream, answers every ``input-required`` (host tasks and the gate) until the task
completes, then reads it back with ``GetTask``; it prints what it saw, including each JSON-RPC
method and ``A2A-Version`` it sent. The run it leaves is then read through the MCP tools.

Without ``npm ci`` in ``tests/a2a_js`` these tests skip, saying so; under ``CI=true`` they fail."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client as McpClient

from tests.acceptance.harness import free_port, full_view, read_log
from tests.acceptance.node_tools import A2A_JS_DIR, node_path, require
from tests.acceptance.test_a2a_face import ALICE, TOKENS, provider_env, served
from tests.acceptance.test_identities import as_identity
from tests.acceptance.test_mcp_http import http_server_on
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

SCRIPT = A2A_JS_DIR / "a2a_client.mjs"
SDK = "@a2a-js/sdk"
SDK_VERSION = json.loads((A2A_JS_DIR / "package.json").read_text())["dependencies"][SDK]
STEPS = ("architect", "engineer", "reviewer")
#: what the script answers, in order: the chain's host tasks and the gate before engineer
REPLIES = [
    {"kind": "host_task", "id": "architect"},
    {"kind": "gate", "id": "before:engineer"},
    {"kind": "host_task", "id": "engineer"},
    {"kind": "host_task", "id": "reviewer"},
]
#: the JSON-RPC methods each protocol line of the JS client sends for that (ListTasks is 1.0 only)
METHODS = {
    "1.0": {"SendStreamingMessage", "SendMessage", "GetTask", "ListTasks"},
    "0.3": {"message/stream", "message/send", "tasks/get"},
}


@pytest.fixture(autouse=True)
def _js_sdk() -> None:
    """Skip (fail under ``CI=true``) before any server starts when the JS SDK is not installed."""
    require(SDK, "the A2A JavaScript SDK", A2A_JS_DIR)


async def js_client(
    base: str, protocol: str = "1.0", token: str | None = None, chain: Any = None
) -> tuple[int, dict[str, Any]]:
    """Run the JS SDK's client against ``base``; its exit status and its summary."""
    env = {"PATH": node_path(A2A_JS_DIR), "HOME": os.environ.get("HOME", "/tmp"), "NO_COLOR": "1"}
    if token is not None:
        env["A2A_TOKEN"] = token
    node = A2A_JS_DIR / "node_modules" / ".bin" / "node"
    with anyio.fail_after(180):
        done = await anyio.run_process(
            [
                str(node),
                str(SCRIPT),
                base,
                "--protocol",
                protocol,
                *([] if chain is None else ["--chain", json.dumps(chain)]),
            ],
            env=env,
            cwd=A2A_JS_DIR,
            check=False,
        )
    out, err = done.stdout.decode(), done.stderr.decode()
    try:
        summary = json.loads(out)
    except json.JSONDecodeError as exc:
        said = f"the JS client printed no summary (exit {done.returncode}):\n{out}\n{err}"
        raise AssertionError(said) from exc
    assert isinstance(summary, dict)
    summary["stderr"] = err
    return done.returncode, summary


def check_completed(summary: dict[str, Any], base: str, protocol: str) -> None:
    """What the JS client saw of a chain it drove to its end on the ``protocol`` line."""
    assert summary["sdk_version"] == SDK_VERSION and summary["node"].startswith("v22."), summary
    assert "error" not in summary, summary
    assert summary["card"]["interfaces"] == [{"url": f"{base}/a2a", "binding": "JSONRPC", "version": "1.0"}]
    assert summary["card"]["streaming"] is True and summary["card"]["push_notifications"] is False
    assert {"default", "review-loop", "research"} <= set(summary["card"]["skills"])
    assert summary["client_protocol_version"] == protocol
    assert summary["state"] == "TASK_STATE_COMPLETED", summary
    assert summary["context_id"] == summary["context_id_sent"], "the message's contextId is the task's"
    assert [{"kind": r["kind"], "id": r["id"]} for r in summary["replies"]] == REPLIES
    assert summary["counts"]["stream"] >= 1 and summary["counts"]["events"].get("task", 0) >= 1
    outputs = {step: f"[js output] {step}" for step in STEPS}
    assert summary["artifacts"] == outputs
    got = summary["get_task"]
    assert got["id"] == summary["task_id"] and got["context_id"] == summary["context_id"]
    assert got["state"] == "TASK_STATE_COMPLETED" and got["artifacts"] == outputs
    assert got["construct_status"] == "completed"
    assert {w["method"] for w in summary["wire"]} == METHODS[protocol], summary["wire"]
    assert {w["a2a_version"] for w in summary["wire"]} == {protocol}


def check_run(record: dict[str, Any], summary: dict[str, Any]) -> None:
    """The run the JS client drove, as the MCP tools show it: the same outputs and the gate."""
    assert record["run_id"] == summary["task_id"]
    assert record["status"] == "completed" and record["request"] == "Add a health endpoint."
    assert record["chain"]["name"] == "default"
    assert [s["approve_before"] for s in record["chain"]["steps"]] == [False, True, False]
    assert {t["task_id"]: t["output"] for t in record["tasks"]} == summary["artifacts"]
    [gate] = record["gates"]
    assert gate["gate_id"] == "before:engineer" and gate["status"] == "approved"
    assert gate["comment"] == "Approved from the JS client." and gate["channel"] == "http"


@pytest.mark.parametrize("protocol", ["1.0", "0.3"])
async def test_the_js_client_drives_a_gated_chain_to_its_end(tmp_path: Path, protocol: str) -> None:
    async with served(tmp_path) as base:
        code, summary = await js_client(base, protocol)
        assert code == 0, summary
        check_completed(summary, base, protocol)
        assert not any(w["bearer"] for w in summary["wire"])
        if protocol == "1.0":
            assert summary["listed"] == [{"id": summary["task_id"], "state": "TASK_STATE_COMPLETED"}]
        async with McpClient(f"{base}/mcp") as client:
            record = await full_view(client, summary["task_id"])
    check_run(record, summary)
    assert record["started_by"] is None and record["gates"][0]["verified"] is False


async def test_the_js_client_with_a_bearer_token(tmp_path: Path) -> None:
    async with served(tmp_path, TOKENS) as base:
        code, refused = await js_client(base)
        # the 401's body is a JSON-RPC error: the SDK shows what it says
        assert code == 1 and "unauthorized: send 'Authorization: Bearer" in refused["error"], refused
        [sent] = refused["wire"]
        assert sent["method"] == "SendStreamingMessage" and sent["bearer"] is False

        code, summary = await js_client(base, token=ALICE)
        assert code == 0, summary
        check_completed(summary, base, "1.0")
        assert all(w["bearer"] for w in summary["wire"])
        async with as_identity(int(base.rsplit(":", 1)[1]), ALICE) as alice:
            record = await full_view(alice, summary["task_id"])
    check_run(record, summary)
    assert record["started_by"] == "alice"
    assert record["gates"][0]["verified"] is True
    assert ALICE not in json.dumps(summary) and ALICE not in read_log(tmp_path / "server.log")


async def test_the_js_client_reads_a_stream_as_it_is_written(tmp_path: Path) -> None:
    """A provider step's output streamed to the JS client: its artifact updates in pieces, then
    whole, and the status update that ends the stream, as the SDK parses them."""
    text = "".join(f"line {i:02d} of the writer's answer\n" for i in range(60))
    scenario = {"writer": [{"text": text, "chunk_chars": 60, "chunk_delay_seconds": 0.05}]}
    with FakeProvider(scenario) as fake:
        port = free_port()
        async with http_server_on(port, tmp_path, "streamable-http", env=provider_env(fake)):
            code, summary = await js_client(f"http://127.0.0.1:{port}", chain=["writer"])
    assert code == 0 and "error" not in summary, summary
    assert summary["state"] == "TASK_STATE_COMPLETED" and summary["replies"] == []
    assert [w["method"] for w in summary["wire"]] == ["SendStreamingMessage", "GetTask", "ListTasks"]
    counts = summary["counts"]
    assert counts["events"]["task"] == 1 and counts["events"]["statusUpdate"] >= 1
    assert counts["pieces"] >= 2, "the output arrives in pieces while the call runs"
    assert text.startswith(counts["streamed"]["writer"])
    assert summary["artifacts"] == {"writer": text} == summary["get_task"]["artifacts"]

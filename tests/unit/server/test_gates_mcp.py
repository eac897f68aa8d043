"""Revise and expiry through the MCP tools, in process through the official client: revise
re-runs the right step as ``step~2`` with the comment in its prompt (after and before gates),
bounded; a gate expires while no server is up and the next server decides it by expiry (on every
persistent store: filesystem, sqlite, postgres)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from orchestration.core.facts import ApprovalDecided
from server.app import ConstructApp
from server.settings.config import load_settings
from tests.acceptance.store_targets import BACKENDS, StoreTarget, store_target

CHAINS = """
[chains.after-gated]
steps = ["architect", { specialist = "engineer", approve_after = true, max_visits = 2 }]

[chains.before-gated]
steps = ["architect", { specialist = "engineer", approve_before = true }]

[chains.first-gated]
steps = [{ specialist = "architect", approve_before = true }, "engineer"]
""" + "".join(
    f"""
[chains.expiring-{on_expiry}]
steps = [
  "architect",
  {{ specialist = "engineer", approve_after = true, expires_after_seconds = 3, on_expiry = "{on_expiry}" }},
  "tester",
]
"""
    for on_expiry in ("approve", "reject", "fail")
)


def _app(home: Path, store: str | None = None) -> ConstructApp:
    (home / "construct.toml").write_text(CHAINS)
    env = {"CONSTRUCT_HOME": str(home), "CONSTRUCT_POLL_SECONDS": "0.1"}
    if store is not None:
        env |= {"CONSTRUCT_ORCHESTRATION_STORE": store, "CONSTRUCT_STORE_FALLBACK": "false"}
    return ConstructApp(load_settings(env=env))


async def _call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def _error(client: Client, tool: str, **args: Any) -> str:
    result = await client.call_tool(tool, args)
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert isinstance(text, str)
    return text


async def _host(client: Client, view: dict[str, Any]) -> dict[str, Any]:
    """Answer host tasks until the run waits at a gate (or ends)."""
    while view["next_action"]["kind"] == "run_host_task":
        task_id = view["next_action"]["task_id"]
        view = await _call(
            client,
            "orchestrate_resume",
            run_id=view["run_id"],
            task_id=task_id,
            output=f"the work of {task_id}",
            wait_seconds=5,
        )
    return view


def _gate(view: dict[str, Any], gate_id: str) -> dict[str, Any]:
    return next(g for g in view["gates"] if g["gate_id"] == gate_id)


@pytest.fixture(
    params=["memory", "filesystem", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """Each store's URL (memory: the process's own)."""
    if request.param == "memory":
        yield "memory"
        return
    async with store_target(request.param, tmp_path / "store") as target:
        yield target.url


async def test_revise_through_the_tools_reruns_the_step_with_the_comment_bounded(
    tmp_path: Path, store: str
) -> None:
    async with Client(_app(tmp_path, store).build_server()) as client:
        view = await _host(client, await _call(client, "orchestrate_start", request="x", chain="after-gated"))
        run_id = view["run_id"]
        assert view["next_action"]["gate_id"] == "after:engineer"
        assert "revise" in view["next_action"]["choices"]
        assert _gate(view, "after:engineer")["decisions"] == ["approve", "reject", "revise"]
        view = await _call(
            client,
            "orchestrate_approve",
            run_id=run_id,
            decision="revise",
            gate_id="after:engineer",
            comment="handle errors",
            approver="ann",
            wait_seconds=5,
        )
        action = view["next_action"]
        assert (action["kind"], action["task_id"]) == ("run_host_task", "engineer~2")
        assert "## Sent back by the approver (ann)" in action["user_prompt"]
        assert "handle errors" in action["user_prompt"] and "the work of engineer" in action["user_prompt"]
        gate = _gate(view, "after:engineer")
        assert (gate["status"], gate["channel"], gate.get("decisions", [])) == ("revised", "stdio", [])
        engineer2 = next(t for t in view["tasks"] if t["task_id"] == "engineer~2")
        assert engineer2["revised_by"] == "after:engineer"

        # engineer~2 is the step's second visit of at most 2: its gate offers no revise.
        view = await _host(client, view)
        assert view["next_action"]["gate_id"] == "after:engineer~2"
        assert _gate(view, "after:engineer~2")["decisions"] == ["approve", "reject"]
        text = await _error(
            client, "orchestrate_approve", run_id=run_id, decision="revise", gate_id="after:engineer~2"
        )
        assert text.startswith("invalid_state: ") and "max_visits 2" in text and "exhausted" in text
        view = await _call(client, "run_status", run_id=run_id)
        assert (
            view["status"] == "awaiting_approval" and _gate(view, "after:engineer~2")["status"] == "requested"
        )


async def test_revise_at_a_before_gate_reruns_the_step_before_it(tmp_path: Path, store: str) -> None:
    async with Client(_app(tmp_path, store).build_server()) as client:
        view = await _host(
            client, await _call(client, "orchestrate_start", request="x", chain="before-gated")
        )
        view = await _call(
            client,
            "orchestrate_approve",
            run_id=view["run_id"],
            decision="revise",
            gate_id="before:engineer",
            comment="a simpler design",
            wait_seconds=5,
        )
        assert view["next_action"]["task_id"] == "architect~2"
        assert "a simpler design" in view["next_action"]["user_prompt"]
        view = await _host(client, view)
        assert view["next_action"]["gate_id"] == "before:engineer~2"
        assert [(t["task_id"], t["status"]) for t in view["tasks"]] == [
            ("architect", "done"),
            ("engineer", "skipped"),
            ("architect~2", "done"),
            ("engineer~2", "pending"),
        ]

        # A gate before the first step shows no output: no revise, and asking for one says why.
        view = await _call(client, "orchestrate_start", request="y", chain="first-gated")
        assert _gate(view, "before:architect")["decisions"] == ["approve", "reject"]
        text = await _error(
            client,
            "orchestrate_approve",
            run_id=view["run_id"],
            decision="revise",
            gate_id="before:architect",
        )
        assert text.startswith("invalid_argument: ") and "first step" in text


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_gate_that_expires_while_no_server_is_up_is_decided_by_the_next_one(
    tmp_path: Path, backend: str
) -> None:
    async with store_target(backend, tmp_path / "store") as target:
        await _expire_while_down(tmp_path, target)


async def _expire_while_down(tmp_path: Path, target: StoreTarget) -> None:
    runs: dict[str, str] = {}
    expiries: list[datetime] = []
    async with Client(_app(tmp_path, target.url).build_server()) as client:
        for on_expiry in ("approve", "reject", "fail"):
            view = await _call(client, "orchestrate_start", request="x", chain=f"expiring-{on_expiry}")
            view = await _host(client, view)
            gate = _gate(view, "after:engineer")
            assert gate["status"] == "requested" and gate["on_expiry"] == on_expiry
            assert f"it is decided by expiry ({on_expiry})" in view["next_action"]["instruction"]
            expiries.append(datetime.fromisoformat(gate["expires_at"]))
            runs[on_expiry] = view["run_id"]
    # No server is up while the gates expire.
    await anyio.sleep(max(0.0, (max(expiries) - datetime.now(UTC)).total_seconds()) + 0.2)
    async with Client(_app(tmp_path, target.url).build_server()) as client:
        views = {k: await _call(client, "run_status", run_id=r, wait_seconds=10) for k, r in runs.items()}
    assert views["approve"]["status"] == "awaiting_host"
    assert views["approve"]["next_action"]["task_id"] == "tester"
    assert views["reject"]["status"] == "rejected"
    assert views["fail"]["status"] == "failed" and views["fail"]["error"]["code"] == "approval_expired"
    for on_expiry, view in views.items():
        gate = _gate(view, "after:engineer")
        assert (gate["channel"], gate.get("approver"), gate.get("verified", False)) == ("expiry", None, False)
        assert gate["status"] == {"approve": "approved", "reject": "rejected", "fail": "failed"}[on_expiry]
    async with target.opened() as store:
        for on_expiry, run_id in runs.items():
            decided = [f for f in await store.read_facts(run_id) if isinstance(f, ApprovalDecided)]
            assert [(f.decision, f.channel) for f in decided] == [(on_expiry, "expiry")]

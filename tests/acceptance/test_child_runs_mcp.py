"""Child runs through the MCP tools (the official client, in process), on every store, with the
inline backend: the host answers every task, the child's too, by following ``next_action``.

A chain whose middle step runs ``gated-inner`` as a child run: the parent's view shows the
child's host tasks and its approval gate (with the child's run id), the child's output becomes the
step's. A host starts a child of its own task: it is listed, blocks the task's completion unless
detached, and is cancelled with the parent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from orchestration.core.facts import ChildEnded, ChildStarted
from orchestration.store import RunStore
from tests.acceptance.harness import call, call_error, full_view
from tests.acceptance.test_retried_calls import STORES, served

CONFIG = """
[chains.gated-inner]
steps = [{ specialist = "engineer", approve_before = true }, "reviewer"]

[chains.outer]
steps = ["architect", { name = "build", chain = "gated-inner", output_of = "engineer" }, "writer"]
"""


@asynccontextmanager
async def served_with_chains(backend: str, tmp_path: Path) -> AsyncIterator[tuple[Client, RunStore | None]]:
    (tmp_path / "construct.toml").write_text(CONFIG, "utf-8")
    async with served(backend, tmp_path) as opened:
        yield opened


async def follow(client: Client, view: dict[str, Any], answers: dict[str, str]) -> dict[str, Any]:
    """Play the host and the approver from a run's view: answer each host task (by task id) and
    approve each gate, in whatever run ``next_action`` names, until the run ends."""
    top = view["run_id"]
    for _ in range(30):
        action = view["next_action"]
        where = action.get("run_id") or view["run_id"]
        if action["kind"] == "run_host_task":
            await call(
                client,
                "orchestrate_resume",
                run_id=where,
                task_id=action["task_id"],
                output=answers[action["task_id"]],
            )
        elif action["kind"] == "approve":
            await call(
                client, "orchestrate_approve", run_id=where, decision="approve", gate_id=action["gate_id"]
            )
        elif action["kind"] == "none":
            return view
        view = await call(client, "run_status", run_id=top, wait_seconds=5)
    raise AssertionError(f"run {top} did not end: {view['status']}")


@pytest.mark.parametrize("backend", STORES)
async def test_a_step_runs_a_chain_the_host_works_through_the_parent_view(
    backend: str, tmp_path: Path
) -> None:
    async with served_with_chains(backend, tmp_path) as (client, store):
        view = await call(client, "orchestrate_start", request="A URL shortener", chain="outer")
        run_id = view["run_id"]
        view = await call(
            client, "orchestrate_resume", run_id=run_id, task_id="architect", output="Design: a hash table."
        )
        # The parent waits for its child, which waits at its gate: the parent's view says so,
        # with the child's run id.
        assert view["status"] == "awaiting_children", view["status"]
        [child] = view["children"]
        assert (child["task_id"], child["by"], child["chain"]) == ("build", "step", "gated-inner")
        action = view["next_action"]
        assert action["kind"] == "approve" and action["gate_id"] == "before:engineer"
        assert action["run_id"] == child["run_id"] != run_id
        assert child["waiting_for"] == f"gate before:engineer in run {child['run_id']}"
        child_view = await full_view(client, child["run_id"])
        assert "Design: a hash table." in child_view["request_preview"]

        final = await follow(
            client,
            view,
            {"engineer": "Code v1.", "reviewer": "Looks fine.", "writer": "Docs."},
        )
        assert final["status"] == "completed"
        build = next(t for t in final["tasks"] if t["task_id"] == "build")
        assert build["output_preview"] == "Code v1."  # output_of = "engineer"
        build = next(t for t in (await full_view(client, run_id))["tasks"] if t["task_id"] == "build")
        assert build["executor"] == f"child:{child['run_id']}"
        assert [c["status"] for c in final["children"]] == ["completed"]
        done_child = await call(client, "run_status", run_id=child["run_id"])
        assert done_child["status"] == "completed"
        if store is not None:
            facts = await store.read_facts(run_id)
            assert [f.child_run_id for f in facts if isinstance(f, ChildStarted)] == [child["run_id"]]
            assert [f.status for f in facts if isinstance(f, ChildEnded)] == ["completed"]
            parent = (await store.load(child["run_id"])).parent
            assert parent is not None and (parent.run_id, parent.task_id) == (run_id, "build")


@pytest.mark.parametrize("backend", STORES)
async def test_a_host_splits_its_task_into_child_runs(backend: str, tmp_path: Path) -> None:
    async with served_with_chains(backend, tmp_path) as (client, store):
        view = await call(client, "orchestrate_start", request="Write a report", chain=["writer", "reviewer"])
        run_id = view["run_id"]
        assert view["next_action"]["task_id"] == "writer"
        sub = await call(
            client,
            "orchestrate_start",
            request="Research the background",
            chain=["researcher"],
            parent_run_id=run_id,
            parent_task_id="writer",
            idempotency_key="sub-1",
        )
        again = await call(
            client,
            "orchestrate_start",
            request="Research the background",
            chain=["researcher"],
            parent_run_id=run_id,
            parent_task_id="writer",
            idempotency_key="sub-1",
        )
        assert again["run_id"] == sub["run_id"]
        parent = await call(client, "run_status", run_id=run_id)
        assert [(c["run_id"], c["by"], c["task_id"]) for c in parent["children"]] == [
            (sub["run_id"], "host", "writer")
        ]

        # The task cannot be completed while its child is live...
        text = await call_error(
            client, "orchestrate_resume", run_id=run_id, task_id="writer", output="Report."
        )
        assert text.startswith("invalid_state: task writer") and sub["run_id"] in text, text
        # ...unless the host detaches it; the child is still listed, and cancelled with the run.
        view = await call(
            client,
            "orchestrate_resume",
            run_id=run_id,
            task_id="writer",
            output="Report.",
            detach_children=True,
        )
        assert view["next_action"]["task_id"] == "reviewer"
        cancelled = await call(client, "orchestrate_cancel", run_id=run_id)
        assert cancelled["status"] == "cancelled"
        assert (await call(client, "run_status", run_id=sub["run_id"]))["status"] == "cancelled"
        if store is not None:
            # Linked once, although the start was repeated.
            facts = await store.read_facts(run_id)
            linked = [(f.child_run_id, f.by) for f in facts if isinstance(f, ChildStarted)]
            assert linked == [(sub["run_id"], "host")]

        # A child of a task that does not await the host is refused.
        other = await call(client, "orchestrate_start", request="Another", chain=["writer"])
        text = await call_error(
            client,
            "orchestrate_start",
            request="x",
            parent_run_id=other["run_id"],
            parent_task_id="nope",
        )
        assert text.startswith("invalid_argument: run"), text

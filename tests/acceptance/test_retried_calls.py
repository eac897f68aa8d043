"""A retried call applies only to what its caller saw (issue 9, section 1), through the MCP surface
(the official client, in process) on every store.

Hosts retry a call after a timeout or a dropped connection, and models repeat calls. A call that
records something therefore names what it answers: ``orchestrate_resume`` with ``output`` needs
``task_id``, and ``orchestrate_approve`` needs ``gate_id``. Without them, a repeat after the run
moved on used to land on the *next* task or gate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from orchestration.core.facts import ApprovalDecided, TaskCompleted
from orchestration.store import RunStore
from server.app import ConstructApp
from server.settings.config import load_settings
from stores import open_store
from tests.acceptance.harness import call, call_error, full_view
from tests.acceptance.store_targets import BACKENDS, store_target

STORES = ("memory", *BACKENDS)


@asynccontextmanager
async def served(backend: str, tmp_path: Path) -> AsyncIterator[tuple[Client, RunStore | None]]:
    """A client of an in-process server on ``backend``, and the store opened beside it (to read
    the record; None for the memory store, which the server alone holds: it is read through
    run_status there)."""
    if backend == "memory":
        app = ConstructApp(load_settings(env=_env(tmp_path, "memory")))
        async with Client(app.build_server()) as client:
            yield client, None
        return
    async with store_target(backend, tmp_path / "store") as target:
        app = ConstructApp(load_settings(env=_env(tmp_path, target.url)))
        store = await open_store(target.url, home=tmp_path)
        try:
            async with Client(app.build_server()) as client:
                yield client, store
        finally:
            await store.close()


def _env(home: Path, store: str) -> dict[str, str]:
    return {
        "CONSTRUCT_HOME": str(home),
        "CONSTRUCT_ORCHESTRATION_STORE": store,
        "CONSTRUCT_STORE_FALLBACK": "false",
        "CONSTRUCT_POLL_SECONDS": "0.1",
    }


async def outputs(client: Client, store: RunStore | None, run_id: str) -> dict[str, str]:
    """Every recorded task output, read from the facts when the test can reach the store."""
    if store is None:
        view = await call(client, "run_status", run_id=run_id, detail="full")
        return {t["task_id"]: t["output"] for t in view["tasks"] if t.get("output") is not None}
    facts = await store.read_facts(run_id)
    return {f.task_id: f.output for f in facts if isinstance(f, TaskCompleted)}


async def version_of(client: Client, run_id: str) -> int:
    """The run's recorded version (in the full view only): a call that records nothing leaves it."""
    version: int = (await full_view(client, run_id))["version"]
    return version


@pytest.mark.parametrize("backend", STORES)
async def test_a_repeated_resume_never_records_its_output_for_the_next_task(
    backend: str, tmp_path: Path
) -> None:
    async with served(backend, tmp_path) as (client, store):
        view = await call(client, "orchestrate_start", request="retries", chain=["architect", "engineer"])
        run_id = view["run_id"]
        assert view["next_action"]["task_id"] == "architect"
        # The host's call: names the task it answers.
        answered = await call(client, "orchestrate_resume", run_id=run_id, task_id="architect", output="X")
        assert answered["next_action"]["task_id"] == "engineer"
        version = await version_of(client, run_id)

        # A retry without task_id, after the run moved on to the engineer: refused, nothing recorded.
        text = await call_error(client, "orchestrate_resume", run_id=run_id, output="X", wait_seconds=0)
        assert text.startswith("invalid_argument: task_id is missing"), text
        assert "'engineer'" in text and "architect" in text, text
        assert await outputs(client, store, run_id) == {"architect": "X"}

        # The same call repeated exactly is a no-op answering the current view.
        again = await call(
            client, "orchestrate_resume", run_id=run_id, task_id="architect", output="X", wait_seconds=0
        )
        assert await version_of(client, run_id) == version
        assert again == answered
        assert await outputs(client, store, run_id) == {"architect": "X"}

        # After the run ended, a missing task_id says so (not "pass task_id").
        done = await call(client, "orchestrate_resume", run_id=run_id, task_id="engineer", output="Y")
        assert done["status"] == "completed"
        text = await call_error(client, "orchestrate_resume", run_id=run_id, output="Y", wait_seconds=0)
        assert text.startswith(f"invalid_state: run {run_id} is completed; nothing awaits output"), text
        assert await outputs(client, store, run_id) == {"architect": "X", "engineer": "Y"}


@pytest.mark.parametrize("backend", STORES)
async def test_a_repeated_approval_never_approves_the_next_gate(backend: str, tmp_path: Path) -> None:
    async with served(backend, tmp_path) as (client, store):
        view = await call(
            client,
            "orchestrate_start",
            request="two gates",
            chain=["architect", "engineer"],
            approve_before=["architect", "engineer"],
        )
        run_id = view["run_id"]
        assert view["next_action"]["gate_id"] == "before:architect"
        # Without gate_id: refused, naming the gate the run waits at.
        text = await call_error(client, "orchestrate_approve", run_id=run_id, decision="approve")
        assert text.startswith("invalid_argument: gate_id is missing"), text
        assert "gate_id='before:architect'" in text, text

        approval: dict[str, Any] = {"run_id": run_id, "decision": "approve", "comment": "go"}
        view = await call(client, "orchestrate_approve", gate_id="before:architect", **approval)
        view = await call(client, "orchestrate_resume", run_id=run_id, task_id="architect", output="design")
        assert view["next_action"]["kind"] == "approve"
        assert view["next_action"]["gate_id"] == "before:engineer"
        version = await version_of(client, run_id)

        # The first approval retried: the current view, the second gate still open.
        again = await call(
            client, "orchestrate_approve", gate_id="before:architect", wait_seconds=0, **approval
        )
        assert await version_of(client, run_id) == version
        assert again == view
        assert again["next_action"]["gate_id"] == "before:engineer"
        # Retried without its gate_id: refused; the second gate stays undecided.
        text = await call_error(client, "orchestrate_approve", wait_seconds=0, **approval)
        assert text.startswith("invalid_argument: gate_id is missing"), text
        assert "before:architect (approved)" in text, text
        view = await call(client, "run_status", run_id=run_id)
        assert view["status"] == "awaiting_approval"
        assert [(g["gate_id"], g["status"]) for g in view["gates"]] == [
            ("before:architect", "approved"),
            ("before:engineer", "requested"),
        ]
        if store is not None:
            facts = await store.read_facts(run_id)
            assert [f.gate_id for f in facts if isinstance(f, ApprovalDecided)] == ["before:architect"]

        # The decision record is immutable: the same decision with another comment is a conflict.
        text = await call_error(
            client, "orchestrate_approve", gate_id="before:architect", **{**approval, "comment": "other"}
        )
        assert text.startswith("conflict: gate before:architect"), text

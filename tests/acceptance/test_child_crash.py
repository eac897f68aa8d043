"""Child runs survive SIGKILL (real processes, the filesystem store): a chain whose middle step runs
a gated chain as a child run, played by a host through the parent's view. For every durable write
N of the run (the parent's and the child's), a server started with
``CONSTRUCT_FAULT_CRASH_AFTER_WRITES=N`` kills itself right after it; a new server on the same
store finishes the run with a host that repeats what it was doing.

The writes that matter most: N = 3 records ``child_started`` and dies before the child exists (the
new server's sweep creates it: the waiting parent is not runnable); N = 4 creates the child and
dies before the parent's drive goes on; N = 8 ends the child and dies before its end is recorded
on the parent (the sweep records it). A host's answer is one write with what follows from it
(issue 23), so the kill after each write is also the kill before the next call's. Every trial
must end with one parent and one child, each task prepared and completed once, the child linked
once and its end recorded once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from orchestration.core.facts import ChildEnded, ChildStarted, Fact, TaskCompleted
from orchestration.core.models import RunHead
from stores.filesystem import FilesystemStore
from tests.acceptance.harness import call, server_env, stdio_client_for

pytestmark = pytest.mark.slow

CONFIG = """
[chains.gated-inner]
steps = [{ specialist = "engineer", approve_before = true }, "reviewer"]

[chains.outer]
steps = ["architect", { name = "build", chain = "gated-inner", output_of = "engineer" }, "writer"]
"""
START = {"request": "A rate limiter", "chain": "outer", "idempotency_key": "child-crash"}
#: parent: create (with the architect's task), the architect's output, child_started; child:
#: create, gate requested, the decision (with the engineer's task), the engineer's output (with
#: the reviewer's task), the reviewer's output (with the child's end); parent: the child's end,
#: the writer's task, the writer's output (with the run's end)
WRITES = 11


def output_for(task_id: str) -> str:
    return f"[test host output] {task_id}"


async def host(client: Client, rounds: int = 60) -> dict[str, Any]:
    """Play the host and the approver from the parent's view until it ends (restartable: every
    call is idempotent)."""
    view = await call(client, "orchestrate_start", **START)
    top = view["run_id"]
    for _ in range(rounds):
        action = view["next_action"]
        where = action.get("run_id") or top
        if action["kind"] == "none":
            return view
        if action["kind"] == "run_host_task":
            task_id = action["task_id"]
            await call(
                client, "orchestrate_resume", run_id=where, task_id=task_id, output=output_for(task_id)
            )
        elif action["kind"] == "approve":
            await call(
                client, "orchestrate_approve", run_id=where, decision="approve", gate_id=action["gate_id"]
            )
        view = await call(client, "run_status", run_id=top, wait_seconds=3)
    raise AssertionError(f"run did not finish: {view['status']}")


async def run_server(home: Path, **env: str) -> dict[str, Any] | None:
    """Run the host against one server process; None if the server died under it."""
    try:
        with anyio.fail_after(120):
            async with stdio_client_for(
                server_env(home, CONSTRUCT_LEASE_TTL_SECONDS="1", **env), home / "server.log"
            ) as client:
                return await host(client)
    except TimeoutError:
        raise
    except BaseException as exc:  # the client sees the dead server as a closed stream or an error
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return None


async def stored_runs(home: Path) -> dict[str, tuple[RunHead, list[Fact]]]:
    store = FilesystemStore(home)
    try:
        heads = (await store.list_runs()).runs
        return {h.chain.name: (h, await store.read_facts(h.run_id)) for h in heads}
    finally:
        await store.close()


def check_one_child(runs: dict[str, tuple[RunHead, list[Fact]]]) -> None:
    assert sorted(runs) == ["gated-inner", "outer"], sorted(runs)
    parent, parent_facts = runs["outer"]
    child, _ = runs["gated-inner"]
    assert parent.status == "completed" and child.status == "completed"
    assert child.parent is not None and (child.parent.run_id, child.parent.task_id) == (
        parent.run_id,
        "build",
    )
    assert [f.child_run_id for f in parent_facts if isinstance(f, ChildStarted)] == [child.run_id]
    assert [f.child_run_id for f in parent_facts if isinstance(f, ChildEnded)] == [child.run_id]
    for head, facts in runs.values():
        for task in head.tasks:
            prepared = [f for f in facts if f.type == "host_task_prepared" and f.task_id == task.task_id]
            completed = [f for f in facts if isinstance(f, TaskCompleted) and f.task_id == task.task_id]
            assert len(completed) == 1, f"task {task.task_id} of {head.chain.name} completed twice"
            assert len(prepared) == (0 if task.task_id == "build" else 1), task.task_id
    build = next(f for f in parent_facts if isinstance(f, TaskCompleted) and f.task_id == "build")
    assert build.output == output_for("engineer")


async def test_the_uninterrupted_run_makes_the_expected_writes(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG, "utf-8")
    view = await run_server(tmp_path)
    assert view is not None and view["status"] == "completed", (tmp_path / "server.log").read_text()
    runs = await stored_runs(tmp_path)
    check_one_child(runs)
    assert sum(head.version for head, _ in runs.values()) == WRITES


@pytest.mark.parametrize("n", range(1, WRITES + 1))
async def test_kill_after_write_n_then_resume(n: int, tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG, "utf-8")
    log = tmp_path / "server.log"
    first = await run_server(tmp_path, CONSTRUCT_FAULT_CRASH_AFTER_WRITES=str(n))
    assert first is None, f"server #1 should have died after write {n}"
    pid = int((tmp_path / "server.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert f"SIGKILL after write {n}" in log.read_text()
    killed = await stored_runs(tmp_path)
    if n == 3:
        # child_started is recorded, the child does not exist: only the sweep can create it.
        assert sorted(killed) == ["outer"]
        assert killed["outer"][0].status == "awaiting_children"
        assert isinstance(killed["outer"][1][-1], ChildStarted)
    if n == 8:
        # The child ended; its end is not recorded on the parent.
        assert killed["gated-inner"][0].status == "completed"
        assert killed["outer"][0].status == "awaiting_children"

    second = await run_server(tmp_path)
    assert second is not None and second["status"] == "completed", log.read_text()[-3000:]
    check_one_child(await stored_runs(tmp_path))

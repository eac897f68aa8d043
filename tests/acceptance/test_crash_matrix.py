"""Crash safety with real processes (issue 2): for N = 1 .. the number of durable writes in a gated
chain, a server started with ``CONSTRUCT_FAULT_CRASH_AFTER_WRITES=N`` kills itself with SIGKILL
right after its N-th write. A new server on the same store then finishes the run, with a host that
simply repeats what it was doing (every host action is idempotent). The final run must equal the
uninterrupted one — same facts in the same order, same outputs, same decisions — and no task may
have been prepared or completed twice."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from orchestration.core.facts import Fact, TaskCompleted
from orchestration.core.models import RunHead
from stores.filesystem import FilesystemStore
from tests.acceptance.harness import call, server_env, stdio_client_for

pytestmark = pytest.mark.slow

REQUEST = "Design, build and review a rate limiter for an HTTP API."
START = {"request": REQUEST, "approve_before": ["engineer"], "idempotency_key": "crash-matrix"}


def output_for(task_id: str) -> str:
    return f"[test host output] {task_id}: deterministic answer"


async def host(client: Client, rounds: int = 30) -> dict[str, Any]:
    """Play the host until the run ends. Restartable: every call here is idempotent."""
    view = await call(client, "orchestrate_start", **START)
    for _ in range(rounds):
        kind = view["next_action"]["kind"]
        run_id = view["run_id"]
        if kind == "none":
            return view
        if kind == "run_host_task":
            task_id = view["next_action"]["task_id"]
            view = await call(
                client, "orchestrate_resume", run_id=run_id, task_id=task_id, output=output_for(task_id)
            )
        elif kind == "approve":
            gate_id = view["next_action"]["gate_id"]
            view = await call(
                client,
                "orchestrate_approve",
                run_id=run_id,
                decision="approve",
                gate_id=gate_id,
                comment="ok",
            )
        else:
            view = await call(client, "run_status", run_id=run_id, wait_seconds=2)
    raise AssertionError(f"run did not finish: {view['status']}")


async def run_server(home: Path, log: Path, **env: str) -> dict[str, Any] | None:
    """Run the host against one server process; None if the server died under it."""
    try:
        with anyio.fail_after(120):
            async with stdio_client_for(
                server_env(home, CONSTRUCT_LEASE_TTL_SECONDS="1", **env), log
            ) as client:
                return await host(client)
    except TimeoutError:
        raise
    except BaseException as exc:  # the client sees the dead server as a closed stream or an error
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return None


async def stored_run(home: Path) -> tuple[RunHead, list[Fact]]:
    store = FilesystemStore(home)
    try:
        page = await store.list_runs()
        assert len(page.runs) == 1, [h.run_id for h in page.runs]
        head = page.runs[0]
        return head, await store.read_facts(head.run_id)
    finally:
        await store.close()


def comparable(facts: list[Fact]) -> list[dict[str, Any]]:
    """The facts without what legitimately differs between two runs: times and the run id."""
    out = []
    for fact in facts:
        data = fact.model_dump(mode="json", exclude={"at"})
        data.pop("run_id", None)
        out.append(data)
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunHead, list[Fact]]:
    home = tmp_path_factory.mktemp("reference")

    async def go() -> tuple[RunHead, list[Fact]]:
        view = await run_server(home, home / "server.log")
        assert view is not None and view["status"] == "completed", (home / "server.log").read_text()
        return await stored_run(home)

    return anyio.run(go)


def test_reference_run_has_the_expected_number_of_writes(reference: tuple[RunHead, list[Fact]]) -> None:
    head, facts = reference
    assert head.status == "completed"
    # run_created, 3x host_task_prepared, 3x (host output + completion), approval requested and
    # decided, run_finished: 10 writes. The matrix below crashes after each one.
    assert head.version == 10
    assert len(facts) == 13


@pytest.mark.parametrize("n", range(1, 11))
async def test_kill_after_write_n_then_resume(
    n: int, tmp_path: Path, reference: tuple[RunHead, list[Fact]]
) -> None:
    log = tmp_path / "server.log"
    first = await run_server(tmp_path, log, CONSTRUCT_FAULT_CRASH_AFTER_WRITES=str(n))
    assert first is None, f"server #1 should have died after write {n}"
    pid = int((tmp_path / "server.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert f"SIGKILL after write {n}" in log.read_text()

    second = await run_server(tmp_path, log)
    assert second is not None and second["status"] == "completed", log.read_text()

    head, facts = await stored_run(tmp_path)
    ref_head, ref_facts = reference
    assert comparable(facts) == comparable(ref_facts)
    assert head.version == ref_head.version
    for task in head.tasks:
        prepared = [f for f in facts if f.type == "host_task_prepared" and f.task_id == task.task_id]
        completed = [f for f in facts if isinstance(f, TaskCompleted) and f.task_id == task.task_id]
        assert len(prepared) == 1 and len(completed) == 1, f"task {task.task_id} ran twice"
        assert completed[0].output == output_for(task.task_id)

"""Crash safety with real processes (issue 2), on every persistent store: for N = 1 .. the number of
durable writes in a gated inline chain, a server started with ``CONSTRUCT_FAULT_CRASH_AFTER_WRITES=N``
kills itself with SIGKILL right after its N-th write, before it answers. A new server on the same
store then finishes the run, with a host that simply repeats what it was doing (every host action
is idempotent). The final run must equal the uninterrupted one — same facts in the same order, same
outputs, same decisions, same writes — and no task may have been prepared or completed twice.

Since issue 23 every write of the host's path is ONE write per call that holds what follows from it
(the start with the first host task, each answer with the next task or the gate or the run's end,
the decision with the next task): killing after write N is killing after that call's write and
before the next call's, so the matrix covers the kill before and after each of them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from orchestration.core.facts import Fact, TaskCompleted
from orchestration.core.models import RunHead
from tests.acceptance.harness import call, stdio_client_for
from tests.acceptance.store_targets import BACKENDS, StoreTarget, store_target

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


async def run_server(target: StoreTarget, home: Path, log: Path, **env: str) -> dict[str, Any] | None:
    """Run the host against one server process on ``target``; None if the server died under it."""
    try:
        with anyio.fail_after(120):
            async with stdio_client_for(
                target.env(home, CONSTRUCT_LEASE_TTL_SECONDS="1", **env), log
            ) as client:
                return await host(client)
    except TimeoutError:
        raise
    except BaseException as exc:  # the client sees the dead server as a closed stream or an error
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return None


async def stored_run(target: StoreTarget) -> tuple[RunHead, list[Fact]]:
    runs = await target.runs()
    assert len(runs) == 1, [h.run_id for h, _ in runs]
    return runs[0]


def comparable(facts: list[Fact]) -> list[dict[str, Any]]:
    """The facts without what legitimately differs between two runs: times and the run id."""
    out = []
    for fact in facts:
        data = fact.model_dump(mode="json", exclude={"at"})
        data.pop("run_id", None)
        out.append(data)
    return out


#: The writes of the uninterrupted run: the start (with the architect's task), the architect's
#: answer (with the gate's request), the decision (with the engineer's task), the engineer's answer
#: (with the reviewer's task), the reviewer's answer (with the run's end).
WRITES = 5


@pytest.fixture(scope="module")
def references() -> dict[str, tuple[RunHead, list[Fact]]]:
    return {}


async def reference_for(
    backend: str, references: dict[str, tuple[RunHead, list[Fact]]], workdir: Path
) -> tuple[RunHead, list[Fact]]:
    if backend not in references:
        async with store_target(backend, workdir) as target:
            view = await run_server(target, workdir / "home", workdir / "server.log")
            assert view is not None and view["status"] == "completed", (workdir / "server.log").read_text()
            references[backend] = await stored_run(target)
        head, facts = references[backend]
        assert head.status == "completed"
        # run_created, 3x host_task_prepared, 3x (host output + completion), approval requested and
        # decided, run_finished: 13 facts in 5 writes, one per call. The matrix crashes after each.
        assert head.version == WRITES
        assert len(facts) == 13
    return references[backend]


@pytest.mark.parametrize("n", range(1, WRITES + 1))
@pytest.mark.parametrize("backend", BACKENDS)
async def test_kill_after_write_n_then_resume(
    backend: str, n: int, tmp_path: Path, references: dict[str, tuple[RunHead, list[Fact]]]
) -> None:
    ref_head, ref_facts = await reference_for(backend, references, tmp_path / "ref")
    async with store_target(backend, tmp_path / "store") as target:
        log = tmp_path / "server.log"
        first = await run_server(target, tmp_path / "s1", log, CONSTRUCT_FAULT_CRASH_AFTER_WRITES=str(n))
        assert first is None, f"server #1 should have died after write {n}"
        pid = int((tmp_path / "s1" / "server.pid").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert f"SIGKILL after write {n}" in log.read_text()

        second = await run_server(target, tmp_path / "s2", log)
        assert second is not None and second["status"] == "completed", log.read_text()

        head, facts = await stored_run(target)
    assert comparable(facts) == comparable(ref_facts)
    assert head.version == ref_head.version
    for task in head.tasks:
        prepared = [f for f in facts if f.type == "host_task_prepared" and f.task_id == task.task_id]
        completed = [f for f in facts if isinstance(f, TaskCompleted) and f.task_id == task.task_id]
        assert len(prepared) == 1 and len(completed) == 1, f"task {task.task_id} ran twice"
        assert completed[0].output == output_for(task.task_id)

"""Fork and rewind end to end (issue 14, part 4): against the fake provider over real HTTP, on a
parallel chain, through the ``orchestrate_fork`` MCP tool and through ``construct-mcp runs fork``.
The rule on every store: ``tests/stores/test_fork.py``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import TextContent

from orchestration.core import StartRequest
from orchestration.core.facts import TaskCompleted
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.ops.forking import ForkRequest, fork_run
from server.app import ConstructApp
from server.cli.main import run as cli_run
from server.settings.config import load_settings
from tests.fakes.fake_provider import FakeProvider
from tests.unit.engine.test_provider_runtime import close_clients, make
from tests.unit.helpers import make_runtime
from tests.unit.parallel import PARALLEL_CATALOG

__all__ = ["close_clients"]  # the fixture that closes make()'s HTTP clients


async def test_a_fork_calls_the_provider_only_from_the_forked_task_on() -> None:
    with FakeProvider({"reviewer": [{"error": "auth"}]}) as fake:
        runtime = await make(fake)
        started, _ = await runtime.start(StartRequest("Build a parser"))
        await runtime.drive(started.run_id)
        source = await runtime.status(started.run_id)
        assert source.status == RunStatus.FAILED and source.error is not None
        assert fake.calls() == {"architect": 1, "engineer": 1, "reviewer": 1}

        fake.set_scenario({"reviewer": [{"text": "looks right"}]})  # the key is fixed; counters restart
        head, _ = await fork_run(runtime, ForkRequest(source.run_id, "reviewer"))
        await runtime.drive(head.run_id)
        forked = await runtime.status(head.run_id)
        assert forked.status == RunStatus.COMPLETED
        assert fake.calls() == {"reviewer": 1}
        outputs = await runtime.outputs(forked)
        assert outputs["reviewer"] == "looks right"
        assert outputs["engineer"] == (await runtime.outputs(source))["engineer"]
        assert (await runtime.status(source.run_id)).status == RunStatus.FAILED
        # The copies carry the source's usage as provenance, but the new run spent only on its
        # own call: its running totals (what a budget checks) count the reviewer's alone.
        facts = await runtime.store.read_facts(forked.run_id)
        (own,) = [f for f in facts if isinstance(f, TaskCompleted) and f.copied_from is None]
        assert own.task_id == "reviewer" and own.telemetry.output_tokens
        assert forked.spent is not None and forked.spent.run.output_tokens == own.telemetry.output_tokens
        reviewer = own.telemetry
        assert source.spent is not None and source.spent.run.output_tokens > (reviewer.output_tokens or 0)


async def test_a_parallel_fork_runs_again_the_branches_still_in_flight() -> None:
    runtime = make_runtime(catalog=PARALLEL_CATALOG)
    started, _ = await runtime.start(StartRequest("Research it", chain="fan-two"))
    await runtime.drive(started.run_id)
    source = await runtime.status(started.run_id)
    assert [t.status for t in source.tasks[:3]] == [TaskStatus.AWAITING_HOST] * 3
    for task_id in ("a", "b"):
        await runtime.submit_host_output(started.run_id, task_id, f"notes of {task_id}")
    # c is still with the host and the writer has not started: a fork from the writer copies a and
    # b, and c runs again.
    head, _ = await fork_run(runtime, ForkRequest(started.run_id, "writer"))
    assert {t.task_id: t.status for t in head.tasks} == {
        "a": TaskStatus.DONE,
        "b": TaskStatus.DONE,
        "c": TaskStatus.PENDING,
        "writer": TaskStatus.PENDING,
    }
    await runtime.drive(head.run_id)
    snapshot = await runtime.snapshot(head.run_id)
    assert [p.task_id for p in snapshot.host_tasks] == ["c"]
    assert set(snapshot.copied) == {"a", "b"}
    assert (await runtime.status(started.run_id)).task("c").status == TaskStatus.AWAITING_HOST


def _app(tmp_path: Path) -> ConstructApp:
    return ConstructApp(load_settings(env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_POLL_SECONDS": "0.1"}))


async def test_orchestrate_fork_over_mcp(tmp_path: Path) -> None:
    async with Client(_app(tmp_path).build_server()) as client:
        assert "orchestrate_fork" in {t.name for t in (await client.list_tools()).tools}
        view: dict[str, Any] | None = (
            await client.call_tool(
                "orchestrate_start", {"request": "Write a note", "chain": ["architect", "writer"]}
            )
        ).structured_content
        assert view is not None
        run_id = view["run_id"]
        for task_id in ("architect", "writer"):
            view = (
                await client.call_tool(
                    "orchestrate_resume", {"run_id": run_id, "task_id": task_id, "output": f"{task_id} v1"}
                )
            ).structured_content
        assert view is not None and view["status"] == "completed"

        arguments = {
            "run_id": run_id,
            "from_task": "writer",
            "request": "Write a shorter note",
            "idempotency_key": "k",
        }
        fork = (await client.call_tool("orchestrate_fork", arguments)).structured_content
        assert fork is not None and fork["run_id"] != run_id
        assert fork["forked_from"] == {"run_id": run_id, "task_id": "writer"}
        assert fork["next_action"]["kind"] == "run_host_task" and fork["next_action"]["task_id"] == "writer"
        assert "Write a shorter note" in fork["next_action"]["user_prompt"]
        assert "architect v1" in fork["next_action"]["user_prompt"]  # the copied output, not redone
        tasks = {t["task_id"]: t for t in fork["tasks"]}
        assert isinstance(tasks["architect"]["copied_from"], int) and "copied_from" not in tasks["writer"]
        again = (await client.call_tool("orchestrate_fork", arguments)).structured_content
        assert again is not None and again["run_id"] == fork["run_id"]

        refused = await client.call_tool("orchestrate_fork", {"run_id": run_id, "from_task": "editor"})
        assert refused.is_error
        text = "".join(b.text for b in refused.content if isinstance(b, TextContent))
        assert text.startswith("invalid_argument: ") and "architect, writer" in text
        source = (await client.call_tool("run_status", {"run_id": run_id})).structured_content
        assert source is not None and source["status"] == "completed" and "forked_from" not in source


def test_runs_fork_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = ["--home", str(tmp_path)]

    def ok(*args: str) -> dict[str, Any]:
        out = io.StringIO()
        assert cli_run([*args, *home, "--json"], out) == 0, capsys.readouterr().err
        data: dict[str, Any] = json.loads(out.getvalue())
        return data

    view = ok("runs", "start", "Write a note", "--specialists", "architect,writer")
    run_id = view["run_id"]
    for task_id in ("architect", "writer"):
        view = ok("runs", "resume", run_id, "--task-id", task_id, "--output", f"{task_id} v1")
    assert view["status"] == "completed"

    fork = ok("runs", "fork", run_id, "--from", "writer", "--request", "Shorter")
    assert fork["forked_from"] == {"run_id": run_id, "task_id": "writer"}
    assert fork["status"] == "awaiting_host" and fork["next_action"]["task_id"] == "writer"

    out = io.StringIO()
    assert cli_run(["runs", "status", fork["run_id"], *home], out) == 0
    text = out.getvalue()
    assert f"forked from {run_id} at task writer" in text
    assert "(copied)" in next(line for line in text.splitlines() if line.strip().startswith("architect"))

    out = io.StringIO()
    assert cli_run(["runs", "timeline", fork["run_id"], *home], out) == 0
    timeline = out.getvalue()
    assert f"forked from {run_id} at writer" in timeline
    assert 'architect: done by inline:host: "architect v1" [copy of #4]' in timeline

    assert cli_run(["runs", "fork", run_id, "--from", "editor", *home], io.StringIO()) == 1
    assert "invalid_argument: " in capsys.readouterr().err

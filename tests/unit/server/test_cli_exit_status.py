"""The exit status of the ``runs`` commands that advance a run: 0 when the command did what was
asked and the run goes on or completed, 3 when it did and the run ended ``failed``, ``rejected`` or
``cancelled`` — a script chaining CLI commands must not take a failed run for success."""

from __future__ import annotations

import io
import json

from orchestration.core.models import TypedError
from orchestration.engine.runtime import Runtime
from server.cli.grammar import build_parser
from server.cli.main import _runs_with
from tests.unit.helpers import ScriptedWorker, make_runtime


async def _cli(runtime: Runtime, *argv: str) -> tuple[int, dict[str, object]]:
    out = io.StringIO()
    code = await _runs_with(runtime, build_parser().parse_args(["runs", *argv, "--json"]), out)
    answer: dict[str, object] = json.loads(out.getvalue())
    return code, answer


async def test_a_start_whose_run_fails_exits_3_and_prints_the_run() -> None:
    fatal = TypedError(code="provider_error", message="no", retryable=False)
    runtime = make_runtime(worker=ScriptedWorker(script={"architect": [fatal]}))
    argv = ["start", "Build it", "--specialists", "architect", "--worker-backend", "provider"]
    code, view = await _cli(runtime, *argv)
    assert (code, view["status"]) == (3, "failed")


async def test_a_rejection_exits_3_and_an_approval_0() -> None:
    runtime = make_runtime()
    argv = ["start", "Build it", "--specialists", "architect,engineer", "--approve-before", "engineer"]
    code, view = await _cli(runtime, *argv)
    assert (code, view["status"]) == (0, "awaiting_host")
    run_id = str(view["run_id"])
    code, view = await _cli(runtime, "resume", run_id, "--task-id", "architect", "--output", "the design")
    assert (code, view["status"]) == (0, "awaiting_approval")
    code, view = await _cli(runtime, "approve", run_id, "--gate-id", "before:engineer", "--reject")
    assert (code, view["status"]) == (3, "rejected")


async def test_cancel_itself_and_status_of_an_ended_run_exit_0() -> None:
    runtime = make_runtime()
    code, view = await _cli(runtime, "start", "Build it", "--specialists", "architect")
    run_id = str(view["run_id"])
    code, view = await _cli(runtime, "cancel", run_id)
    assert (code, view["status"]) == (0, "cancelled")
    code, view = await _cli(runtime, "status", run_id)
    assert (code, view["status"]) == (0, "cancelled")

"""The CLI's budget and usage flags (server/cli/budget_flags.py): ``runs start --max-total-tokens`` and
``runs resume --input-tokens/--output-tokens`` record what ``orchestrate_start``'s ``budget`` and
``orchestrate_resume``'s ``usage`` record; bad values are ``invalid_argument`` and record nothing."""

from __future__ import annotations

import io
import json

import pytest

from orchestration.core.facts import HostOutputSubmitted
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.runtime import Runtime
from orchestration.errors import InvalidArgument
from server.cli.grammar import build_parser
from server.cli.main import _runs_with
from server.cli.usage import UsageError
from tests.unit.helpers import make_runtime


async def cli(runtime: Runtime, *argv: str, exit_status: int = 0) -> dict[str, object]:
    out = io.StringIO()
    args = build_parser().parse_args(["runs", *argv, "--json"])
    assert await _runs_with(runtime, args, out) == exit_status
    answer: dict[str, object] = json.loads(out.getvalue())
    return answer


async def test_a_budget_from_the_cli_stops_the_run_at_the_hosts_reported_usage() -> None:
    runtime = make_runtime()
    view = await cli(
        runtime, "start", "Build it", "--specialists", "architect,engineer", "--max-total-tokens", "1000"
    )
    run_id = str(view["run_id"])
    head = await runtime.status(run_id)
    assert head.contract.costs is not None and head.contract.costs.budget is not None
    assert head.contract.costs.budget.max_total_tokens == 1000
    argv = ["resume", run_id, "--task-id", "architect", "--output", "the design"]
    # The resume was taken, and the run it advanced failed: exit status 3.
    view = await cli(runtime, *argv, "--input-tokens", "700", "--output-tokens", "400", exit_status=3)
    assert view["status"] == RunStatus.FAILED.value
    assert isinstance(view["error"], dict) and view["error"]["code"] == "budget_exhausted"
    (submitted,) = [f for f in await runtime.store.read_facts(run_id) if isinstance(f, HostOutputSubmitted)]
    assert submitted.usage is not None and (submitted.usage.input_tokens, submitted.usage.output_tokens) == (
        700,
        400,
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--on-budget", "ask"], "--on-budget needs"),
        (["--max-total-tokens", "0"], "budget: max_total_tokens"),
        (["--max-cost-usd", "-1"], "budget: max_cost_usd"),
    ],
)
async def test_bad_budget_flags_are_refused_and_start_nothing(argv: list[str], says: str) -> None:
    runtime = make_runtime()
    with pytest.raises(UsageError, match=says) as raised:
        await cli(runtime, "start", "Build it", *argv)
    assert isinstance(raised.value.error, InvalidArgument)
    assert not (await runtime.list_runs()).runs


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--input-tokens", "5"], "go together"),
        (["--cost-usd", "0.1"], "--cost-usd needs"),
        (["--input-tokens", "-1", "--output-tokens", "1"], "usage: input_tokens"),
    ],
)
async def test_bad_usage_flags_are_refused_and_record_nothing(argv: list[str], says: str) -> None:
    runtime = make_runtime()
    run_id = str((await cli(runtime, "start", "Build it", "--specialists", "architect"))["run_id"])
    before = (await runtime.status(run_id)).version
    with pytest.raises(UsageError, match=says) as raised:
        await cli(runtime, "resume", run_id, "--task-id", "architect", "--output", "x", *argv)
    assert isinstance(raised.value.error, InvalidArgument)
    assert (await runtime.status(run_id)).version == before

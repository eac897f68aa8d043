"""What the command line does before and around a command: ``--version``; the help that lists the
commands when none is given; an unknown flag said with its sub-command's usage and the closest flag;
flags the CLI checks itself (``--gate-id``, ``--task-id``, ``--older-than``, ``--status``) refused as
usage errors (exit 2); and the small texts of the human output (a header row in ``runs list``, the
gate legend only where a gate is shown, ``1 live run``, an unreachable ``--store``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from orchestration.core import StartRequest
from server.cli.grammar import version
from server.cli.live import render_watch
from server.cli.main import run
from tests.unit.helpers import make_runtime


def start(home: Path, *args: str) -> str:
    out = io.StringIO()
    assert run(["runs", "start", "x", "--home", str(home), "--json", *args], out) == 0
    run_id: str = json.loads(out.getvalue())["run_id"]
    return run_id


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--version"]) == 0
    assert capsys.readouterr().out == f"construct-mcp {version()}\n"
    assert version()[0].isdigit()


@pytest.mark.parametrize(
    ("argv", "listed"),
    [
        ([], ["serve", "runs", "migrate", "demo", "--version", "exit status:"]),
        (["runs"], ["start", "status", "resume", "approve", "list", "tail", "prune"]),
    ],
)
def test_no_command_prints_the_help_that_lists_the_commands_and_exits_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], listed: list[str]
) -> None:
    assert run(argv) == 2
    said = capsys.readouterr()
    assert said.out == ""  # a usage error: the help goes to stderr
    assert said.err.startswith(f"usage: construct-mcp {' '.join(argv)}".rstrip() + " [-h]")
    for word in listed:
        assert word in said.err, word
    assert "required" not in said.err


def test_an_unknown_flag_is_said_with_the_subcommands_usage_and_the_closest_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["runs", "start", "x", "--aprove-before", "engineer"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: construct-mcp runs start [-h]")
    assert err.rstrip().endswith(
        "construct-mcp runs start: error: unrecognized arguments: --aprove-before engineer "
        "(did you mean '--approve-before'?)"
    )
    assert run(["runs", "status", "run-x", "--fulll"]) == 2
    assert "(did you mean '--full'?)" in capsys.readouterr().err


def test_a_missing_gate_id_is_a_usage_error_naming_the_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = start(tmp_path, "--specialists", "writer", "--approve-before", "writer")
    capsys.readouterr()
    assert run(["runs", "approve", run_id, "--home", str(tmp_path)], io.StringIO()) == 2
    assert capsys.readouterr().err == (
        f"invalid_argument: --gate-id is missing: name the gate you decide. Run {run_id} awaits a "
        "decision at gate 'before:writer': pass --gate-id='before:writer' once the user decided it\n"
    )


def test_an_output_without_its_task_id_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = start(tmp_path, "--specialists", "writer")
    capsys.readouterr()  # the note that the store was created
    home = ["--home", str(tmp_path)]
    assert run(["runs", "resume", run_id, "--output", "text", *home], io.StringIO()) == 2
    assert capsys.readouterr().err.startswith("invalid_argument: --task-id is missing")
    assert run(["runs", "resume", run_id, "--task-id", "writer", *home], io.StringIO()) == 2
    assert capsys.readouterr().err.startswith("invalid_argument: --task-id or usage was given without")
    # Once the run has ended no flag would help: its state is the error (exit 1).
    assert run(["runs", "cancel", run_id, *home], io.StringIO()) == 0
    for argv in (["resume", run_id, "--output", "late"], ["approve", run_id]):
        assert run(["runs", *argv, *home], io.StringIO()) == 1
        assert capsys.readouterr().err.startswith(f"invalid_state: run {run_id} is cancelled")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--older-than", "soon"], "argument --older-than: 'soon' is not an age like 30d"),
        (["--older-than", "3d", "--status", "live"], "argument --status: cannot prune runs in status 'live'"),
    ],
)
def test_a_bad_prune_flag_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], said: str
) -> None:
    assert run(["runs", "prune", *flags, "--home", str(tmp_path)], io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: construct-mcp runs prune") and said in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["runs", "start", "x", "--on-budget", "ask"],
            "invalid_argument: --on-budget needs --max-total-tokens",
        ),
        (["runs", "start", "x", "--max-cost-usd", "-1"], "invalid_argument: budget: max_cost_usd"),
        (["runs", "import", "run.jsonl", "--move"], "invalid_argument: --move and --from go together"),
    ],
)
def test_flags_that_go_together_or_bad_values_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    assert run([*argv, "--home", str(tmp_path)], io.StringIO()) == 2
    assert capsys.readouterr().err.startswith(said)


def test_runs_list_has_a_header_row(tmp_path: Path) -> None:
    first = start(tmp_path, "--specialists", "writer")
    second = start(tmp_path, "--specialists", "writer")
    out = io.StringIO()
    assert run(["runs", "list", "--home", str(tmp_path)], out) == 0
    header, *rows = out.getvalue().splitlines()
    assert header.split() == ["RUN", "STATUS", "CHAIN", "REQUEST"]
    assert [row.split()[0] for row in rows] == [second, first]
    # The columns line up under their names.
    assert rows[0].index("awaiting_host") == header.index("STATUS")
    assert rows[0].index("custom") == header.index("CHAIN")


def test_the_gate_legend_is_shown_only_for_a_chain_with_a_gate(tmp_path: Path) -> None:
    legend = "(* = approval gate)"
    plain, gated = io.StringIO(), io.StringIO()
    home = ["--home", str(tmp_path)]
    assert run(["runs", "start", "x", "--specialists", "writer", *home], plain) == 0
    assert "chain custom v1: writer\n" in plain.getvalue() and legend not in plain.getvalue()
    gate = ["--approve-before", "writer"]
    assert run(["runs", "start", "x", "--specialists", "writer", *gate, *home], gated) == 0
    assert f"chain custom v1: writer*   {legend}\n" in gated.getvalue()


async def test_watch_counts_one_live_run_in_the_singular() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("One.", chain=("writer",)))
    now = runtime.clock.now()
    assert render_watch([head], now).startswith("1 live run at ")
    assert render_watch([head, head], now).startswith("2 live runs at ")
    assert render_watch([], now).startswith("0 live runs at ")
    assert render_watch([head], now, more=True).startswith("1+ live runs at ")


def test_an_unreachable_store_named_on_the_command_line_is_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unreachable = "postgresql://nobody:hunter2@127.0.0.1:1/construct"
    assert run(["runs", "list", "--home", str(tmp_path), "--store", unreachable], io.StringIO()) == 1
    err = capsys.readouterr().err
    assert err.startswith("store_unavailable: cannot open the store postgresql://nobody:***@127.0.0.1:1/")
    assert "store_fallback" not in err and "hunter2" not in err
    assert "check that the database is up" in err

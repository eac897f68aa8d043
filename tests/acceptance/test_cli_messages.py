"""What a person at a terminal reads when ``construct-mcp`` refuses (issue 26): one line on stderr
naming what is wrong (the file, the table and field, a did-you-mean) and the command to run next
in the CLI's words -- never a tool, a traceback or the validator's boilerplate -- and the exit
status ``--help`` documents (0 ok, 1 error, 2 usage or configuration, 3 the run ended badly)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.harness import SERVER_COMMAND, server_env

pytestmark = pytest.mark.slow

#: What a CLI message must never contain: the MCP channel's words, and a validator's or Python's.
FORBIDDEN = (
    "orchestrate_",
    "runs_list",
    "run_status",
    "Traceback",
    "Extra inputs are not permitted",
    "Input should be",
    "validation error for",
    "Value error",
    "Field required",
)
#: "call <a_tool>" (an OS error's "Connect call failed" is no tool's name)
TOOL_CALL = re.compile(r"\bcall [a-z]+_[a-z_]+")
UNREACHABLE = "postgresql://nobody:hunter2@127.0.0.1:1/construct"
NO_RUN = "run-0000000000aa-0000000000000001"


def cli(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVER_COMMAND, *args],
        capture_output=True,
        text=True,
        env={**server_env(home, CONSTRUCT_LOG_LEVEL="WARNING"), "PATH": os.environ.get("PATH", ""), **env},
        timeout=120,
        check=False,
    )


def refused(proc: subprocess.CompletedProcess[str], status: int, *words: str) -> str:
    """The first stderr line of a refusal: the exit status, the words, nothing forbidden."""
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert lines, proc
    if lines[0].startswith("usage: "):  # argparse's own: the usage, then the error
        lines = [" ".join(lines[:-1]) + " " + lines[-1]]
    first = lines[0]
    for word in words:
        assert word in first, (word, proc.stderr)
    found = [w for w in FORBIDDEN if w in proc.stderr] + TOOL_CALL.findall(proc.stderr)
    assert not found, (found, proc.stderr)
    # The other lines, if any, are the note on a store that did not exist before.
    assert all(line.startswith("construct-mcp: note: ") for line in lines[1:]), proc.stderr
    return first


CONFIGS = {
    "chain_field": '[chains.x]\nsteps = ["writer"]\naprove_before = ["writer"]\n',
    "step_field": '[chains.x]\nsteps = [{ specialist = "writer", aprove_before = true }]\n',
    "chain_type": '[chains.x]\nsteps = ["writer"]\nmax_parallel = "two"\n',
    "provider_field": '[providers.openai]\nbase_ur = "http://127.0.0.1:8080/v1"\n',
    "provider_table": '[providers.antropic]\nbase_url = "http://127.0.0.1:8080/v1"\n',
    "setting_name": 'stoer = "sqlite"\n',
    "setting_type": "store = 5\n",
    "setting_value": 'worker_backend = "provder"\n',
}

#: (name, command line ({config}: that config's file, {home}: the home), exit status, words of the line)
CASES = [
    ("unknown run: status", ["runs", "status", NO_RUN], 1, ["run_not_found", "`construct-mcp runs list`"]),
    ("unknown run: resume", ["runs", "resume", NO_RUN], 1, ["run_not_found", "`construct-mcp runs list`"]),
    ("unknown run: approve", ["runs", "approve", NO_RUN, "--gate-id", "g"], 1, ["run_not_found"]),
    ("unknown run: cancel", ["runs", "cancel", NO_RUN], 1, ["run_not_found"]),
    ("unknown run: timeline", ["runs", "timeline", NO_RUN], 1, ["run_not_found"]),
    ("unknown run: tail", ["runs", "tail", NO_RUN], 1, ["run_not_found"]),
    ("unknown run: fork", ["runs", "fork", NO_RUN, "--from", "writer"], 1, ["run_not_found"]),
    ("unknown run: export", ["runs", "export", NO_RUN], 1, ["run_not_found"]),
    ("bad run id", ["runs", "status", "../etc"], 1, ["invalid_argument", "not a valid run id"]),
    (
        "unknown chain",
        ["runs", "start", "x", "--chain", "defualt"],
        1,
        ["unknown_chain", "did you mean 'default'"],
    ),
    (
        "no model",
        ["runs", "start", "x", "--worker-backend", "provider", "--provider", "anthropic"],
        1,
        ["invalid_argument", "pass --model to `construct-mcp runs start`"],
    ),
    (
        "a chain's field that is a step's",
        ["runs", "list", "--config", "{chain_field}"],
        2,
        ["chain_field.toml", "chains.x.aprove_before", "did you mean 'approve_before'", "field of a step"],
    ),
    (
        "a step's misspelled field",
        ["runs", "list", "--config", "{step_field}"],
        2,
        ["step_field.toml", "chains.x.steps[0].aprove_before", "did you mean 'approve_before'"],
    ),
    (
        "a chain field's type",
        ["runs", "list", "--config", "{chain_type}"],
        2,
        ["chain_type.toml", "chains.x.max_parallel", "must be a whole number"],
    ),
    (
        "a provider table's misspelled key",
        ["runs", "list", "--config", "{provider_field}"],
        2,
        ["provider_field.toml", "providers.openai.base_ur", "did you mean 'base_url'"],
    ),
    (
        "a misspelled provider table",
        ["runs", "list", "--config", "{provider_table}"],
        2,
        ["provider_table.toml", "providers.antropic", "did you mean 'anthropic'"],
    ),
    (
        "a misspelled setting",
        ["runs", "list", "--config", "{setting_name}"],
        2,
        ["setting_name.toml", "stoer", "did you mean 'store'"],
    ),
    (
        "a setting's type",
        ["runs", "list", "--config", "{setting_type}"],
        2,
        ["setting_type.toml", "store", "must be a string"],
    ),
    (
        "a setting's value",
        ["runs", "start", "x", "--config", "{setting_value}"],
        2,
        ["setting_value.toml", "worker_backend", "did you mean 'provider'"],
    ),
    (
        "a missing config file",
        ["runs", "list", "--config", "{home}/missing.toml"],
        2,
        ["missing.toml", "does not exist"],
    ),
    ("an unknown store", ["runs", "list", "--store", "nosuch://x"], 2, ["--store", "unknown URL scheme"]),
    (
        "a Postgres store that does not connect",
        ["runs", "list", "--store", UNREACHABLE],
        1,
        ["store_unavailable", "from --store"],
    ),
    (
        "migrate on a Postgres store that does not connect",
        ["migrate", "--store", UNREACHABLE],
        1,
        ["store_unavailable"],
    ),
    (
        "tail from a server that is not there",
        ["runs", "tail", NO_RUN, "--url", "http://127.0.0.1:1/mcp"],
        1,
        ["invalid_argument", "--url", "cannot follow the run there"],
    ),
    ("a usage error", ["runs", "frobnicate"], 2, ["usage: construct-mcp runs"]),
    ("a list limit out of range", ["runs", "list", "--limit", "0"], 2, ["--limit", "between 1 and 500"]),
]


@pytest.mark.parametrize(("args", "status", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_refusal_is_one_line_in_the_clis_words(
    tmp_path: Path, args: list[str], status: int, words: list[str]
) -> None:
    files = {name: tmp_path / f"{name}.toml" for name in CONFIGS}
    for name, path in files.items():
        path.write_text(CONFIGS[name])
    argv = [a.format(home=tmp_path, **{k: str(v) for k, v in files.items()}) for a in args]
    proc = cli(tmp_path, *argv)
    first = refused(proc, status, *words)
    assert "hunter2" not in proc.stderr and "hunter2" not in first


def test_a_bad_environment_variable_names_the_variable(tmp_path: Path) -> None:
    refused(cli(tmp_path, "runs", "list", CONSTRUCT_MAX_ATTEMPTS="x"), 2, "CONSTRUCT_MAX_ATTEMPTS", "must be")


def test_the_help_lists_the_exit_statuses(tmp_path: Path) -> None:
    for args in (["--help"], ["runs", "--help"]):
        proc = cli(tmp_path, *args)
        assert proc.returncode == 0
        table = proc.stdout[proc.stdout.index("exit status:") :]
        for status in ("0", "1", "2", "3"):
            assert f"\n  {status}  " in table, table


def test_what_a_run_waits_for_is_said_as_commands(tmp_path: Path) -> None:
    started = cli(tmp_path, "runs", "start", "x", "--specialists", "writer", "--approve-before", "writer")
    assert started.returncode == 0, started.stderr
    assert not [w for w in ("orchestrate_", "runs_list", "run_status") if w in started.stdout], started.stdout
    run_id = started.stdout.split()[1].rstrip(":")
    approve = f"`construct-mcp runs approve {run_id} --gate-id before:writer`"
    refused(cli(tmp_path, "runs", "resume", run_id), 1, "invalid_state", approve, "--reject")
    refused(cli(tmp_path, "runs", "resume", run_id, "--task-id", "writer", "--output", "x"), 1, approve)
    refused(cli(tmp_path, "runs", "approve", run_id), 2, "--gate-id is missing", "before:writer")
    refused(cli(tmp_path, "runs", "approve", run_id, "--gate-id", "nope"), 1, "no gate 'nope'", approve)

    approved = cli(tmp_path, "runs", "approve", run_id, "--gate-id", "before:writer", "--json")
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["status"] == "awaiting_host"
    resume = f"`construct-mcp runs resume {run_id} --task-id writer --output-file ANSWER.md`"
    refused(cli(tmp_path, "runs", "resume", run_id), 1, "invalid_argument", resume)

    done = cli(tmp_path, "runs", "resume", run_id, "--task-id", "writer", "--output", "the text")
    assert done.returncode == 0, done.stderr
    assert f"`construct-mcp runs status {run_id} --full` shows the whole outputs" in done.stdout
    assert not [w for w in ("orchestrate_", "runs_list", "run_status") if w in done.stdout], done.stdout


def test_a_rejected_run_exits_3(tmp_path: Path) -> None:
    started = cli(
        tmp_path, "runs", "start", "x", "--specialists", "writer", "--approve-before", "writer", "--json"
    )
    run_id = json.loads(started.stdout)["run_id"]
    proc = cli(tmp_path, "runs", "approve", run_id, "--gate-id", "before:writer", "--reject")
    assert proc.returncode == 3, proc.stderr
    assert "rejected" in proc.stdout and not [w for w in FORBIDDEN if w in proc.stderr + proc.stdout]

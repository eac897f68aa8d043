"""``construct-mcp`` as a user runs it: real processes (``python -m server ...``) on a temp home."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.acceptance.harness import SERVER_COMMAND, call, full_view, server_env, stdio_client_for
from tests.acceptance.store_targets import BACKENDS, store_target

pytestmark = pytest.mark.slow


def cli(home: Path, *args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVER_COMMAND, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**server_env(home), "PATH": os.environ.get("PATH", ""), **env},
        timeout=120,
        check=False,
    )


def ok_json(home: Path, *args: str, **env: str) -> dict[str, Any]:
    proc = cli(home, *args, "--json", **env)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def test_runs_commands_drive_a_gated_chain_to_completion(tmp_path: Path) -> None:
    view = ok_json(tmp_path, "runs", "start", "Build a tiny todo app", "--approve-before", "engineer")
    run_id = view["run_id"]
    assert view["status"] == "awaiting_host"
    assert view["next_action"]["task_id"] == "architect"

    answer = tmp_path / "answer.md"
    answer.write_text("[test host output] the design")
    view = ok_json(tmp_path, "runs", "resume", run_id, "--task-id", "architect", "--output-file", str(answer))
    assert view["status"] == "awaiting_approval"
    assert view["tasks"][0]["output_preview"] == "[test host output] the design"
    assert view["tasks"][0]["output"] is None  # compact: `runs status --full` shows it whole

    view = ok_json(
        tmp_path,
        "runs",
        "approve",
        run_id,
        "--gate-id",
        "before:engineer",
        "--comment",
        "go",
        "--approver",
        "bob",
    )
    assert view["next_action"]["task_id"] == "engineer"
    view = ok_json(
        tmp_path, "runs", "resume", run_id, "--task-id", "engineer", "--output", "[test host output] code"
    )
    view = ok_json(
        tmp_path, "runs", "resume", run_id, "--task-id", "reviewer", "--output", "[test host output] review"
    )
    assert view["status"] == "completed"

    assert ok_json(tmp_path, "runs", "status", run_id) == view
    full = ok_json(tmp_path, "runs", "status", run_id, "--full")
    assert [t["output"] for t in full["tasks"]] == [
        "[test host output] the design",
        "[test host output] code",
        "[test host output] review",
    ]
    listed = ok_json(tmp_path, "runs", "list", "--status", "completed")
    assert [r["run_id"] for r in listed["runs"]] == [run_id]

    timeline = ok_json(tmp_path, "runs", "timeline", run_id)
    types = [f["type"] for f in timeline["facts"]]
    assert types[0] == "run_created" and types[-1] == "run_finished"
    assert types.count("task_completed") == 3 and types.count("host_task_prepared") == 3

    human = cli(tmp_path, "runs", "timeline", run_id)
    assert human.returncode == 0 and "approval_decided" in human.stdout and "by bob" in human.stdout
    human = cli(tmp_path, "runs", "status", run_id)
    assert human.returncode == 0
    assert (
        f"run {run_id}: completed" in human.stdout and "gate before:engineer: approved by bob" in human.stdout
    )
    assert "[test host output] code" not in human.stdout
    human = cli(tmp_path, "runs", "status", run_id, "--full")
    assert human.returncode == 0
    assert "--- engineer output (23 chars) ---\n[test host output] code\n" in human.stdout


def test_human_output_shows_where_the_prompts_are_and_the_next_command_last(tmp_path: Path) -> None:
    proc = cli(tmp_path, "runs", "start", "Summarize durable execution", "--chain", "researcher,writer")
    assert proc.returncode == 0, proc.stderr
    assert "next: run host task 'researcher'" in proc.stdout
    # The prompts are in a file whose path is printed; --show-prompt prints them too.
    assert "--- system prompt ---" not in proc.stdout
    path = proc.stdout.split("its prompt (", 1)[1].split(": ", 1)[1].split("\n", 1)[0]
    assert "--- user prompt ---" in Path(path).read_text()
    assert proc.stdout.splitlines()[-1].lstrip().startswith("construct-mcp runs resume run-")
    run_id = proc.stdout.split()[1].rstrip(":")
    shown = cli(tmp_path, "runs", "status", run_id, "--show-prompt")
    assert "--- system prompt ---" in shown.stdout and "--- user prompt ---" in shown.stdout
    assert shown.stdout.splitlines()[-1].endswith("--output-file ANSWER.md")
    # Logs stay off stdout.
    assert "action=" not in proc.stdout


def test_reject_and_cancel(tmp_path: Path) -> None:
    view = ok_json(
        tmp_path, "runs", "start", "x", "--chain", "architect,engineer", "--approve-before", "engineer"
    )
    view = ok_json(tmp_path, "runs", "resume", view["run_id"], "--task-id", "architect", "--output", "design")
    argv = ["runs", "approve", view["run_id"], "--gate-id", "before:engineer", "--reject", "--comment", "no"]
    proc = cli(tmp_path, *argv, "--json")
    # The rejection was taken (the run is printed) and the run ended rejected: exit status 3.
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["status"] == "rejected"

    other = ok_json(tmp_path, "runs", "start", "y", "--specialists", "writer")
    cancelled = ok_json(tmp_path, "runs", "cancel", other["run_id"], "--reason", "test")
    assert cancelled["status"] == "cancelled"
    assert ok_json(tmp_path, "runs", "cancel", other["run_id"])["version"] == cancelled["version"]
    proc = cli(tmp_path, "runs", "resume", other["run_id"], "--output", "late")
    assert proc.returncode == 1
    assert proc.stderr.startswith("invalid_state: ")


def test_resume_and_approve_name_what_they_answer(tmp_path: Path) -> None:
    view = ok_json(
        tmp_path, "runs", "start", "x", "--chain", "architect,engineer", "--approve-before", "engineer"
    )
    run_id = view["run_id"]
    # A flag left out is a usage error (exit 2), said with what the run awaits.
    proc = cli(tmp_path, "runs", "resume", run_id, "--output", "design")
    assert proc.returncode == 2
    assert proc.stderr.startswith("invalid_argument: --task-id is missing"), proc.stderr
    assert "--task-id='architect'" in proc.stderr
    ok_json(tmp_path, "runs", "resume", run_id, "--task-id", "architect", "--output", "design")
    proc = cli(tmp_path, "runs", "approve", run_id)
    assert proc.returncode == 2
    assert proc.stderr.startswith("invalid_argument: --gate-id is missing"), proc.stderr
    assert "--gate-id='before:engineer'" in proc.stderr
    # The human output shows the whole next command.
    human = cli(tmp_path, "runs", "status", run_id)
    assert f"construct-mcp runs approve {run_id} --gate-id before:engineer" in human.stdout
    # Nothing was decided.
    assert ok_json(tmp_path, "runs", "status", run_id)["gates"][0]["status"] == "requested"


def test_idempotency_key_and_stdin(tmp_path: Path) -> None:
    proc = cli(tmp_path, "runs", "start", "-", "--idempotency-key", "k1", "--json", stdin="from stdin")
    assert proc.returncode == 0, proc.stderr
    first = json.loads(proc.stdout)
    assert first["request_preview"] == "from stdin" and first["request_chars"] == len("from stdin")
    again = cli(tmp_path, "runs", "start", "-", "--idempotency-key", "k1", "--json", stdin="from stdin")
    assert json.loads(again.stdout)["run_id"] == first["run_id"]
    conflict = cli(tmp_path, "runs", "start", "other", "--idempotency-key", "k1")
    assert conflict.returncode == 1 and conflict.stderr.startswith("conflict: ")


def test_operation_errors_exit_1_with_the_code(tmp_path: Path) -> None:
    for args, code in (
        (("runs", "status", "../../etc"), "invalid_argument"),
        (("runs", "status", "run-0000000000aa-0000000000000000"), "run_not_found"),
        (("runs", "start", "x", "--chain", "nope"), "unknown_chain"),
        (("runs", "start", "x", "--chain", "architect,wizard"), "unknown_specialist"),
        (("runs", "list", "--cursor", "garbage"), "invalid_argument"),
    ):
        proc = cli(tmp_path, *args)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert proc.stderr.startswith(f"{code}: "), (args, proc.stderr)
        assert proc.stdout == ""
    proc = cli(tmp_path, "runs", "start", "x" * 50, CONSTRUCT_MAX_REQUEST_CHARS="10")
    assert proc.returncode == 1 and proc.stderr.startswith("too_large: ")


def test_usage_and_configuration_errors_exit_2(tmp_path: Path) -> None:
    proc = cli(tmp_path, "runs", "frobnicate")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr

    bad = tmp_path / "bad.toml"
    bad.write_text('dispatch_concurrency = "lots"\n')
    proc = cli(tmp_path, "serve", "--config", str(bad))
    assert proc.returncode == 2
    assert str(bad) in proc.stderr and "dispatch_concurrency" in proc.stderr

    bad.write_text('[chains.broken]\nsteps = ["architect", "wizard"]\n')
    proc = cli(tmp_path, "serve", "--config", str(bad))
    assert proc.returncode == 2
    assert "chains.broken.steps[1].specialist" in proc.stderr and "wizard" in proc.stderr

    bad.write_text("stoer = 'memory'\n")
    proc = cli(tmp_path, "runs", "list", "--config", str(bad))
    assert proc.returncode == 2 and "stoer" in proc.stderr and "unknown setting" in proc.stderr

    proc = cli(tmp_path, "serve", CONSTRUCT_LEASE_TTL_SECONDS="soon")
    assert proc.returncode == 2 and "CONSTRUCT_LEASE_TTL_SECONDS" in proc.stderr

    proc = cli(tmp_path, "runs", "list", "--store", "nosuch://x")
    assert proc.returncode == 2 and "store" in proc.stderr


def test_an_unreachable_store_without_fallback_stops_the_server(tmp_path: Path) -> None:
    unreachable = "postgresql://nobody:hunter2@127.0.0.1:1/construct"
    proc = cli(tmp_path, "serve", CONSTRUCT_ORCHESTRATION_STORE=unreachable, CONSTRUCT_STORE_FALLBACK="false")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith("store_unavailable: cannot open the store")
    assert "hunter2" not in proc.stderr and "Traceback" not in proc.stderr
    # With the fallback (the default) the CLI works on the filesystem store and says so.
    view = ok_json(tmp_path, "runs", "start", "x", CONSTRUCT_ORCHESTRATION_STORE=unreachable)
    assert "using the filesystem store" in view["warnings"][0]


def test_the_config_file_in_home_is_read(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text('[chains.pair]\nsteps = ["writer", "reviewer"]\n')
    view = ok_json(tmp_path, "runs", "start", "x", "--chain", "pair")
    assert [s["specialist"] for s in view["chain"]["steps"]] == ["writer", "reviewer"]


async def test_the_cli_and_a_server_share_the_store(tmp_path: Path) -> None:
    view = ok_json(tmp_path, "runs", "start", "shared", "--chain", "writer,reviewer")
    async with stdio_client_for(server_env(tmp_path), tmp_path / "server.log") as client:
        seen = await call(client, "run_status", run_id=view["run_id"])
        # The CLI's JSON is the full view; the tool's answer leaves out the nulls (output_schema).
        assert seen["next_action"] == {k: v for k, v in view["next_action"].items() if v is not None}
        assert (await full_view(client, view["run_id"]))["next_action"] == view["next_action"]
        await call(client, "orchestrate_resume", run_id=view["run_id"], task_id="writer", output="draft")
    after = ok_json(tmp_path, "runs", "status", view["run_id"])
    assert after["next_action"]["task_id"] == "reviewer"


def test_migrate(tmp_path: Path) -> None:
    proc = cli(tmp_path, "migrate", "--check")
    assert proc.returncode == 0, proc.stderr
    assert "no schema" in proc.stdout
    proc = cli(tmp_path, "migrate", "--check", "--store", "sqlite")
    assert proc.returncode == 1 and proc.stderr.startswith("schema_out_of_date: ")
    report = ok_json(tmp_path, "migrate", "--store", "sqlite")
    assert report["up_to_date"] and report["applied"]
    assert ok_json(tmp_path, "migrate", "--check", "--store", "sqlite")["applied"] == []


def test_help_lists_the_commands(tmp_path: Path) -> None:
    proc = cli(tmp_path, "--help")
    assert proc.returncode == 0
    for command in ("serve", "runs", "migrate", "demo"):
        assert command in proc.stdout


@pytest.mark.parametrize("backend", BACKENDS)
async def test_demo_exits_0_on_every_store(tmp_path: Path, backend: str) -> None:
    async with store_target(backend, tmp_path / "target") as target:
        args = ["demo", "--home", str(tmp_path / "demo")]
        if backend != "filesystem":  # the default: a filesystem store under the demo home
            args += ["--store", target.url]
        proc = await anyio.to_thread.run_sync(lambda: cli(tmp_path, *args))
        if backend != "filesystem":
            runs = await target.runs()
            assert len(runs) == 1 and runs[0][0].status == "completed", "the demo ran on this store"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "SIGKILL server #1" in out and "[server #2" in out
    assert "Demo passed." in out
    assert out.count(": ok") == 4  # the run completed; each of the three tasks ran exactly once
    assert "[demo host output]" in out


def test_the_demo_refuses_the_memory_store(tmp_path: Path) -> None:
    proc = cli(tmp_path, "demo", "--store", "memory")
    assert proc.returncode == 2
    assert "memory store keeps nothing across processes" in proc.stderr


GUARDED = """
[chains.guarded]
steps = [
  "architect",
  { specialist = "engineer", approve_after = true, approvers = ["alice"], max_visits = 2 },
]
"""


def test_revise_and_per_gate_approvers_from_the_cli(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(GUARDED)
    view = ok_json(tmp_path, "runs", "start", "x", "--chain", "guarded")
    run_id = view["run_id"]
    ok_json(tmp_path, "runs", "resume", run_id, "--task-id", "architect", "--output", "design")
    view = ok_json(tmp_path, "runs", "resume", run_id, "--task-id", "engineer", "--output", "code v1")
    gate = view["gates"][0]
    assert (gate["gate_id"], gate["decisions"], gate["approvers"]) == (
        "after:engineer",
        ["approve", "reject", "revise"],
        ["alice"],
    )
    human = cli(tmp_path, "runs", "status", run_id)
    assert f"runs approve {run_id} --gate-id after:engineer [--reject | --revise]" in human.stdout
    # The CLI's approver is claimed (--approver, else the OS user): it must be one of the gate's.
    proc = cli(tmp_path, "runs", "approve", run_id, "--gate-id", "after:engineer", "--approver", "mallory")
    assert proc.returncode == 1 and proc.stderr.startswith("forbidden: "), proc.stderr
    assert "alice" in proc.stderr
    view = ok_json(
        tmp_path,
        "runs",
        "approve",
        run_id,
        "--gate-id",
        "after:engineer",
        "--revise",
        "--comment",
        "add tests",
        "--approver",
        "alice",
    )
    assert view["next_action"]["task_id"] == "engineer~2"
    assert (
        "add tests" in view["next_action"]["user_prompt"] and "code v1" in view["next_action"]["user_prompt"]
    )
    view = ok_json(tmp_path, "runs", "resume", run_id, "--task-id", "engineer~2", "--output", "code v2")
    assert view["gates"][1]["decisions"] == ["approve", "reject"]  # max_visits 2 reached
    proc = cli(
        tmp_path,
        "runs",
        "approve",
        run_id,
        "--gate-id",
        "after:engineer~2",
        "--revise",
        "--approver",
        "alice",
    )
    assert proc.returncode == 1 and proc.stderr.startswith("invalid_state: "), proc.stderr
    assert "max_visits 2" in proc.stderr

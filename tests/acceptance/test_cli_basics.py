"""``construct-mcp`` where a person meets it first, as real processes: a home that cannot hold
state stops ``serve`` at startup in one line; ``demo --keep`` ends with the command that shows its
run, and that command works; a home holding a SQLite store is not read as an empty filesystem
store; a reader that goes away (``runs status R | head -1``) is no failure; ``--version``, the
command list and an unknown flag's did-you-mean."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.harness import SERVER_COMMAND, server_env

pytestmark = pytest.mark.slow


def cli(
    home: Path, *args: str, stdout: int | None = subprocess.PIPE, stdin: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVER_COMMAND, *args],
        input=stdin,  # no terminal: serve's hint to a person stays out of stderr
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env={**server_env(home, CONSTRUCT_LOG_LEVEL="WARNING"), "PATH": os.environ.get("PATH", ""), **env},
        timeout=120,
        check=False,
    )


INITIALIZE = (
    json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "1"},
            },
        }
    )
    + "\n"
)


@pytest.mark.parametrize("kind", ["a file", "relative"])
def test_serve_refuses_a_home_that_cannot_hold_state_in_one_line(tmp_path: Path, kind: str) -> None:
    if kind == "a file":
        home = tmp_path / "home"
        home.write_text("")
        said = f"{home} is a file, not a directory"
    else:
        home = Path("relative-home")
        said = "'relative-home' is a relative path; give an absolute one"
    proc = cli(tmp_path, "serve", stdin=INITIALIZE, CONSTRUCT_HOME=str(home))
    assert proc.returncode == 2
    assert proc.stdout == ""  # not even initialize is answered: the host sees a server that failed
    assert proc.stderr == f"construct-mcp: configuration error: environment: CONSTRUCT_HOME: {said}" + (
        "\n" if kind == "a file" else f" (such as {Path.cwd() / home})\n"
    )


def kept_command(stdout: str) -> list[str]:
    """The command the demo's last line gives, as this checkout runs it."""
    last = stdout.rstrip().splitlines()[-1].strip()
    words = shlex.split(last)
    assert words[0] == "construct-mcp", last
    return words[1:]


def test_a_kept_demo_says_where_its_run_is_and_the_command_to_see_it(tmp_path: Path) -> None:
    home = tmp_path / "demo"
    proc = cli(tmp_path, "demo", "--store", "sqlite", "--home", str(home))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"The demo's run is kept in {home}" in proc.stdout
    command = kept_command(proc.stdout)
    assert command[:2] == ["runs", "status"] and command[3:] == ["--store", "sqlite", "--home", str(home)]
    shown = cli(tmp_path, *command)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"run {command[2]}: completed") and shown.stderr == ""

    # The README's `runs ... --home DIR` without the store: refused, naming the store to name.
    listed = cli(tmp_path, "runs", "list", "--home", str(home))
    assert listed.returncode == 2 and listed.stdout == ""
    assert "--store sqlite" in listed.stderr and "holds a SQLite store" in listed.stderr
    assert not (home / "runs").exists()


def test_a_kept_temporary_demo_names_its_directory(tmp_path: Path) -> None:
    proc = cli(tmp_path, "demo", "--keep")
    command = kept_command(proc.stdout)
    kept = Path(command[-1])
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert command[-4:-1] == ["--store", "filesystem", "--home"] and kept.is_dir()
        # The person's own CONSTRUCT_ORCHESTRATION_STORE does not send the command elsewhere.
        shown = cli(tmp_path, *command, "--json", CONSTRUCT_ORCHESTRATION_STORE="sqlite")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["status"] == "completed"
    finally:
        shutil.rmtree(kept, ignore_errors=True)


def test_a_reader_that_goes_away_is_no_failure(tmp_path: Path) -> None:
    started = cli(tmp_path, "runs", "start", "x" * 20_000, "--specialists", "writer", "--json")
    run_id = json.loads(started.stdout)["run_id"]
    for args in (["runs", "status", run_id], ["runs", "status", run_id, "--full"], ["runs", "list"]):
        read, write = os.pipe()
        os.close(read)  # the reader left before the first line: every write meets a closed pipe
        try:
            proc = cli(tmp_path, *args, stdout=write)
        finally:
            os.close(write)
        assert (proc.returncode, proc.stderr) == (0, ""), args


def test_version_the_command_list_and_an_unknown_flag(tmp_path: Path) -> None:
    version = cli(tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.startswith("construct-mcp ")
    bare = cli(tmp_path)
    assert bare.returncode == 2 and bare.stdout == ""
    assert all(f"\n    {command} " in bare.stderr for command in ("serve", "runs", "migrate", "demo"))
    unknown = cli(tmp_path, "runs", "start", "x", "--chian", "default")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("usage: construct-mcp runs start ")
    assert "unrecognized arguments: --chian default (did you mean '--chain'?)" in unknown.stderr

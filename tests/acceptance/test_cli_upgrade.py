"""``runs upgrade`` and ``runs list --behind`` as a person runs them, after editing
``construct.toml``: the run behind is listed, a dry run says what would change and changes nothing,
the move asks the gate again, a second move has nothing to do; a change to a finished step keeps
the run where it is and says why (exit 1 for the run asked for; the reason per run for ``--all``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.acceptance.test_cli import cli, ok_json

pytestmark = pytest.mark.slow

CHAIN = (
    '[chains.review]\nupgrade = "manual"\n'
    'steps = ["architect", "engineer", { specialist = "reviewer", approve_before = true }]\n'
)


def parked(home: Path) -> str:
    (home / "construct.toml").write_text(CHAIN)
    run_id = str(ok_json(home, "runs", "start", "Build it", "--chain", "review")["run_id"])
    ok_json(home, "runs", "resume", run_id, "--task-id", "architect", "--output", "the design")
    view = ok_json(home, "runs", "resume", run_id, "--task-id", "engineer", "--output", "the code")
    assert view["next_action"]["kind"] == "approve"
    return run_id


def test_a_run_behind_its_edited_chain_is_listed_and_moved(tmp_path: Path) -> None:
    run_id = parked(tmp_path)
    assert cli(tmp_path, "runs", "list", "--behind").stdout.startswith("no live run is on an older version")
    with (tmp_path / "construct.toml").open("a") as config:
        config.write(
            '[specialists.reviewer]\ndescription = "Reviews"\npersona = "You check security first."\n'
        )
    assert run_id in cli(tmp_path, "runs", "list", "--behind").stdout
    said = cli(tmp_path, "runs", "status", run_id).stdout
    assert f"`construct-mcp runs upgrade {run_id}` moves it" in said and "(upgrade = manual)" in said
    before = ok_json(tmp_path, "runs", "status", run_id)
    dry = cli(tmp_path, "runs", "upgrade", run_id, "--dry-run")
    assert (
        dry.returncode == 0
        and "would move" in dry.stdout
        and "gates asked again: before:reviewer" in dry.stdout
    )
    assert dry.stdout.rstrip().endswith(f"next: construct-mcp runs upgrade {run_id}")
    assert ok_json(tmp_path, "runs", "status", run_id) == before
    moved = json.loads(cli(tmp_path, "runs", "upgrade", run_id, "--json").stdout)
    assert moved["moved"] and moved["changed"] == ["reviewer"]
    again = cli(tmp_path, "runs", "upgrade", run_id)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert cli(tmp_path, "runs", "list", "--behind").stdout.startswith("no live run")
    timeline = cli(tmp_path, "runs", "timeline", run_id).stdout
    assert "moved to chain version" in timeline
    # The CLI's user asked for it: named, claimed, as for the outputs it handed in.
    audited = json.loads(cli(tmp_path, "runs", "audit", run_id, "--json").stdout)
    assert [e["action"] for e in audited[:3]] == [
        "started (chain review)",
        "output handed in for architect",
        "output handed in for engineer",
    ]
    assert audited[3]["action"].startswith("moved to chain version ") and len(audited) == 4
    user = audited[1]["by"]
    assert user and [(e["by"], e["verified"]) for e in audited[1:]] == [(user, False)] * 3


def test_a_change_to_a_finished_step_keeps_the_run_and_says_why(tmp_path: Path) -> None:
    run_id = parked(tmp_path)
    with (tmp_path / "construct.toml").open("a") as config:
        config.write('[specialists.architect]\ndescription = "Designs"\npersona = "You design, tersely."\n')
    one = cli(tmp_path, "runs", "upgrade", run_id)
    assert one.returncode == 1 and "stays on its chain" in one.stdout and "architect" in one.stdout
    every = cli(tmp_path, "runs", "upgrade", "--chain", "review", "--all")
    assert every.returncode == 0 and "1 blocked" in every.stdout and f"{run_id} stays:" in every.stdout
    usage = cli(tmp_path, "runs", "upgrade")
    assert usage.returncode == 2 and "--chain NAME --all" in usage.stderr


def test_versions_are_numbered_shown_and_a_run_moves_back_by_number(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(
        CHAIN.replace('upgrade = "manual"', 'upgrade = "manual"\nversion = "2026.1"')
    )
    run_id = str(ok_json(tmp_path, "runs", "start", "Build it", "--chain", "review")["run_id"])
    assert ok_json(tmp_path, "runs", "status", run_id)["chain"]["version"] == 1
    assert (
        "chain review v1 (2026.1): architect -> engineer -> reviewer*"
        in cli(tmp_path, "runs", "status", run_id).stdout
    )
    edited = CHAIN.replace('upgrade = "manual"', 'upgrade = "manual"\nversion = "2026.2"')
    persona = '[specialists.reviewer]\ndescription = "Reviews"\npersona = "You check security first."\n'
    (tmp_path / "construct.toml").write_text(edited + persona)
    listed = cli(tmp_path, "runs", "versions", "review").stdout.splitlines()
    assert [line.split()[0] for line in listed] == ["v1", "v2"], listed
    assert "2026.1" in listed[0] and listed[1].endswith("2026.2  (current)"), listed
    assert "  1 live run  " in listed[0] and "  0 live runs  " in listed[1], listed
    said = cli(tmp_path, "runs", "status", run_id).stdout
    assert "chain: version v1 (2026.1); the configuration's is v2 (upgrade = manual)" in said, said
    moved = json.loads(cli(tmp_path, "runs", "upgrade", run_id, "--json").stdout)
    assert moved["moved"] and (moved["from_version"], moved["to_version"]) == ("v1", "v2")
    dry = cli(tmp_path, "runs", "upgrade", run_id, "--to", "v1", "--dry-run")
    assert dry.returncode == 0 and "would move to version v1 of its chain (from v2)" in dry.stdout, dry.stdout
    assert dry.stdout.rstrip().endswith(f"next: construct-mcp runs upgrade {run_id} --to v1")
    back = json.loads(cli(tmp_path, "runs", "upgrade", run_id, "--to", "1", "--json").stdout)
    assert back["moved"] and back["to_version"] == "v1"
    assert ok_json(tmp_path, "runs", "status", run_id)["chain"]["version"] == 1
    on = {
        row["version"]: row["live_runs"]
        for row in json.loads(cli(tmp_path, "runs", "versions", "review", "--json").stdout)
    }
    assert on == {1: 1, 2: 0}, on
    unknown = cli(tmp_path, "runs", "upgrade", run_id, "--to", "v9")
    assert unknown.returncode != 0 and "no version 9; its versions: v1, v2" in unknown.stderr
    bad = cli(tmp_path, "runs", "upgrade", run_id, "--to", "latest")
    assert bad.returncode == 2 and "--to is 'current' or a version such as v3" in bad.stderr

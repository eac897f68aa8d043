"""Who did what, over real HTTP: two token identities act on runs through a real server over
Streamable HTTP, and ``construct-mcp runs audit`` on the same home names each action's verified
identity, never a token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.harness import call, play_host
from tests.acceptance.test_cli import cli
from tests.acceptance.test_identities import as_identity
from tests.acceptance.test_mcp_http import http_server

pytestmark = pytest.mark.slow

ALICE = "alice-audit-" + "6d1f0b9e3a7c2854"  # read, operate
BOB = "bob-audit-" + "a83c5e07d9f21b64"  # read, operate, approve
CONFIG = f"""
[tokens.alice]
token = "{ALICE}"
roles = ["read", "operate"]

[tokens.bob]
token = "{BOB}"
roles = ["read", "operate", "approve"]
"""


def audit(home: Path, *args: str) -> tuple[list[dict[str, Any]], str]:
    """``runs audit ARGS --json`` on ``home``: the entries, and the text printed."""
    proc = cli(home, "runs", "audit", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    entries: list[dict[str, Any]] = json.loads(proc.stdout)
    return entries, proc.stdout + proc.stderr


async def test_runs_audit_names_the_verified_identity_of_every_action(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG)
    async with (
        http_server(tmp_path, "streamable-http") as port,
        as_identity(port, ALICE) as alice,
        as_identity(port, BOB) as bob,
    ):
        view = await call(alice, "orchestrate_start", request="Audit me.", approve_before=["engineer"])
        gated = view["run_id"]
        view = await play_host(alice, view)  # the architect's output, handed in by alice
        gate = view["next_action"]["gate_id"]
        await call(bob, "orchestrate_approve", run_id=gated, decision="approve", gate_id=gate, wait_seconds=0)
        other = (await call(alice, "orchestrate_start", request="Never mind.", chain=["writer"]))["run_id"]
        await call(bob, "orchestrate_cancel", run_id=other, reason="not needed")

    entries, printed = audit(tmp_path)
    said = [(e["run_id"], e["action"], e["by"], e["verified"], e["channel"]) for e in entries]
    assert said == [
        (gated, "started (chain default)", "alice", True, None),
        (gated, "output handed in for architect", "alice", True, "http"),
        (gated, f"gate {gate} approved", "bob", True, "http"),
        (other, "started (chain custom)", "alice", True, None),
        (other, "cancelled: not needed", "bob", True, "http"),
    ]
    assert [e["at"] for e in entries] == sorted(e["at"] for e in entries)
    assert all(e["at"].endswith("Z") for e in entries)

    mine, by_bob = audit(tmp_path, "--by", "bob")
    assert [(e["run_id"], e["action"]) for e in mine] == [
        (gated, f"gate {gate} approved"),
        (other, "cancelled: not needed"),
    ]
    text = cli(tmp_path, "runs", "audit", other)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == 2 and lines[1].endswith("bob  verified  http"), lines
    for output in (printed, by_bob, text.stdout + text.stderr):
        assert ALICE not in output and BOB not in output

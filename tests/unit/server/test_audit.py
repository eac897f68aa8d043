"""Who did what, when (:mod:`server.views.audit`, ``runs audit``): the actions recorded on runs made
through a real runtime on the memory store, who each names and whether verified, and the
``runs audit`` command on a filesystem home (what each fact records: test_who_asked.py)."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path

from orchestration.core import DecisionChannel, StartRequest
from orchestration.core.facts import (
    ChainUpgraded,
    gate_expired,
)
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.runtime import Runtime
from orchestration.ops.forking import ForkRequest, fork_run
from server.cli.main import run as cli_run
from server.views.audit import chosen, entry_of, read_audit, render_audit
from tests.unit.helpers import make_runtime


async def _hand_in(runtime: Runtime, run_id: str, by: str | None, verified: bool) -> str:
    snap = await runtime.snapshot(run_id)
    assert snap.host_task is not None
    task_id = snap.host_task.task_id
    channel: DecisionChannel = "http" if verified else "stdio"
    await runtime.submit_host_output(
        run_id, task_id, f"the work of {task_id}", by=by, channel=channel, verified=verified
    )
    return task_id


async def _gated_run(runtime: Runtime) -> str:
    """alice starts a run gated before the engineer and hands in the architect's output; bob
    approves the gate."""
    head, _ = await runtime.start(StartRequest("Build it", approve_before=("engineer",), started_by="alice"))
    await _hand_in(runtime, head.run_id, "alice", True)
    head = await runtime.status(head.run_id)
    assert head.status == RunStatus.AWAITING_APPROVAL
    gate = next(g for g in head.gates if g.status == "requested")
    await runtime.approve(head.run_id, "approve", gate.gate_id, None, "bob", channel="http", verified=True)
    return head.run_id


async def test_every_action_names_who_asked_and_whether_it_was_verified() -> None:
    runtime = make_runtime()
    gated = await _gated_run(runtime)
    runtime.clock.advance(60)  # type: ignore[attr-defined]
    other, _ = await runtime.start(StartRequest("Something else"))
    await runtime.cancel(other.run_id, reason="not needed", by="bob", channel="http", verified=True)

    entries = await read_audit(runtime)
    said = [(e.run_id, e.action, e.by, e.how, e.channel) for e in entries]
    assert said == [
        (gated, "started (chain default)", "alice", "verified", None),
        (gated, "output handed in for architect", "alice", "verified", "http"),
        (gated, "gate before:engineer approved", "bob", "verified", "http"),
        (other.run_id, "started (chain default)", None, "-", None),
        (other.run_id, "cancelled: not needed", "bob", "verified", "http"),
    ]
    assert [e.at for e in entries] == sorted(e.at for e in entries)
    # One run, one identity, a window, the newest N.
    assert [e.run_id for e in await read_audit(runtime, other.run_id)] == [other.run_id] * 2
    assert [e.action for e in await read_audit(runtime, by="bob")] == [
        "gate before:engineer approved",
        "cancelled: not needed",
    ]
    since = entries[3].at
    assert [e.run_id for e in await read_audit(runtime, since=since)] == [other.run_id] * 2
    assert await read_audit(runtime, since=since + timedelta(days=1)) == []
    assert [e.action for e in await read_audit(runtime, limit=2)] == [e.action for e in entries[-2:]]

    text = render_audit(entries)
    lines = text.splitlines()
    assert len(lines) == 5
    assert lines[1].startswith(f"{entries[1].at:%Y-%m-%dT%H:%M:%S}Z  {gated}  output handed in for architect")
    assert lines[1].endswith("  alice  verified  http")
    assert lines[3].endswith("  -  -")
    assert render_audit([]) == "no recorded action matches\n"
    data = entries[2].as_json()
    assert data == {
        "at": f"{entries[2].at:%Y-%m-%dT%H:%M:%S}Z",
        "run_id": gated,
        "seq": entries[2].seq,
        "action": "gate before:engineer approved",
        "by": "bob",
        "verified": True,
        "channel": "http",
    }


async def test_a_fork_is_listed_with_who_forked_and_without_the_facts_it_copied() -> None:
    runtime = make_runtime()
    source = await _gated_run(runtime)
    head, _ = await fork_run(runtime, ForkRequest(source, "engineer", started_by="carol"))
    forked = await read_audit(runtime, head.run_id)
    assert [(e.action, e.by, e.verified) for e in forked] == [
        (f"forked from {source} at engineer", "carol", True),
    ]


async def test_expiry_and_policy_are_listed_as_the_system_that_acted() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("Build it", approve_before=("architect",)))
    gate = next(g for g in head.gates if g.status == "requested")
    expired = entry_of(
        head.run_id, gate_expired(head, gate.gate_id, "reject", head.last_seq + 1, head.updated_at)
    )
    assert expired is not None
    assert (expired.action, expired.by, expired.how, expired.channel) == (
        f"gate {gate.gate_id} rejected",
        "expiry",
        "system",
        "expiry",
    )
    moved = ChainUpgraded(
        seq=head.last_seq + 1,
        at=head.updated_at,
        from_hash="a" * 64,
        to_hash="b" * 64,
        chain=head.chain,
        by="policy",
        reason="at_boundary",
    )
    entry = entry_of(head.run_id, moved)
    assert entry is not None and (entry.by, entry.how) == ("policy", "system")
    assert entry.action == f"moved to chain version {'b' * 12} (from {'a' * 12})"


def test_runs_audit_lists_what_the_cli_did_as_claimed_by_its_user(tmp_path: Path) -> None:
    home = ["--home", str(tmp_path)]
    out = io.StringIO()
    assert cli_run(["runs", "start", "x", *home, "--json", "--quiet"], out) == 0
    run_id = json.loads(out.getvalue())["run_id"]
    assert (
        cli_run(
            ["runs", "resume", run_id, "--task-id", "architect", "--output", "a plan", *home, "--json"],
            io.StringIO(),
        )
        == 0
    )
    assert cli_run(["runs", "cancel", run_id, "--reason", "enough", *home, "--json"], io.StringIO()) == 0
    out = io.StringIO()
    assert cli_run(["runs", "audit", *home, "--json"], out) == 0
    data = json.loads(out.getvalue())
    assert [(d["action"], d["verified"], d["channel"]) for d in data] == [
        ("started (chain default)", False, None),
        ("output handed in for architect", False, "cli"),
        ("cancelled: enough", False, "cli"),
    ]
    user = data[1]["by"]
    assert user and data[2]["by"] == user and data[0]["by"] is None
    out = io.StringIO()
    assert cli_run(["runs", "audit", run_id, "--by", user, "--limit", "1", *home], out) == 0
    (line,) = out.getvalue().splitlines()
    assert line.endswith(f"cancelled: enough  {user}  claimed  cli")
    assert cli_run(["runs", "audit", *home, "--since", "yesterday"]) == 2
    assert chosen([], limit=3) == []

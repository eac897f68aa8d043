"""Who asked for a host task's output and for a cancel is recorded on the fact, as a gate decision
records its approver: a verified identity over HTTP (tests/acceptance/test_audit.py), nobody over
stdio, the OS user (claimed) from the CLI. A fact that names nobody is stored exactly as before
(no new record format)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

from mcp import Client

from orchestration.core import StartRequest
from orchestration.core.facts import HostOutputSubmitted, RunCancelled, dump_fact, parse_fact
from server.app import ConstructApp
from server.cli.main import run as cli_run
from server.settings.config import load_settings
from stores.filesystem import FilesystemStore
from tests.unit.helpers import make_runtime

NOW = datetime(2026, 12, 6, 9, 30, tzinfo=UTC)


def test_who_asked_is_left_out_of_a_fact_that_names_nobody() -> None:
    plain = HostOutputSubmitted(seq=3, at=NOW, task_id="a", attempt=1, output_sha256="x", output_chars=1)
    assert not {"by", "channel", "verified"} & json.loads(dump_fact(plain)).keys()
    cancel = RunCancelled(seq=4, at=NOW, reason="r", cancelled_by="bob")
    assert not {"channel", "verified"} & json.loads(dump_fact(cancel)).keys()
    named = plain.model_copy(update={"by": "alice", "channel": "http", "verified": True})
    assert parse_fact(dump_fact(named)) == named
    assert parse_fact(dump_fact(plain)) == plain
    assert named.format == plain.format == 1


async def test_the_runtime_records_who_handed_in_and_who_cancelled() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("x"))
    await runtime.submit_host_output(
        head.run_id, "architect", "a plan", by="alice", channel="http", verified=True
    )
    await runtime.cancel(head.run_id, reason="enough", by="bob", channel="http", verified=True)
    facts = await runtime.read_facts(head.run_id)
    (handed,) = [f for f in facts if isinstance(f, HostOutputSubmitted)]
    (cancelled,) = [f for f in facts if isinstance(f, RunCancelled)]
    assert (handed.by, handed.channel, handed.verified) == ("alice", "http", True)
    assert (cancelled.cancelled_by, cancelled.channel, cancelled.verified) == ("bob", "http", True)


def _facts(home: Path, run_id: str) -> dict[str, dict[str, object]]:
    """The run's facts by type, as ``runs timeline --json`` prints them."""
    out = io.StringIO()
    assert cli_run(["runs", "timeline", run_id, "--home", str(home), "--json"], out) == 0
    return {f["type"]: f for f in json.loads(out.getvalue())["facts"]}


async def test_over_stdio_the_facts_name_nobody_and_say_the_channel(tmp_path: Path) -> None:
    settings = load_settings(env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_POLL_SECONDS": "0.1"})
    async with Client(ConstructApp(settings).build_server()) as client:
        started = await client.call_tool("orchestrate_start", {"request": "in process"})
        assert started.structured_content is not None
        run_id = started.structured_content["run_id"]
        handed_in = {"run_id": run_id, "task_id": "architect", "output": "plan", "wait_seconds": 0}
        assert not (await client.call_tool("orchestrate_resume", handed_in)).is_error
        assert not (await client.call_tool("orchestrate_cancel", {"run_id": run_id})).is_error
    facts = await FilesystemStore(tmp_path).read_facts(run_id)
    (handed,) = [f for f in facts if isinstance(f, HostOutputSubmitted)]
    (cancelled,) = [f for f in facts if isinstance(f, RunCancelled)]
    assert (handed.by, handed.channel, handed.verified) == (None, "stdio", False)
    assert (cancelled.cancelled_by, cancelled.channel, cancelled.verified) == (None, "stdio", False)


def test_the_cli_records_its_user_as_claimed(tmp_path: Path) -> None:
    home = ["--home", str(tmp_path)]
    out = io.StringIO()
    assert cli_run(["runs", "start", "x", *home, "--json", "--quiet"], out) == 0
    run_id = json.loads(out.getvalue())["run_id"]
    resume = ["runs", "resume", run_id, "--task-id", "architect", "--output", "a plan", *home, "--json"]
    assert cli_run(resume, io.StringIO()) == 0
    assert cli_run(["runs", "cancel", run_id, *home, "--json"], io.StringIO()) == 0
    facts = _facts(tmp_path, run_id)
    handed, cancelled = facts["host_output_submitted"], facts["run_cancelled"]
    assert handed["by"] and (handed["channel"], handed.get("verified")) == ("cli", None)
    assert cancelled["cancelled_by"] == handed["by"]
    assert (cancelled["channel"], cancelled.get("verified")) == ("cli", None)

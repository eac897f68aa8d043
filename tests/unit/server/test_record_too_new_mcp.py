"""A run written by a newer version, as a host sees it through the MCP tools (issue 9, §6): the server
(in process, on a filesystem store) answers ``record_too_new`` naming the run and both record
formats, leaves the run out of ``runs_list``, goes on serving other runs, and never rewrites the
record, though its dispatcher finds the run queued at startup."""

from __future__ import annotations

import json
from pathlib import Path

from mcp import Client

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.models import RECORD_FORMAT
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from server.app import ConstructApp
from server.settings.config import load_settings
from stores.filesystem import FilesystemStore
from tests.acceptance.harness import call, call_error

RUN_FILES = ("head.json", "facts.jsonl", "facts.idx")


async def test_run_status_says_record_too_new_and_the_run_is_left_alone(tmp_path: Path) -> None:
    # A queued run, its head then replaced by what a newer version would write.
    store = FilesystemStore(tmp_path)
    head, _ = await Runtime(store, Catalog.builtin(), settings=RuntimeSettings(owner="setup")).start(
        StartRequest("written by a newer version", chain=("writer",))
    )
    await store.close()
    run_id, run_dir = head.run_id, tmp_path / "runs" / head.run_id
    record = json.loads((run_dir / "head.json").read_bytes())
    record |= {"format": RECORD_FORMAT + 1, "lanes": ["main"]}
    (run_dir / "head.json").write_text(json.dumps(record, separators=(",", ":")))
    before = {name: (run_dir / name).read_bytes() for name in RUN_FILES}

    settings = load_settings(
        env={
            "CONSTRUCT_HOME": str(tmp_path),
            "CONSTRUCT_POLL_SECONDS": "0.1",
            "CONSTRUCT_PID_FILE": str(tmp_path / "server.pid"),
        }
    )
    async with Client(ConstructApp(settings).build_server()) as client:
        for tool, arguments in (
            ("run_status", {}),
            ("orchestrate_resume", {"wait_seconds": 0}),
            ("orchestrate_cancel", {}),
        ):
            text = await call_error(client, tool, run_id=run_id, **arguments)
            assert text.startswith(f"record_too_new: run {run_id}: "), (tool, text)
            assert f"record format {RECORD_FORMAT + 1}" in text, text
            assert f"record formats up to {RECORD_FORMAT}" in text, text
        fresh = await call(client, "orchestrate_start", request="a run of this version", chain=["writer"])
        listed = [run["run_id"] for run in (await call(client, "runs_list"))["runs"]]
        assert listed == [fresh["run_id"]]

    assert {name: (run_dir / name).read_bytes() for name in RUN_FILES} == before

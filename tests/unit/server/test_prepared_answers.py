"""A host's answer built while its write is under way (``server.mcp.shown_runs.ShownRuns.build``: in flight
on a store whose writes are made elsewhere, Postgres; flushing on a store that says when, SQLite
and files): what the host receives is the answer a fresh read of the run gives, call after call,
and the next call still starts from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from orchestration.engine import Written
from server.app import ConstructApp
from server.mcp.shown_runs import ShownRuns
from server.settings.config import load_settings
from tests.acceptance.store_targets import store_target

TASKS = ["architect", "engineer", "reviewer"]


async def _call(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error and result.structured_content is not None, result.content
    text = result.content[0].text  # type: ignore[union-attr]
    return text, result.structured_content


#: store -> whether a start's answer is built during its create (a keyed create is one statement on
#: Postgres too: migration 0012), then each resume's
PREPARED = {
    "postgres": [True, True, True, True],
    "sqlite": [True, True, True, True],
    "filesystem": [True, True, True, True],
}


@pytest.mark.parametrize("store", list(PREPARED))
async def test_answers_built_during_the_write_are_those_a_read_gives(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[bool] = []
    keep = ShownRuns.keep

    def counted(self: ShownRuns, written: Written, built: object) -> None:
        used.append(built is not None)
        keep(self, written, built)

    monkeypatch.setattr(ShownRuns, "keep", counted)
    async with store_target(store, tmp_path) as target:
        env = {"CONSTRUCT_HOME": str(tmp_path / "home"), "CONSTRUCT_ORCHESTRATION_STORE": target.url}
        app = ConstructApp(load_settings(env={**env, "CONSTRUCT_STORE_FALLBACK": "false"}))
        async with Client(app.build_server()) as client:
            _, view = await _call(client, "orchestrate_start", {"request": "Build it", "chain": TASKS})
            run_id = view["run_id"]
            for task in TASKS:
                assert view["next_action"]["task_id"] == task
                arguments = {"run_id": run_id, "task_id": task, "output": f"the {task}'s work"}
                text, view = await _call(client, "orchestrate_resume", arguments)
                # A second server on the store builds the view from a read of the record.
                reader = ConstructApp(load_settings(env={**env, "CONSTRUCT_HOME": str(tmp_path / "r")}))
                async with Client(reader.build_server()) as other:
                    read_text, read = await _call(other, "run_status", {"run_id": run_id})
                assert view == read and text == read_text
            assert view["status"] == "completed"
    assert used == PREPARED[store]  # each answer was the one built during its write

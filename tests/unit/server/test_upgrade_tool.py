"""``orchestrate_upgrade`` as a host calls it: a server restarted with a changed chain answers a dry
run with what would change, moves the run on ``dry_run: false`` (the gate on the changed step is
asked again, and the run's answer then hands out the new persona), and refuses with
``upgrade_blocked`` a move that would reinterpret a finished step, changing nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import Client

from server.app import ConstructApp
from server.settings.config import load_settings

CHAIN = (
    '[chains.review]\nupgrade = "manual"\n'
    'steps = ["architect", "engineer", { specialist = "reviewer", approve_before = true }]\n'
)
CHECKLIST = "You review every change against the security checklist first."


@asynccontextmanager
async def served(home: Path, config: str) -> AsyncIterator[Client]:
    path = home / "construct.toml"
    path.write_text(config)
    env = {"CONSTRUCT_HOME": str(home)}
    async with Client(ConstructApp(load_settings(env=env, config_file=path)).build_server()) as client:
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error and result.structured_content is not None, result.content
    return dict(result.structured_content)


async def error(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    text = result.content[0].text  # type: ignore[union-attr]
    assert isinstance(text, str)
    return text


async def parked(home: Path) -> str:
    async with served(home, CHAIN) as client:
        view = await call(client, "orchestrate_start", request="Build it", chain="review")
        run_id = view["run_id"]
        await call(client, "orchestrate_resume", run_id=run_id, task_id="architect", output="design")
        view = await call(client, "orchestrate_resume", run_id=run_id, task_id="engineer", output="code")
        assert view["next_action"]["kind"] == "approve"
        return str(run_id)


async def test_a_dry_run_says_what_changes_and_the_move_asks_the_gate_again(tmp_path: Path) -> None:
    run_id = await parked(tmp_path)
    changed = CHAIN + f'[specialists.reviewer]\ndescription = "Reviews"\npersona = "{CHECKLIST}"\n'
    async with served(tmp_path, changed) as client:
        before = await call(client, "run_status", run_id=run_id)
        assert before["behind"]["verdict"] == "would_move" and before["behind"]["upgrade"] == "manual"
        dry = await call(client, "orchestrate_upgrade", run_id=run_id)
        assert dry["verdict"] == "would_move" and dry["changed"] == ["reviewer"]
        assert dry["to_version"] == before["behind"]["current_version"]
        assert dry["gates_asked_again"] == ["before:reviewer"] and "dry_run false" in dry["next"]
        assert await call(client, "run_status", run_id=run_id) == before
        moved = await call(client, "orchestrate_upgrade", run_id=run_id, dry_run=False)
        assert moved["verdict"] == "moved" and moved["to_version"] == dry["to_version"]
        assert "behind" not in await call(client, "run_status", run_id=run_id)
        again = await call(client, "orchestrate_upgrade", run_id=run_id, dry_run=False)
        assert again["verdict"] == "current"
        view = await call(
            client, "orchestrate_approve", run_id=run_id, decision="approve", gate_id="before:reviewer"
        )
        assert view["next_action"]["kind"] == "run_host_task"
        assert CHECKLIST in view["next_action"]["system_prompt"]
        events = await call(client, "run_events", run_id=run_id)
        assert any(e["type"] == "chain_upgraded" for e in events["events"])


async def test_a_move_that_would_reinterpret_a_finished_step_is_refused(tmp_path: Path) -> None:
    run_id = await parked(tmp_path)
    changed = CHAIN + '[specialists.architect]\ndescription = "Designs"\npersona = "You design, tersely."\n'
    async with served(tmp_path, changed) as client:
        before = await call(client, "run_status", run_id=run_id)
        # The run says why it stays on its version, where a host reads it.
        assert before["behind"]["verdict"] == "blocked" and "architect" in before["behind"]["reason"]
        dry = await call(client, "orchestrate_upgrade", run_id=run_id)
        assert dry["verdict"] == "blocked" and dry["blocked_step"] == "architect"
        said = await error(client, "orchestrate_upgrade", run_id=run_id, dry_run=False)
        assert said.startswith("upgrade_blocked:") and "architect" in said
        assert await call(client, "run_status", run_id=run_id) == before


async def test_to_names_a_kept_version_and_the_run_view_names_its_own(tmp_path: Path) -> None:
    run_id = await parked(tmp_path)
    changed = CHAIN + f'[specialists.reviewer]\ndescription = "Reviews"\npersona = "{CHECKLIST}"\n'
    async with served(tmp_path, changed) as client:
        before = await call(client, "run_status", run_id=run_id, detail="full")
        assert before["chain"]["version"] == 1 and before["behind"]["current_version"] == "v2"
        moved = await call(client, "orchestrate_upgrade", run_id=run_id, to="v2", dry_run=False)
        assert (moved["verdict"], moved["from_version"], moved["to_version"]) == ("moved", "v1", "v2")
        back = await call(client, "orchestrate_upgrade", run_id=run_id, to="1", dry_run=False)
        assert (back["verdict"], back["to_version"]) == ("moved", "v1")
        after = await call(client, "run_status", run_id=run_id, detail="full")
        assert after["chain"]["version"] == 1 and after["behind"]["current_version"] == "v2"
        said = await error(client, "orchestrate_upgrade", run_id=run_id, to="v5")
        assert said.startswith("unknown_chain:") and "its versions: v1, v2" in said
        said = await error(client, "orchestrate_upgrade", run_id=run_id, to="newest")
        assert said.startswith("invalid_argument:") and "'current' or a version" in said

"""A run's move to another chain version survives SIGKILL, on every persistent store: a server
restarted with a changed reviewer persona moves a run parked at the reviewer's gate
(``orchestrate_upgrade``) and kills itself right after that write (the move is one write, with the
gate asked again); the next server finds the run wholly moved — one ``chain_upgraded``, the gate
asked once on the new chain, nothing to move again — and the run ends as an uninterrupted one does,
the reviewer's prompt carrying the new persona."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from tests.acceptance.harness import call, read_log, stdio_client_for
from tests.acceptance.store_targets import BACKENDS, StoreTarget, store_target

pytestmark = pytest.mark.slow

CHAIN = (
    '[chains.review]\nupgrade = "manual"\n'
    'steps = ["architect", "engineer", { specialist = "reviewer", approve_before = true }]\n'
)
CHECKLIST = "You review every change against the security checklist first."
CHANGED = CHAIN + f'[specialists.reviewer]\ndescription = "Reviews"\npersona = "{CHECKLIST}"\n'


def env_with(target: StoreTarget, home: Path, config: str, **extra: str) -> dict[str, str]:
    env = target.env(home, **extra)
    (home / "construct.toml").write_text(config)
    return env


async def parked(client: Client) -> str:
    view = await call(client, "orchestrate_start", request="Build it", chain="review", idempotency_key="k")
    run_id = str(view["run_id"])
    await call(client, "orchestrate_resume", run_id=run_id, task_id="architect", output="the design")
    view = await call(client, "orchestrate_resume", run_id=run_id, task_id="engineer", output="the code")
    assert view["next_action"]["kind"] == "approve", view
    return run_id


async def finish(client: Client, run_id: str) -> dict[str, Any]:
    view = await call(
        client, "orchestrate_approve", run_id=run_id, decision="approve", gate_id="before:reviewer"
    )
    assert CHECKLIST in view["next_action"]["system_prompt"]
    return await call(client, "orchestrate_resume", run_id=run_id, task_id="reviewer", output="approved")


def shapes(facts: list[Any]) -> list[tuple[str, str | None]]:
    return [(f.type, getattr(f, "task_id", None) or getattr(f, "gate_id", None)) for f in facts]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_move_killed_right_after_its_write_is_wholly_there_after_a_restart(
    backend: str, tmp_path: Path
) -> None:
    async with store_target(backend, tmp_path / "reference") as target:
        async with stdio_client_for(env_with(target, tmp_path / "r1", CHAIN), tmp_path / "r1.log") as client:
            run_id = await parked(client)
        async with stdio_client_for(
            env_with(target, tmp_path / "r2", CHANGED), tmp_path / "r2.log"
        ) as client:
            assert (await call(client, "orchestrate_upgrade", run_id=run_id, dry_run=False))[
                "verdict"
            ] == "moved"
            assert (await finish(client, run_id))["status"] == "completed"
        [(_, reference)] = await target.runs()

    async with store_target(backend, tmp_path / "killed") as target:
        async with stdio_client_for(env_with(target, tmp_path / "k1", CHAIN), tmp_path / "k1.log") as client:
            run_id = await parked(client)
        # This server's first write is the move: it SIGKILLs itself right after it, mid-call.
        killing = env_with(target, tmp_path / "k2", CHANGED, CONSTRUCT_FAULT_CRASH_AFTER_WRITES="1")
        with pytest.raises(Exception):  # noqa: B017 - the connection dies with the server
            async with stdio_client_for(killing, tmp_path / "k2.log") as client:
                await call(client, "orchestrate_upgrade", run_id=run_id, dry_run=False)
        [(head, facts)] = await target.runs()
        assert [f.type for f in facts].count("chain_upgraded") == 1, read_log(tmp_path / "k2.log")
        assert head.chain_moved and shapes(facts)[-2:] == [
            ("chain_upgraded", None),
            ("approval_requested", "before:reviewer"),
        ]
        async with stdio_client_for(
            env_with(target, tmp_path / "k3", CHANGED), tmp_path / "k3.log"
        ) as client:
            again = await call(client, "orchestrate_upgrade", run_id=run_id, dry_run=False)
            assert again["verdict"] == "current"  # nothing to move twice
            assert (await finish(client, run_id))["status"] == "completed"
        [(_, got)] = await target.runs()
    assert shapes(got) == shapes(reference)

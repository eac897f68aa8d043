"""The built-in ``research`` chain through the MCP tools (the official client, in process), on
every store, with the inline backend: the three researchers wait for the host at once; the host
answers them at once, from parallel workers; racing answers for different tasks all land, and of
racing answers for the same task exactly one does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestration.core.facts import HostTaskPrepared, TaskCompleted
from tests.acceptance.harness import call, text_of
from tests.acceptance.test_retried_calls import STORES, outputs, served
from tests.unit.parallel import RESEARCHERS


def waiting(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [view["next_action"], *view["more_actions"]]


@pytest.mark.parametrize("backend", STORES)
async def test_three_host_tasks_at_once_answered_at_once(backend: str, tmp_path: Path) -> None:
    async with served(backend, tmp_path) as (client, store):
        view = await call(client, "orchestrate_start", request="Should we adopt X?", chain="research")
        run_id = view["run_id"]
        assert view["status"] == "awaiting_host" and view["status_kind"] == "paused"
        items = waiting(view)
        # Every ready task, each with its prompts (the longest in parts, when the three do not fit
        # in one answer: read with task_prompt) and the exact call to make.
        assert [i["task_id"] for i in items] == list(RESEARCHERS)
        for item in items:
            if item["kind"] == "read_prompt":
                assert item["tool"] == "task_prompt"
                assert item["arguments"] == {"run_id": run_id, "task_id": item["task_id"], "offset": 0}
                continue
            assert item["kind"] == "run_host_task" and item["user_prompt"]
            assert item["tool"] == "orchestrate_resume"
            assert item["arguments"] == {"run_id": run_id, "task_id": item["task_id"]}

        # The host's three workers answer at once; the answers race, and every one lands.
        async def answer(task_id: str) -> None:
            await call(
                client, "orchestrate_resume", run_id=run_id, task_id=task_id, output=f"found {task_id}"
            )

        async with anyio.create_task_group() as tg:
            for task_id in RESEARCHERS:
                tg.start_soon(answer, task_id)
        view = await call(client, "run_status", run_id=run_id, wait_seconds=5)
        assert view["next_action"]["kind"] == "run_host_task", view["next_action"]
        assert view["next_action"]["task_id"] == "writer" and "more_actions" not in view
        for task_id in RESEARCHERS:
            assert f"### {task_id} (researcher)\n\nfound {task_id}" in view["next_action"]["user_prompt"]

        # Two workers answer the writer's task at once with different outputs: exactly one lands.
        results: list[Any] = []

        async def write(text: str) -> None:
            results.append(
                await client.call_tool(
                    "orchestrate_resume", {"run_id": run_id, "task_id": "writer", "output": text}
                )
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(write, "report A")
            tg.start_soon(write, "report B")
        landed = [r for r in results if not r.is_error]
        refused = [r for r in results if r.is_error]
        assert len(landed) == 1 and len(refused) == 1, [text_of(r) for r in results]
        assert "conflict" in text_of(refused[0]) and "already done" in text_of(refused[0])
        view = await call(client, "run_status", run_id=run_id, wait_seconds=5)
        assert view["status"] == "completed", view
        recorded = await outputs(client, store, run_id)
        assert recorded["writer"] in ("report A", "report B")
        assert {t: recorded[t] for t in RESEARCHERS} == {t: f"found {t}" for t in RESEARCHERS}
        if store is not None:
            facts = await store.read_facts(run_id)
            completed = [f.task_id for f in facts if isinstance(f, TaskCompleted)]
            assert sorted(completed) == sorted([*RESEARCHERS, "writer"])
            prepared = [f.task_id for f in facts if isinstance(f, HostTaskPrepared)]
            assert sorted(prepared) == sorted([*RESEARCHERS, "writer"])


@pytest.mark.parametrize("backend", STORES)
async def test_the_same_answer_sent_twice_at_once_is_recorded_once(backend: str, tmp_path: Path) -> None:
    async with served(backend, tmp_path) as (client, store):
        view = await call(client, "orchestrate_start", request="Should we adopt X?", chain="research")
        run_id = view["run_id"]

        async def answer(task_id: str) -> None:
            await call(
                client, "orchestrate_resume", run_id=run_id, task_id=task_id, output=f"found {task_id}"
            )

        async with anyio.create_task_group() as tg:
            for task_id in (*RESEARCHERS, *RESEARCHERS):
                tg.start_soon(answer, task_id)
        view = await call(client, "run_status", run_id=run_id, wait_seconds=5)
        assert view["next_action"]["task_id"] == "writer"
        if store is not None:
            facts = await store.read_facts(run_id)
            completed = [f.task_id for f in facts if isinstance(f, TaskCompleted)]
            assert sorted(completed) == sorted(RESEARCHERS)

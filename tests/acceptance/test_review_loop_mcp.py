"""The built-in ``review-loop`` chain through the MCP tools (the official client, in process), on
every store, with the inline backend: the host answers every task, the reviewer's as verdict JSON.

revise -> the work goes back to the engineer (task ``engineer~2``, whose prompt carries the
reviewer's notes) -> approve -> the run completes; and three revisions -> the loop is exhausted and
a human decides at the gate ``exhausted:reviewer~3``, whose description is the loop's history.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import TextResourceContents

from orchestration.core.facts import RouteDecided
from tests.acceptance.harness import call, full_view
from tests.acceptance.test_retried_calls import STORES, served


def verdict(value: str, notes: str) -> str:
    return json.dumps({"verdict": value, "notes": notes})


async def answer(client: Client, view: dict[str, Any], task_id: str, output: str) -> dict[str, Any]:
    action = view["next_action"]
    assert action["kind"] == "run_host_task" and action["task_id"] == task_id, action
    return await call(
        client, "orchestrate_resume", run_id=view["run_id"], task_id=task_id, output=output, wait_seconds=5
    )


@pytest.mark.parametrize("backend", STORES)
async def test_revise_then_approve_goes_round_the_loop_once(backend: str, tmp_path: Path) -> None:
    async with served(backend, tmp_path) as (client, store):
        view = await call(client, "orchestrate_start", request="A URL shortener", chain="review-loop")
        run_id = view["run_id"]
        view = await answer(client, view, "architect", "Design: a hash table behind an HTTP API.")
        view = await answer(client, view, "engineer", "Code v1 (no tests).")
        reviewer_prompt = view["next_action"]["user_prompt"]
        assert view["next_action"]["output_schema"]["required"] == ["verdict", "notes"]
        assert "'revise' sends the work to engineer" in reviewer_prompt
        view = await answer(client, view, "reviewer", verdict("revise", "Add tests for empty URLs."))

        # Round 2: a new task instance, whose prompt carries the notes that sent the work back.
        action = view["next_action"]
        assert action["task_id"] == "engineer~2", action
        assert "## Sent back by reviewer (round 1, task reviewer)" in action["user_prompt"]
        assert "Add tests for empty URLs." in action["user_prompt"]
        assert "Design: a hash table" in action["user_prompt"]
        view = await answer(client, view, "engineer~2", "Code v2 with tests.")
        assert "Code v2 with tests." in view["next_action"]["user_prompt"]
        view = await answer(client, view, "reviewer~2", verdict("approve", "Good."))

        assert view["status"] == "completed", view
        record = await full_view(client, run_id)
        assert [(t["task_id"], t["step"], t["visit"]) for t in record["tasks"]] == [
            ("architect", "architect", 1),
            ("engineer", "engineer", 1),
            ("reviewer", "reviewer", 1),
            ("engineer~2", "engineer", 2),
            ("reviewer~2", "reviewer", 2),
        ]
        assert [(r["task_id"], r["value"], r["target"], r["next_task_id"]) for r in record["routes"]] == [
            ("reviewer", "revise", "engineer", "engineer~2"),
            ("reviewer~2", "approve", "end", None),
        ]
        # An instance's output has its own URI.
        [contents] = (await client.read_resource(f"run://{run_id}/tasks/engineer~2/output")).contents
        assert isinstance(contents, TextResourceContents) and contents.text == "Code v2 with tests."
        if store is not None:
            routes = [f for f in await store.read_facts(run_id) if isinstance(f, RouteDecided)]
            assert [(r.task_id, r.applied) for r in routes] == [
                ("reviewer", "engineer"),
                ("reviewer~2", "end"),
            ]
            assert (await store.load(run_id)).format == 2


@pytest.mark.parametrize("backend", STORES)
async def test_an_exhausted_loop_asks_a_human_with_its_history(backend: str, tmp_path: Path) -> None:
    async with served(backend, tmp_path) as (client, _):
        view = await call(client, "orchestrate_start", request="A URL shortener", chain="review-loop")
        run_id = view["run_id"]
        view = await answer(client, view, "architect", "Design.")
        for n, suffix in ((1, ""), (2, "~2"), (3, "~3")):
            view = await answer(client, view, f"engineer{suffix}", f"Code v{n}.")
            view = await answer(
                client, view, f"reviewer{suffix}", verdict("revise", f"Still wrong, round {n}.")
            )
        action = view["next_action"]
        assert action["kind"] == "approve" and action["gate_id"] == "exhausted:reviewer~3", action
        for n, task_id in ((1, "reviewer"), (2, "reviewer~2"), (3, "reviewer~3")):
            assert (
                f"round {n} ({task_id}): verdict=revise, notes: Still wrong, round {n}." in action["guards"]
            )
        done = await call(
            client,
            "orchestrate_approve",
            run_id=run_id,
            decision="approve",
            gate_id="exhausted:reviewer~3",
            wait_seconds=5,
        )
        assert done["status"] == "completed", done
        assert [t["task_id"] for t in done["tasks"]][-2:] == ["engineer~3", "reviewer~3"]

"""Every answer fits in ``max_answer_chars``, whatever a run holds: a compact answer of a run of
many tasks shrinks its tasks (previews first, then done tasks counted), and ``runs_list`` and
``run_events`` hold as many whole items as fit, naming the call for the rest."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from orchestration.core import RunStatus
from server.app import ConstructApp
from server.settings.config import load_settings
from server.views.events import Event, EventsPage
from server.views.fitted_pages import fitted_events
from server.views.parts import TASKS_READ, fitted

STEPS = 50  # the most a chain has

#: the built-in specialists with short personas: a long prompt's first part carries its persona
#: whole, and the built-in ones need a bound of about 4,200 characters (checked at start)
SHORT_PERSONAS = "".join(
    f'[specialists.{name}]\ndescription = "{name}"\npersona = "You are the {name}."\n'
    for name in ("architect", "engineer", "researcher", "reviewer", "tester", "writer")
)


@asynccontextmanager
async def connected(home: Path, bound: int) -> AsyncIterator[Client]:
    config = home / "construct.toml"
    steps = ", ".join(f'{{ name = "s{i}", specialist = "writer" }}' for i in range(STEPS))
    config.write_text(f"[chains.long]\nsteps = [{steps}]\n" + SHORT_PERSONAS)
    env = {"CONSTRUCT_HOME": str(home), "CONSTRUCT_MAX_ANSWER_CHARS": str(bound)}
    async with Client(ConstructApp(load_settings(env=env, config_file=config)).build_server()) as client:
        yield client


async def answer(client: Client, tool: str, arguments: dict[str, Any], bound: int) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    text = result.content[0].text  # type: ignore[union-attr]
    assert len(text) <= bound, (tool, arguments, len(text))
    assert isinstance(result.structured_content, dict)
    if "next_action" in result.structured_content:
        assert text.startswith('{"next_action":{"kind":'), text[:80]
    return result.structured_content


def output(task_id: str, chars: int = 400) -> str:
    piece = f'{task_id}: "quoted" \\ back\nslash — ünïcødé 🙂 '
    return (piece * (chars // len(piece) + 1))[:chars]


async def long_run(client: Client, bound: int) -> dict[str, Any]:
    """A run of the 50-step chain driven to its end, every answer within ``bound``; its last answer."""
    view = await answer(client, "orchestrate_start", {"request": "Write it up", "chain": "long"}, bound)
    while view["next_action"]["kind"] != "none":
        task_id = view["next_action"]["task_id"]
        arguments = {"run_id": view["run_id"], "task_id": task_id, "output": output(task_id)}
        view = await answer(client, "orchestrate_resume", arguments, bound)
    return view


@pytest.mark.parametrize("bound", [2_000, 4_000, 10_000, 20_000])
async def test_a_run_of_many_tasks_answers_within_the_bound(tmp_path: Path, bound: int) -> None:
    async with connected(tmp_path, bound) as client:
        view = await long_run(client, bound)
        status = await answer(client, "run_status", {"run_id": view["run_id"]}, bound)
    assert status == view
    left_out = view.get("tasks_left_out", {"count": 0, "statuses": {}})
    assert len(view["tasks"]) + left_out["count"] == STEPS
    assert sum(left_out["statuses"].values()) == left_out["count"]
    # 50 done tasks are about 15,000 characters with their previews, 5,500 without.
    if bound < 5_500:
        assert left_out == {"count": STEPS, "statuses": {"done": STEPS}, "read": TASKS_READ}
    elif bound < 15_000:
        assert left_out["count"] == 0 and all("output_preview" not in t for t in view["tasks"])
    else:
        assert left_out["count"] == 0 and all("output_preview" in t for t in view["tasks"])


def _compact(tasks: int, waiting: int) -> dict[str, Any]:
    """A compact answer's data: ``tasks`` tasks, the last ``waiting`` awaiting the host (with a
    short prompt), the others done with 200-character previews."""
    done = tasks - waiting
    return {
        "next_action": {
            "kind": "run_host_task",
            "tool": "orchestrate_resume",
            "arguments": {"run_id": "run-x", "task_id": f"t{done}"},
            "task_id": f"t{done}",
            "specialist": "writer",
            "system_prompt": "You write.",
            "user_prompt": "Write it up.",
            "instruction": "Run it.",
        },
        "run_id": "run-x",
        "status": "awaiting_host",
        "status_kind": "paused",
        "tasks": [
            {
                "task_id": f"t{i}",
                "status": "done",
                "output_preview": output(f"t{i}", 200),
                "output_chars": 400,
            }
            for i in range(done)
        ]
        + [{"task_id": f"t{i}", "status": "awaiting_host"} for i in range(done, tasks)],
        "costs": {"input_tokens": 1},
    }


@pytest.mark.parametrize("bound", [2_000, 3_000, 5_000, 10_000, 20_000, 40_000])
def test_the_tasks_shrink_a_step_at_a_time_until_the_answer_fits(bound: int) -> None:
    data = _compact(200, 3)
    text, fit = fitted(data, bound)
    assert len(text) <= bound and json.loads(text) == fit
    assert text.startswith('{"next_action":{"kind":"run_host_task"')  # its short prompt stays whole
    left = fit.get("tasks_left_out", {"count": 0, "statuses": {}})
    shown = ["tasks_left_out"] if left["count"] else []
    assert list(fit) == ["next_action", "run_id", "status", "status_kind", "tasks", *shown, "costs"]
    assert len(fit["tasks"]) + left["count"] == 200
    # Previews go first, then done tasks: the tasks awaiting the host are the last to go.
    assert all("output_preview" not in t for t in fit["tasks"])
    assert [t["task_id"] for t in fit["tasks"]][-3:] == ["t197", "t198", "t199"]
    assert set(left["statuses"]) <= {"done"}
    assert data == _compact(200, 3)  # not changed


def test_an_answer_that_fits_without_previews_keeps_every_task() -> None:
    data = _compact(40, 1)
    bare = [{k: v for k, v in t.items() if k != "output_preview"} for t in data["tasks"]]
    bound = len(json.dumps(data | {"tasks": bare}, separators=(",", ":"), ensure_ascii=False)) + 10
    text, fit = fitted(data, bound)
    assert fit["tasks"] == bare and "tasks_left_out" not in fit
    assert fitted(data, len(text) - 1)[1]["tasks_left_out"]["statuses"] == {"done": 39}


def test_many_tasks_awaiting_the_host_are_cut_to_those_that_fit() -> None:
    data = _compact(200, 200)
    text, fit = fitted(data, 2_000)
    assert len(text) <= 2_000
    assert fit["tasks"] == data["tasks"][: len(fit["tasks"])] and fit["tasks"]
    assert fit["tasks_left_out"]["statuses"] == {"awaiting_host": 200 - len(fit["tasks"])}


@pytest.mark.parametrize("bound", [2_000, 5_000])
async def test_runs_list_pages_fit_and_name_the_call_for_the_rest(tmp_path: Path, bound: int) -> None:
    async with connected(tmp_path, bound) as client:
        started = []
        for i in range(30):
            request = f"{i}: " + output(f"request {i}", 300)
            view = await answer(client, "orchestrate_start", {"request": request, "chain": ["writer"]}, bound)
            started.append(view["run_id"])
        seen: list[str] = []
        page = await answer(client, "runs_list", {"limit": 500, "status": ["awaiting_host"]}, bound)
        pages = 1
        while True:
            seen += [r["run_id"] for r in page["runs"]]
            if "next_action" not in page:
                assert page["next_cursor"] is None
                break
            action = page["next_action"]
            assert action["kind"] == "read_more" and action["tool"] == "runs_list"
            assert action["arguments"] == {
                "status": ["awaiting_host"],
                "limit": 500,
                "cursor": page["next_cursor"],
            }
            page = await answer(client, "runs_list", action["arguments"], bound)
            pages += 1
    assert seen == started[::-1]  # newest first, each once
    assert pages > 1


@pytest.mark.parametrize("bound", [2_000, 5_000])
async def test_run_events_pages_fit_and_name_the_call_for_the_rest(tmp_path: Path, bound: int) -> None:
    async with connected(tmp_path, bound) as client:
        view = await long_run(client, bound)
        arguments: dict[str, Any] = {"run_id": view["run_id"], "limit": 500}
        seqs: list[int] = []
        while True:
            page = await answer(client, "run_events", arguments, bound)
            seqs += [e["seq"] for e in page["events"]]
            if not page["more"]:
                assert "next_action" not in page
                break
            action = page["next_action"]
            assert action["tool"] == "run_events"
            assert action["arguments"] == {
                "run_id": view["run_id"],
                "after_seq": page["next_after_seq"],
                "limit": 500,
            }
            arguments = action["arguments"]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > 3 * STEPS


def _page(events: list[Event], more: bool = False) -> EventsPage:
    return EventsPage(
        run_id="run-x",
        status=RunStatus.RUNNING,
        terminal=False,
        events=events,
        next_after_seq=max((e.seq for e in events), default=0),
        more=more,
        next_output_after=9,
    )


def test_an_output_delta_longer_than_the_bound_keeps_its_newest_text() -> None:
    at = datetime(2026, 12, 6, tzinfo=UTC)
    text = output("w", 4_000)
    recorded = Event(seq=7, at=at, type="attempt_started", task_id="w", summary="w started")
    delta = Event(
        seq=7,
        at=at,
        type="output_delta",
        task_id="w",
        summary="w wrote 4000 characters (attempt 1)",
        attempt=1,
        offset=100,
        missed=5,
        text=text,
    )
    page = fitted_events(_page([recorded, delta]), 2_000, 50, 0)
    assert len(page.model_dump_json()) <= 2_000
    assert page.events[0] == recorded and page.next_output_after == 9 and not page.next_action
    cut = page.events[1]
    assert cut.text and text.endswith(cut.text) and len(cut.text) > 500
    left_out = len(text) - len(cut.text)
    assert cut.offset == 100 + left_out and cut.missed == 5 + left_out
    assert "run://run-x/tasks/w/output" in cut.summary


def test_recorded_events_that_do_not_fit_go_to_the_next_page_with_no_output_after_them() -> None:
    at = datetime(2026, 12, 6, tzinfo=UTC)
    recorded = [
        Event(seq=i, at=at, type="task_completed", task_id=f"t{i}", summary="x" * 290) for i in range(1, 21)
    ]
    delta = Event(
        seq=20,
        at=at,
        type="output_delta",
        task_id="w",
        summary="w wrote",
        attempt=1,
        offset=0,
        missed=0,
        text="hi",
    )
    page = fitted_events(_page([*recorded, delta]), 2_000, 50, 3)
    assert len(page.model_dump_json()) <= 2_000
    assert [e.seq for e in page.events] == list(range(1, len(page.events) + 1))
    assert page.more and page.next_after_seq == page.events[-1].seq < 20
    assert page.next_output_after == 3  # the output written is read with the page that reaches it
    assert page.next_action["arguments"] == {
        "run_id": "run-x",
        "after_seq": page.next_after_seq,
        "limit": 50,
        "output_after": 3,
    }

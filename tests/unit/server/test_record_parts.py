"""A run's record longer than ``max_answer_chars`` (``run_status`` with ``detail="full"`` or a
``task_id``) comes in parts: every answer fits, ``next_action`` comes first, and the parts'
texts joined are the record's answer text byte for byte; the parts of one read come from one
version of the run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from orchestration.core import StartRequest
from server.app import ConstructApp
from server.settings.config import load_settings
from server.views.compact import answer_data, answer_text
from server.views.record_parts import RecordPart, RecordTexts, record_answer
from server.views.run_view import ChildView, run_view
from tests.unit.helpers import make_runtime, play

#: a bound no record here reaches: the record's text whole, to compare the parts with
WHOLE = 1_000_000


#: the built-in specialists with short personas: a long prompt's first part carries its persona
#: whole, and the built-in ones need a bound of about 4,200 characters (checked at start)
SHORT_PERSONAS = "".join(
    f'[specialists.{name}]\ndescription = "{name}"\npersona = "You are the {name}."\n'
    for name in ("architect", "engineer", "researcher", "reviewer", "tester", "writer")
)


@asynccontextmanager
async def connected(home: Path, bound: int) -> AsyncIterator[Client]:
    config = home / "construct.toml"
    config.write_text(SHORT_PERSONAS)
    env = {
        "CONSTRUCT_HOME": str(home),
        "CONSTRUCT_POLL_SECONDS": "0.1",
        "CONSTRUCT_MAX_ANSWER_CHARS": str(bound),
    }
    async with Client(ConstructApp(load_settings(env=env, config_file=config)).build_server()) as client:
        yield client


async def answer(
    client: Client, tool: str, arguments: dict[str, Any], bound: int
) -> tuple[str, dict[str, Any]]:
    """The text and structured content of a call that succeeds; its text within ``bound``, with
    ``next_action`` first."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    text = result.content[0].text  # type: ignore[union-attr]
    assert len(text) <= bound, (tool, arguments, len(text))
    assert text.startswith('{"next_action":{"kind":'), text[:80]
    assert isinstance(result.structured_content, dict)
    assert json.loads(text) == result.structured_content
    return text, result.structured_content


async def error(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.content
    text: str = result.content[0].text  # type: ignore[union-attr]
    return text


def output(task_id: str, chars: int) -> str:
    # quotes, backslashes, newlines, control characters and characters outside ASCII: JSON escapes
    # make them longer than they are
    piece = f'{task_id}: "quoted" \\ back\nslash\t\x01 — ünïcødé 🙂 '
    return (piece * (chars // len(piece) + 1))[:chars]


async def started(client: Client, chain: list[str], outputs: int, bound: int, hand_in: int) -> str:
    """A run of ``chain`` whose first ``hand_in`` tasks got outputs of ``outputs`` characters."""
    _, view = await answer(client, "orchestrate_start", {"request": "Write it up", "chain": chain}, bound)
    for _ in range(hand_in):
        task_id = view["next_action"]["task_id"]
        arguments = {"run_id": view["run_id"], "task_id": task_id, "output": output(task_id, outputs)}
        _, view = await answer(client, "orchestrate_resume", arguments, bound)
    run_id: str = view["run_id"]
    return run_id


async def read_all(client: Client, arguments: dict[str, Any], bound: int) -> tuple[str, list[dict[str, Any]]]:
    """Follow a record's read_more calls from ``arguments`` to the last part: the parts' texts
    joined, and the parts."""
    parts: list[dict[str, Any]] = []
    while True:
        _, part = await answer(client, "run_status", arguments, bound)
        assert part["offset"] == sum(len(p["text"]) for p in parts)
        assert part["end"] == part["offset"] + len(part["text"]) and part["text"]
        parts.append(part)
        action = part["next_action"]
        if action["kind"] != "read_more":
            break
        assert action["tool"] == "run_status" and action["arguments"]["offset"] == part["end"]
        arguments = action["arguments"]
    assert {p["chars"] for p in parts} == {parts[-1]["end"]}
    assert len({p["version"] for p in parts}) == 1
    return "".join(p["text"] for p in parts), parts


@pytest.mark.parametrize("bound", [2_000, 3_500, 6_000, 10_000, 20_000])
async def test_a_full_record_comes_in_parts_that_join_to_the_whole_answer(tmp_path: Path, bound: int) -> None:
    async with connected(tmp_path, bound) as client:
        run_id = await started(client, ["writer", "reviewer"], 9_000, bound, hand_in=2)
        joined, parts = await read_all(client, {"run_id": run_id, "detail": "full"}, bound)
    async with connected(tmp_path, WHOLE) as client:
        whole, view = await answer(client, "run_status", {"run_id": run_id, "detail": "full"}, WHOLE)
    assert joined == whole  # byte for byte
    assert len(parts) >= len(whole) // bound
    assert view["tasks"][1]["output"] == output("reviewer", 9_000)
    # The run has ended: the last part's next_action is the run's own, which names no call.
    assert parts[-1]["next_action"] == view["next_action"]
    assert parts[-1]["next_action"]["kind"] == "none" and "tool" not in parts[-1]["next_action"]
    assert all(p["status"] == "completed" for p in parts)


@pytest.mark.parametrize("bound", [2_000, 10_000])
async def test_one_tasks_whole_output_comes_in_parts_and_the_last_continues_the_run(
    tmp_path: Path, bound: int
) -> None:
    async with connected(tmp_path, bound) as client:
        run_id = await started(client, ["writer", "reviewer"], 30_000, bound, hand_in=1)
        joined, parts = await read_all(client, {"run_id": run_id, "task_id": "writer"}, bound)
        first = parts[0]["next_action"]
        assert first["arguments"] == {
            "run_id": run_id,
            "task_id": "writer",
            "offset": parts[0]["end"],
            "version": parts[0]["version"],
        }
        # The joined text is the compact answer with that task's whole output.
        record = json.loads(joined)
        assert record["tasks"][0]["output"] == output("writer", 30_000)
        # The last part names the run's own next call: the editor's task, whose prompt (which
        # carries the writer's output) is read in parts too.
        last = parts[-1]["next_action"]
        assert last == record["next_action"]
        assert last["kind"] == "read_prompt" and last["arguments"]["task_id"] == "reviewer"
        _, prompt = await answer(client, last["tool"], last["arguments"], bound)
        assert prompt["task_id"] == "reviewer" and prompt["system_prompt"] == "You are the reviewer."


async def test_a_record_that_fits_comes_whole(tmp_path: Path) -> None:
    async with connected(tmp_path, 10_000) as client:
        run_id = await started(client, ["writer"], 100, 10_000, hand_in=1)
        _, view = await answer(client, "run_status", {"run_id": run_id, "detail": "full"}, 10_000)
        assert view["tasks"][0]["output"] == output("writer", 100) and "text" not in view
        # A version that is the run's own changes nothing.
        pinned = {"run_id": run_id, "detail": "full", "version": view["version"]}
        _, again = await answer(client, "run_status", pinned, 10_000)
        assert again == view
        # It has no parts: an offset past 0 is refused.
        refused = await error(client, "run_status", pinned | {"offset": 5})
        assert refused.startswith("invalid_argument: offset 5: this record fits in one answer")


async def test_the_parts_of_one_read_come_from_one_version(tmp_path: Path) -> None:
    bound = 4_000
    async with connected(tmp_path, bound) as client:
        run_id = await started(client, ["writer", "reviewer"], 20_000, bound, hand_in=1)
        _, first = await answer(client, "run_status", {"run_id": run_id, "detail": "full"}, bound)
        more = first["next_action"]["arguments"]
        assert more["version"] == first["version"]
        _, second = await answer(client, "run_status", more, bound)
        assert second["offset"] == first["end"]
        # The run moves on: a part of the version read so far is refused, saying how to start again.
        arguments = {"run_id": run_id, "task_id": "reviewer", "output": "edited"}
        await answer(client, "orchestrate_resume", arguments, bound)
        refused = await error(client, "run_status", second["next_action"]["arguments"])
        assert refused.startswith(f"record_changed: run {run_id} moved on from version {first['version']}")
        assert '{"run_id": "' + run_id + '", "detail": "full"} (offset 0, no version)' in refused
        # Read again from offset 0, the parts come from the new version.
        joined, parts = await read_all(client, {"run_id": run_id, "detail": "full"}, bound)
        assert parts[0]["version"] > first["version"]
        assert json.loads(joined)["tasks"][1]["output"] == "edited"


async def test_offsets_the_record_does_not_have_are_refused(tmp_path: Path) -> None:
    bound = 3_000
    async with connected(tmp_path, bound) as client:
        run_id = await started(client, ["writer"], 20_000, bound, hand_in=1)
        _, first = await answer(client, "run_status", {"run_id": run_id, "detail": "full"}, bound)
        version = first["version"]
        past = {"run_id": run_id, "detail": "full", "offset": first["chars"], "version": version}
        assert (await error(client, "run_status", past)).startswith("invalid_argument: offset ")
        unpinned = {"run_id": run_id, "detail": "full", "offset": 10}
        assert "needs the version" in await error(client, "run_status", unpinned)
        compact = {"run_id": run_id, "offset": 10, "version": version}
        assert "with detail 'full' or a task_id" in await error(client, "run_status", compact)
        negative = {"run_id": run_id, "detail": "full", "offset": -1}
        assert (await error(client, "run_status", negative)).startswith("invalid_argument: offset")


async def test_the_parts_of_one_version_agree_while_what_it_shows_of_other_runs_moves() -> None:
    """A record's text is the same for one version of its run but for what it shows of other runs
    (its children); the server keeps the text it hands out in parts, so a child that moves
    between two parts does not make them disagree."""
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("Build it", chain=("writer",)))
    await runtime.drive(head.run_id)
    await play(runtime, head.run_id, output=lambda task: output(task, 20_000))
    view = run_view(await runtime.snapshot(head.run_id), "full")
    child = ChildView(run_id="run-child", task_id="writer", by="host", status="running")
    moved = view.model_copy(update={"children": [child.model_copy(update={"status": "completed"})]})
    view = view.model_copy(update={"children": [child]})
    kept, bound = RecordTexts(), 4_000
    first = record_answer(view, None, 0, None, bound, kept)
    assert isinstance(first, RecordPart)
    parts = [first]
    while parts[-1].next_action["kind"] == "read_more":
        part = record_answer(moved, None, parts[-1].end, view.version, bound, kept)
        assert isinstance(part, RecordPart)
        parts.append(part)
    joined = "".join(p.text for p in parts)
    assert joined == answer_text(answer_data(view)) != answer_text(answer_data(moved))
    # Another server (nothing kept) reads what the run shows now.
    fresh = record_answer(moved, None, 0, None, bound, RecordTexts())
    assert isinstance(fresh, RecordPart) and fresh.chars == len(answer_text(answer_data(moved)))

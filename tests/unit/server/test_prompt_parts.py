"""Every answer fits in ``max_answer_chars``: a host task whose prompt is longer is handed out in
parts (``task_prompt``), which joined are the prompt the run recorded, byte for byte."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from orchestration.chains import Catalog
from orchestration.core import HostOutputSubmitted, HostTaskPrepared
from orchestration.core.fold import fold
from orchestration.errors import ConfigError
from server.app import ConstructApp
from server.settings.config import load_settings
from server.views.parts import check_room
from server.views.timeline import render_timeline
from stores.filesystem import FilesystemStore

BOUND = 10_000


@asynccontextmanager
async def connected(home: Path) -> AsyncIterator[Client]:
    settings = load_settings(env={"CONSTRUCT_HOME": str(home), "CONSTRUCT_POLL_SECONDS": "0.1"})
    assert settings.max_answer_chars == BOUND  # the default
    async with Client(ConstructApp(settings).build_server()) as client:
        yield client


async def call(client: Client, tool: str, arguments: dict[str, Any], sizes: list[int]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    text = result.content[0].text  # type: ignore[union-attr]
    sizes.append(len(text))
    assert isinstance(result.structured_content, dict)
    assert text.startswith('{"next_action":')
    return result.structured_content


def _output(task_id: str, chars: int) -> str:
    # quotes, backslashes, newlines and characters outside ASCII: JSON escapes make them longer
    piece = f'{task_id}: "quoted" \\ back\nslash — ünïcødé 🙂 '
    return (piece * (chars // len(piece) + 1))[:chars]


async def _drive(client: Client, request: str, chain: str, output_chars: int) -> tuple[str, dict[str, str]]:
    """Run ``chain`` to its end as a host that does what each next_action says; the prompts it
    received (task id -> SHA-256 of system, NUL, user) and the run id."""
    sizes: list[int] = []
    view = await call(client, "orchestrate_start", {"request": request, "chain": chain}, sizes)
    run_id = view["run_id"]
    received: dict[str, str] = {}
    parts: list[str] = []
    system = ""
    action = view["next_action"]
    while action["kind"] != "none":
        arguments = dict(action["arguments"])
        if action["kind"] == "run_host_task":
            user = action.get("user_prompt", "".join(parts))
            system = action.get("system_prompt", system)
            received[action["task_id"]] = hashlib.sha256(f"{system}\0{user}".encode()).hexdigest()
            arguments["output"] = _output(action["task_id"], output_chars)
            parts = []
        answer = await call(client, action["tool"], arguments, sizes)
        if action["kind"] == "read_prompt":
            assert answer["offset"] == sum(map(len, parts))
            parts.append(answer["text"])
            system = answer.get("system_prompt", system)
        action = answer["next_action"]
    assert max(sizes) <= BOUND, sizes
    return run_id, received


async def test_long_prompts_come_in_parts_that_join_to_the_prompt_recorded(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        run_id, received = await _drive(client, "Build a URL shortener", "default", 60_000)
    facts = await FilesystemStore(tmp_path).read_facts(run_id)
    recorded = {f.task_id: f.prompt_sha256 for f in facts if isinstance(f, HostTaskPrepared)}
    assert received == recorded
    assert set(recorded) == {"architect", "engineer", "reviewer"}


async def test_a_short_prompt_still_comes_whole_in_the_answer(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        sizes: list[int] = []
        view = await call(client, "orchestrate_start", {"request": "Build a URL shortener"}, sizes)
        assert view["next_action"]["kind"] == "run_host_task"
        assert "user_prompt" in view["next_action"]


async def test_a_part_of_a_task_not_awaiting_the_host_is_refused(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        sizes: list[int] = []
        view = await call(client, "orchestrate_start", {"request": "x" * 30_000}, sizes)
        action = view["next_action"]
        assert action["kind"] == "read_prompt" and action["tool"] == "task_prompt"
        assert action["arguments"] == {"run_id": view["run_id"], "task_id": "architect", "offset": 0}
        wrong = await client.call_tool("task_prompt", {"run_id": view["run_id"], "task_id": "engineer"})
        assert wrong.is_error and wrong.content[0].text.startswith("invalid_state:")  # type: ignore[union-attr]
        past = {"run_id": view["run_id"], "task_id": "architect", "offset": 10**6}
        beyond = await client.call_tool("task_prompt", past)
        assert beyond.is_error and beyond.content[0].text.startswith("invalid_argument:")  # type: ignore[union-attr]


async def _submissions(home: Path, run_id: str) -> dict[str, HostOutputSubmitted]:
    facts = await FilesystemStore(home).read_facts(run_id)
    return {f.task_id: f for f in facts if isinstance(f, HostOutputSubmitted)}


async def test_a_host_that_read_every_part_is_recorded_as_reading_the_whole_prompt(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        run_id, _ = await _drive(client, "Build a URL shortener", "default", 60_000)
    submitted = await _submissions(tmp_path, run_id)
    # the architect's prompt (the short request) came whole: nothing to record
    assert submitted["architect"].prompt_read is None
    for task_id in ("engineer", "reviewer"):
        read = submitted[task_id].prompt_read
        assert read is not None and read.whole and read.read == read.chars > BOUND, (task_id, read)
    # and on the attempt, in the task's history
    facts = await FilesystemStore(tmp_path).read_facts(run_id)
    history = fold(facts, keep_history=True)
    assert history.task("reviewer").attempts[-1].prompt_read == submitted["reviewer"].prompt_read
    read = submitted["reviewer"].prompt_read
    assert read is not None
    assert f"it read {read.chars:,} of the prompt's {read.chars:,} characters" in render_timeline(
        history, facts
    )
    assert "SKIPPING" not in render_timeline(history, facts)


async def test_a_host_that_skipped_parts_is_visible_in_the_run(tmp_path: Path) -> None:
    async with connected(tmp_path) as client:
        sizes: list[int] = []
        view = await call(client, "orchestrate_start", {"request": "x" * 30_000}, sizes)
        run_id = view["run_id"]
        action = view["next_action"]
        assert action["kind"] == "read_prompt"
        first = await call(client, "task_prompt", action["arguments"], sizes)
        again = await call(client, "task_prompt", action["arguments"], sizes)  # read twice, counted once
        assert again["end"] == first["end"] < first["chars"]
        # hands in without reading the rest
        await call(
            client, "orchestrate_resume", {"run_id": run_id, "task_id": "architect", "output": "plan"}, sizes
        )
    read = (await _submissions(tmp_path, run_id))["architect"].prompt_read
    assert read is not None and read.read == first["end"] and read.chars == first["chars"] and not read.whole
    facts = await FilesystemStore(tmp_path).read_facts(run_id)
    timeline = render_timeline(fold(facts, keep_history=True), facts)
    assert f"SKIPPING {read.chars - read.read:,}" in timeline


def test_the_built_in_specialists_need_the_bound_the_settings_document() -> None:
    # the settings' description of max_answer_chars names 4,213
    check_room(Catalog.builtin(), 4_213)
    with pytest.raises(ConfigError, match=r"specialists\.reviewer\.persona: .* at least 4,213"):
        check_room(Catalog.builtin(), 4_212)


def test_a_persona_too_long_for_a_first_part_stops_the_server_before_it_starts(tmp_path: Path) -> None:
    config = tmp_path / "construct.toml"
    config.write_text(f'[specialists.poet]\ndescription = "writes"\npersona = "{"p" * 9_500}"\n')
    settings = load_settings(env={"CONSTRUCT_HOME": str(tmp_path)}, config_file=config)
    with pytest.raises(
        ConfigError, match=r"specialists\.poet\.persona: the persona makes .* over max_answer_chars"
    ):
        ConstructApp(settings)
    raised = load_settings(
        env={"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_MAX_ANSWER_CHARS": "12000"}, config_file=config
    )
    ConstructApp(raised)


def test_an_output_schema_counts_with_the_persona(tmp_path: Path) -> None:
    config = tmp_path / "construct.toml"
    properties = ", ".join(f'f{i} = {{ type = "string", description = "{"d" * 80}" }}' for i in range(120))
    config.write_text(
        f'[chains.wide]\nsteps = [{{ specialist = "engineer", output_schema = {{ type = "object", '
        f"properties = {{ {properties} }} }} }}]\n"
    )
    settings = load_settings(env={"CONSTRUCT_HOME": str(tmp_path)}, config_file=config)
    with pytest.raises(ConfigError, match=r"chains\.wide\.engineer: the persona and the output schema make"):
        ConstructApp(settings)

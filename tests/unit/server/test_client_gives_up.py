"""A client that gives up on a call (issue 21 §1), through the MCP surface in process: default
answers come within 3 s and say what to call next, progress arrives at least every second while a
call waits, and a retried ``orchestrate_start`` without a key returns the run the first one started
(``existing_run``), also after a restart; ``new_run`` starts another."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp.types import ElicitRequestParams, ElicitResult

from server.app import ConstructApp
from server.mcp.answering import DEFAULT_WAIT_SECONDS, PROGRESS_INTERVAL_SECONDS
from server.settings.config import load_settings
from tests.acceptance.harness import call
from tests.fakes.fake_provider import FakeProvider

#: the model takes longer than any default answer waits
SLOW = {"default": [{"delay_seconds": 8, "text": "late, but done"}]}


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_POLL_SECONDS": "0.1", **extra}


def provider_env(tmp_path: Path, fake: FakeProvider, **extra: str) -> dict[str, str]:
    return env(
        tmp_path,
        CONSTRUCT_WORKER_BACKEND="provider",
        CONSTRUCT_MODEL="claude-test-1",
        CONSTRUCT_ANTHROPIC_BASE_URL=fake.base_url,
        ANTHROPIC_API_KEY="sk-ant-test-key",
        **extra,
    )


@asynccontextmanager
async def served(settings_env: dict[str, str]) -> AsyncIterator[Client]:
    async with Client(ConstructApp(load_settings(env=settings_env)).build_server()) as client:
        yield client


async def test_a_default_start_answers_within_3_s_and_says_to_wait(tmp_path: Path) -> None:
    assert DEFAULT_WAIT_SECONDS == 3.0
    with FakeProvider(SLOW) as fake:
        async with served(provider_env(tmp_path, fake)) as client:
            began = anyio.current_time()
            view = await call(client, "orchestrate_start", request="slow model", chain=["writer"])
            took = anyio.current_time() - began
            # Returned before the run settled (the model answers after 8 s), and says what next.
            assert 2.5 <= took < 4.5, took
            assert view["status"] in ("queued", "running"), view["status"]
            action = view["next_action"]
            assert action["kind"] == "wait" and action["tool"] == "run_status", action
            assert action["arguments"]["run_id"] == view["run_id"]
            assert 0 < action["arguments"]["wait_seconds"] <= DEFAULT_WAIT_SECONDS
            # The retry a client makes after giving up: the same run, marked so; no second call.
            again = await call(
                client, "orchestrate_start", request="slow model", chain=["writer"], wait_seconds=0
            )
            assert again["run_id"] == view["run_id"] and again["existing_run"] is True
            assert "existing_run" not in view
            done = await call(client, "run_status", run_id=view["run_id"], wait_seconds=20)
            assert done["status"] == "completed"
        assert fake.calls() == {"writer": 1}


async def test_progress_arrives_at_least_every_second_while_a_call_waits(tmp_path: Path) -> None:
    with FakeProvider(SLOW) as fake:
        async with served(provider_env(tmp_path, fake)) as client:
            seen: list[tuple[float, float]] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append((anyio.current_time(), progress))

            began = anyio.current_time()
            result = await client.call_tool(
                "orchestrate_start",
                {"request": "progress", "chain": ["writer"], "wait_seconds": 3},
                progress_callback=on_progress,
            )
            ended = anyio.current_time()
            assert not result.is_error
            times = [began, *(t for t, _ in seen), ended]
            gaps = [b - a for a, b in pairwise(times)]
            assert len(seen) >= 3, seen
            # The server ticks every PROGRESS_INTERVAL_SECONDS (0.8); the bound leaves room for a
            # loaded machine's scheduling, and a wait that stopped ticking (one gap of 3 s) fails.
            assert max(gaps) <= PROGRESS_INTERVAL_SECONDS + 0.45, gaps
            assert [p for _, p in seen] == list(range(1, len(seen) + 1))


async def test_run_events_long_poll_ticks_too(tmp_path: Path) -> None:
    async with served(env(tmp_path, CONSTRUCT_ORCHESTRATION_STORE="memory")) as client:
        view = await call(client, "orchestrate_start", request="events", chain=["writer"])
        page = await call(client, "run_events", run_id=view["run_id"])
        seen: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(anyio.current_time())

        began = anyio.current_time()
        result = await client.call_tool(
            "run_events",
            {"run_id": view["run_id"], "after_seq": page["next_after_seq"], "wait_seconds": 2},
            progress_callback=on_progress,
        )
        assert not result.is_error and anyio.current_time() - began >= 1.9
        assert len(seen) >= 2 and seen[0] - began < 0.5, seen


async def test_a_retried_start_finds_its_run_after_a_restart_and_new_run_starts_another(
    tmp_path: Path,
) -> None:
    start: dict[str, Any] = {"request": "Write the notes", "chain": ["writer"], "approve_before": ["writer"]}
    async with served(env(tmp_path)) as client:
        first = await call(client, "orchestrate_start", **start)
        assert first["status"] == "awaiting_approval" and "existing_run" not in first
    async with served(env(tmp_path)) as client:  # a new server process on the same store
        again = await call(client, "orchestrate_start", **start)
        assert again["run_id"] == first["run_id"] and again["existing_run"] is True
        # Said in words a person reading the answer and a model both notice: which run, how old,
        # and the one argument that starts another.
        [said] = [w for w in again["warnings"] if w.startswith("existing_run:")]
        assert f"run {first['run_id']} was started " in said and " s ago " in said
        assert "new_run: true" in said and "warnings" not in first
        other = await call(client, "orchestrate_start", **start, new_run=True)
        assert other["run_id"] != first["run_id"] and "existing_run" not in other
        # new_run as a strict model sends it when unset: null, which means omitted
        retried = await call(client, "orchestrate_start", **start, new_run=None)
        assert retried["run_id"] == other["run_id"] and retried["existing_run"] is True
        different = await call(client, "orchestrate_start", **{**start, "request": "Write other notes"})
        assert different["run_id"] not in (first["run_id"], other["run_id"])
        keyed = await call(client, "orchestrate_start", **start, idempotency_key="k1")
        assert keyed["run_id"] not in (first["run_id"], other["run_id"]) and "existing_run" not in keyed
        keyed_again = await call(client, "orchestrate_start", **start, idempotency_key="k1")
        assert keyed_again["existing_run"] is True
        assert any("another idempotency_key" in w for w in keyed_again["warnings"])
        assert len((await call(client, "runs_list"))["runs"]) == 4


async def test_a_zero_window_turns_the_retry_window_off(tmp_path: Path) -> None:
    settings = env(tmp_path, CONSTRUCT_ORCHESTRATION_STORE="memory", CONSTRUCT_START_RETRY_WINDOW_SECONDS="0")
    async with served(settings) as client:
        a = await call(client, "orchestrate_start", request="twice", chain=["writer"])
        b = await call(client, "orchestrate_start", request="twice", chain=["writer"])
        assert a["run_id"] != b["run_id"] and "existing_run" not in b


async def test_a_form_asked_mid_call_stays_within_the_default_wait(tmp_path: Path) -> None:
    """A handshake-era client with elicitation: the run reaches its gate after 2 s (a slow model),
    and the form then stays open for what is left of the call's 3 s, not 3 s more."""
    asked: list[float] = []

    async def silent(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(anyio.current_time())
        await anyio.sleep_forever()  # the user walked away
        raise AssertionError("unreachable")

    scenario = {"default": [{"delay_seconds": 2, "text": "the design"}]}
    with FakeProvider(scenario) as fake:
        app = ConstructApp(load_settings(env=provider_env(tmp_path, fake)))
        async with Client(app.build_server(), mode="legacy", elicitation_callback=silent) as client:
            began = anyio.current_time()
            start = {"request": "gated", "chain": ["architect", "engineer"], "approve_before": ["engineer"]}
            view = await call(client, "orchestrate_start", **start)
            took = anyio.current_time() - began
    assert len(asked) == 1 and asked[0] - began >= 1.5, asked
    assert took < DEFAULT_WAIT_SECONDS + 0.75, took
    assert view["status"] == "awaiting_approval" and view["next_action"]["kind"] == "approve"
    unanswered = "elicitation: no answer to the form for gate before:engineer within 3 s"
    assert any(w.startswith(unanswered) for w in view["warnings"]), view["warnings"]

"""Streamed output over MCP (issue 25), in process with a real client: a call waiting on a run whose
model streams receives progress notifications carrying the text as it is written (at most one per
250 ms, each with the text since the previous one, capped), and the output is recorded once;
``run_events`` and ``run://{id}/events`` carry ``output_delta`` events from memory (a late reader
learns what it missed; another server on the store sees recorded events only)."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.types import TextResourceContents

from server.mcp.answering import OUTPUT_INTERVAL_SECONDS, OUTPUT_MESSAGE_CHARS
from server.views.events import OUTPUT_EVENT_CHARS
from tests.acceptance.harness import call
from tests.fakes.fake_provider import FakeProvider
from tests.unit.server.test_client_gives_up import provider_env, served

ANSWER = "The writer's answer arrives in small pieces, " + "one after another, " * 12 + "and ends here."
STREAMING = {"default": [{"text": ANSWER, "chunk_chars": 4, "chunk_delay_seconds": 0.02}]}


async def test_a_waiting_call_receives_the_text_as_it_is_written(tmp_path: Path) -> None:
    with FakeProvider(STREAMING) as fake:
        async with served(provider_env(tmp_path, fake)) as client:
            seen: list[tuple[float, float, str]] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append((anyio.current_time(), progress, message or ""))

            result = await client.call_tool(
                "orchestrate_start",
                {"request": "stream it", "chain": ["writer"], "wait_seconds": 20},
                progress_callback=on_progress,
            )
            assert not result.is_error
            view = result.structured_content or {}
            assert view["status"] == "completed"
            full = await call(client, "run_status", run_id=view["run_id"], detail="full")
    outputs = [(at, m.removeprefix("writer: ")) for at, _, m in seen if m.startswith("writer: ")]
    # The pieces, in order, are the answer as written, each once: a notification has only the new
    # text. (The last piece may not go out: the answer, which has it all, ends the call first.)
    streamed = "".join(text for _, text in outputs)
    assert ANSWER.startswith(streamed) and len(streamed) > len(ANSWER) // 2
    assert len(outputs) >= 2  # the text came in more than one notification
    assert all(len(m) <= OUTPUT_MESSAGE_CHARS for _, _, m in seen)
    # Never two output notifications closer than the interval (a loaded machine only widens it).
    assert all(b - a >= OUTPUT_INTERVAL_SECONDS - 0.01 for (a, _), (b, _) in pairwise(outputs))
    assert [p for _, p, _ in seen] == list(range(1, len(seen) + 1))
    [task] = full["tasks"]
    assert task["output"] == ANSWER


async def test_a_call_joining_mid_stream_gets_the_text_so_far_then_the_rest(tmp_path: Path) -> None:
    slow = {"default": [{"text": ANSWER, "chunk_chars": 4, "chunk_delay_seconds": 0.04}]}
    with FakeProvider(slow) as fake:
        async with served(provider_env(tmp_path, fake)) as client:
            view = await call(
                client, "orchestrate_start", request="join late", chain=["writer"], wait_seconds=0
            )
            await anyio.sleep(0.6)  # part of the answer is written
            messages: list[str] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                messages.append(message or "")

            result = await client.call_tool(
                "run_status", {"run_id": view["run_id"], "wait_seconds": 20}, progress_callback=on_progress
            )
            assert (result.structured_content or {})["status"] == "completed"
    texts = [m.removeprefix("writer: ") for m in messages if m.startswith("writer: ")]
    streamed = "".join(texts)
    assert ANSWER.startswith(streamed) and len(streamed) > len(ANSWER) // 2
    assert len(texts[0]) > 4  # the first carried everything written before the call


LONG = "".join(f"line {i:04d} of the engineer's long answer\n" for i in range(400))  # 16,400 chars


async def follow_events(client: Client, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Read the run's feed to its end as a tail does; (recorded events, output_delta events)."""
    stored: list[dict[str, Any]] = []
    deltas: list[dict[str, Any]] = []
    after, output_after = 0, 0
    with anyio.fail_after(30):
        while True:
            page = await call(
                client,
                "run_events",
                run_id=run_id,
                after_seq=after,
                output_after=output_after,
                wait_seconds=5,
            )
            for item in page["events"]:
                (deltas if item["type"] == "output_delta" else stored).append(item)
            after, output_after = page["next_after_seq"], page["next_output_after"]
            if page["terminal"] and not page["more"]:
                return stored, deltas


async def test_run_events_carry_output_deltas_from_memory_and_count_recorded_events_only(
    tmp_path: Path,
) -> None:
    with FakeProvider({"default": [{"text": ANSWER, "chunk_chars": 4, "chunk_delay_seconds": 0.02}]}) as fake:
        async with served(provider_env(tmp_path, fake)) as client:
            view = await call(
                client, "orchestrate_start", request="tail it", chain=["writer"], wait_seconds=0
            )
            stored, deltas = await follow_events(client, view["run_id"])
            again = await call(client, "run_events", run_id=view["run_id"])
    # The recorded events are the feed as without streaming: seq 1, 2, 3, ... once each.
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    assert [e for e in again["events"] if e["type"] != "output_delta"] == stored
    assert "output_delta" not in {e["type"] for e in again["events"]}  # the call ended: none held
    assert again["next_after_seq"] == stored[-1]["seq"]
    # The deltas, each once and in order, are the answer as it was written.
    assert len(deltas) >= 2
    assert all(d["task_id"] == "writer" and d["attempt"] == 1 and d["missed"] == 0 for d in deltas)
    offsets = [d["offset"] for d in deltas]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert all(d["offset"] + len(d["text"]) == n["offset"] for d, n in pairwise(deltas))
    streamed = "".join(d["text"] for d in deltas)
    assert ANSWER.startswith(streamed) and len(streamed) > len(ANSWER) // 2
    # A delta follows the recorded event it was read after (its seq), never a seq of its own.
    assert all(d["seq"] <= stored[-1]["seq"] for d in deltas)
    [completed] = [e for e in stored if e["type"] == "task_completed"]
    assert completed["output"]["chars"] == len(ANSWER)


async def test_a_late_reader_gets_what_is_held_and_how_much_it_missed_and_the_resource_too(
    tmp_path: Path,
) -> None:
    slow = {"default": [{"text": LONG, "chunk_chars": 400, "chunk_delay_seconds": 0.1}]}
    with FakeProvider(slow) as fake:
        async with served(provider_env(tmp_path, fake)) as client:
            view = await call(client, "orchestrate_start", request="late", chain=["writer"], wait_seconds=0)
            run_id = view["run_id"]
            with anyio.fail_after(20):
                while True:
                    page = await call(client, "run_events", run_id=run_id)
                    late = [e for e in page["events"] if e["type"] == "output_delta"]
                    if late and late[0]["offset"] > 0:
                        break
                    await anyio.sleep(0.1)
            contents = (await client.read_resource(f"run://{run_id}/events")).contents[0]
            assert isinstance(contents, TextResourceContents)
            resource = json.loads(contents.text)
            await call(client, "run_status", run_id=run_id, wait_seconds=20)
    [delta] = late
    # At most OUTPUT_EVENT_CHARS of the newest text; all that came before it is counted as missed.
    assert len(delta["text"]) == OUTPUT_EVENT_CHARS
    assert delta["missed"] == delta["offset"] > 0
    assert LONG[delta["offset"] :].startswith(delta["text"])
    assert f"{delta['missed']} characters before it are no longer held" in delta["summary"]
    assert any(e["type"] == "output_delta" for e in resource["events"])


async def test_another_server_on_the_store_sees_recorded_events_only(tmp_path: Path) -> None:
    slow = {"default": [{"text": LONG, "chunk_chars": 100, "chunk_delay_seconds": 0.05}]}
    shared = {"CONSTRUCT_ORCHESTRATION_STORE": "sqlite"}

    def has_output(page: dict[str, Any]) -> bool:
        return any(e["type"] == "output_delta" for e in page["events"])

    with FakeProvider(slow) as fake:
        async with (
            served(provider_env(tmp_path, fake, **shared)) as first,
            served(provider_env(tmp_path, fake, **shared)) as second,
        ):
            view = await call(first, "orchestrate_start", request="two", chain=["writer"], wait_seconds=0)
            run_id = view["run_id"]
            # Either server's dispatcher may take the run: the one that runs the call has its output.
            with anyio.fail_after(20):
                while True:
                    pages = [await call(c, "run_events", run_id=run_id) for c in (first, second)]
                    if any(has_output(p) for p in pages):
                        break
                    await anyio.sleep(0.05)
            await call(first, "run_status", run_id=run_id, wait_seconds=30)
    [elsewhere] = [p for p in pages if not has_output(p)]
    assert elsewhere["events"] and elsewhere["next_after_seq"] == elsewhere["events"][-1]["seq"]
    assert {e["type"] for e in elsewhere["events"]} >= {"run_created", "attempt_started"}

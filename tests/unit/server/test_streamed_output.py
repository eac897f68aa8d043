"""Streamed output over MCP (issue 25), in process with a real client: a call waiting on a run whose
model streams receives progress notifications carrying the text as it is written (at most one per
250 ms, each with the text since the previous one, capped), and the output is recorded once."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import anyio

from server.mcp.answering import OUTPUT_INTERVAL_SECONDS, OUTPUT_MESSAGE_CHARS
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

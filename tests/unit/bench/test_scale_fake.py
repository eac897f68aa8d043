"""What the scale bench reads of the fake provider (``GET /_stats``: calls in flight, the most at
once, when each task key was first called) and how it waits: one sleep per delayed request, ended
at once when the fake stops, however long the scripted delay."""

from __future__ import annotations

import time

import anyio
import httpx2

from tests.fakes.fake_provider import FakeProvider


async def ask(http: httpx2.AsyncClient, run: str) -> int:
    body = {
        "model": "m",
        "max_tokens": 8,
        "system": "[task:architect]",
        "messages": [{"role": "user", "content": f"[run:{run}] go"}],
    }
    response = await http.post("/v1/messages", json=body, headers={"x-api-key": "k"})
    return response.status_code


async def test_stats_count_the_calls_in_flight_and_when_each_key_was_first_called() -> None:
    with FakeProvider({"default": [{"text": "ok", "delay_seconds": 1.0}]}) as fake:
        async with httpx2.AsyncClient(base_url=fake.base_url, timeout=30) as http:
            before = time.time()
            statuses: list[int] = []

            async def one(run: str) -> None:
                statuses.append(await ask(http, run))

            async with anyio.create_task_group() as tg:
                for run in ("r1", "r2", "r3"):
                    tg.start_soon(one, run)
                with anyio.fail_after(5):
                    while (stats := (await http.get("/_stats")).json())["in_flight"] < 3:  # noqa: ASYNC110 (another thread)
                        await anyio.sleep(0.02)
            after = (await http.get("/_stats")).json()
    assert statuses == [200, 200, 200]
    assert stats["peak_in_flight"] == 3
    assert (after["in_flight"], after["peak_in_flight"]) == (0, 3)
    assert sorted(after["first_at"]) == ["r1/architect", "r2/architect", "r3/architect"]
    assert all(before <= at <= before + 5 for at in after["first_at"].values()), after


async def test_stopping_ends_a_long_scripted_delay_at_once() -> None:
    fake = FakeProvider({"default": [{"text": "late", "delay_seconds": 60.0}]}).start()
    try:
        async with (
            httpx2.AsyncClient(base_url=fake.base_url, timeout=30) as http,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(ask, http, "slow")
            with anyio.fail_after(5):
                while (await http.get("/_stats")).json()["in_flight"] < 1:  # noqa: ASYNC110 (another thread)
                    await anyio.sleep(0.02)
            began = time.monotonic()
            await anyio.to_thread.run_sync(fake.stop)
            stopped = time.monotonic() - began
            tg.cancel_scope.cancel()
    finally:
        fake.stop()
    # Well under uvicorn's graceful shutdown (2 s), which would otherwise cancel the sleeper.
    assert stopped < 1.5, stopped

"""Streamed provider calls, measured (issue 25; not a test: run it and read the figures).

A runtime with the provider worker drives one-step runs against the fake provider, whose answers
stream in small pieces. Two figures, each the median and worst of ``--runs`` runs:

- **first delta**: from the moment the fake sends its first text chunk to the moment that text is
  in the runtime's in-memory buffer (:class:`orchestration.engine.OutputDeltas`), where progress
  notifications, ``run_events`` and the page read it;
- **cancel**: from ``Runtime.cancel`` returning (the cancel is recorded) to the fake seeing the
  stream closed (its generator ends because the client went away). Target: under 100 ms.

    python bench/streaming.py [--runs 10] [--check]

``--check`` exits 1 when the worst cancel is over the target.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio

from bench.harness import Check, conclude, median, parser
from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import SystemClock
from orchestration.engine import Runtime
from orchestration.workers import ProviderEndpoint, ProviderSettings, ProviderWorker, contract_resolver
from orchestration.workers.model_calls import make_http_client
from stores.memory import MemoryStore
from tests.fakes.fake_provider import FakeProvider

CANCEL_TARGET_MS = 100.0
TEXT = "A reviewer's answer, streamed in small pieces so that there is something to watch. " * 40


async def first_text(runtime: Runtime, run_id: str) -> float:
    """When the run's first output text is in the runtime's buffer (``time.monotonic()``)."""
    with anyio.fail_after(30):
        while True:
            changed = runtime.deltas.changed(run_id)
            if any(t.text for t in runtime.deltas.held(run_id)):
                return time.monotonic()
            await changed.wait()


async def one_run(runtime: Runtime, fake: FakeProvider) -> tuple[float, float]:
    fake.reset()
    head, _ = await runtime.start(StartRequest("Review it"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.drive, head.run_id)
        seen = await first_text(runtime, head.run_id)
        await anyio.sleep(0.2)  # well into the stream
        await runtime.cancel(head.run_id, reason="bench")
        cancelled = time.monotonic()
        with anyio.fail_after(10):
            while not fake.streams():  # noqa: ASYNC110 - the fake answers on another thread
                await anyio.sleep(0.001)
    [stream] = fake.streams()
    return (seen - stream["first_at"]) * 1000.0, (stream["at"] - cancelled) * 1000.0


async def main(runs: int) -> tuple[list[float], list[float]]:
    reply = {"text": TEXT, "chunk_chars": 6, "chunk_delay_seconds": 0.02}
    with FakeProvider({"default": [reply]}) as fake:
        settings = ProviderSettings(
            endpoints={"anthropic": ProviderEndpoint("anthropic", fake.base_url, "sk-bench-" + "x" * 24)},
            default_model="claude-bench",
        )
        async with make_http_client(trust_env=False) as http:
            runtime = Runtime(
                MemoryStore(),
                Catalog.builtin(),
                clock=SystemClock(),
                resolve_contract=contract_resolver("provider", settings),
                worker=ProviderWorker(settings, http),
            )
            figures = [await one_run(runtime, fake) for _ in range(runs)]
    return [f for f, _ in figures], [c for _, c in figures]


def report(name: str, values: list[float]) -> str:
    return f"{name:<14} median {median(values):7.1f} ms   worst {max(values):7.1f} ms"


if __name__ == "__main__":
    p = parser(__doc__, check="the worst cancel is over the target")
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args()
    first, cancel = asyncio.run(main(args.runs))
    print(report("first delta", first))
    print(report("cancel", cancel))
    target = Check(
        f"cancel: the worst under {CANCEL_TARGET_MS:.0f} ms",
        max(cancel) < CANCEL_TARGET_MS,
        f"{max(cancel):.1f} ms",
    )
    sys.exit(conclude([target], check=args.check))

"""What a provider call's HTTP request costs the server's CPU with many calls in flight (issue 24;
not a test: run it and read the figures, or with ``--check`` as a guard).

A holding server (a separate process: its CPU is not counted) reads each request and answers only
when the bench ends, as a slow model does. The bench sends ``--calls`` streaming POSTs of an
Anthropic-sized body through the client the server makes for provider calls
(:func:`orchestration.workers.model_calls.make_http_client`, its pool sized to ``--calls``),
50 every 50 ms, waits until every one is sent, and prints this process's CPU time per request
sent (user + system, each a new connection): once with the pool in shards
(:class:`~orchestration.workers.model_calls.ShardedTransport`, what the server uses) and once as
one pool of ``--calls`` connections (httpx's own pool), interleaved ``--rounds`` times.

    python bench/provider_pool.py [--calls 1000] [--rounds 2] [--check]

``--check`` exits 1 when the sharded pool costs more than 0.8 x the single pool's CPU per request.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2

# Runnable as a plain script from anywhere in the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Check, alternate, conclude, median, parser
from orchestration.workers.model_calls import make_http_client

HOLDER = r"""
import asyncio, sys
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            print("r", flush=True)
            await asyncio.sleep(3600)
    except Exception:
        pass
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""

BODY = {
    "model": "m",
    "max_tokens": 1024,
    "stream": True,
    "messages": [{"role": "user", "content": "x" * 2000}],
}
RATIO = 0.8


def single_pool(calls: int) -> httpx2.AsyncClient:
    """httpx's own pool of ``calls`` connections, otherwise as :func:`make_http_client`."""
    limits = httpx2.Limits(max_connections=calls, max_keepalive_connections=calls)
    return httpx2.AsyncClient(timeout=None, limits=limits, follow_redirects=False)


async def cpu_per_request(http: httpx2.AsyncClient, calls: int) -> float:
    """Milliseconds of this process's CPU per request sent, ``calls`` held at once."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, bufsize=0)  # noqa: ASYNC220
    try:
        assert holder.stdout is not None
        fd = holder.stdout.fileno()
        line = b""
        while not line.endswith(b"\n"):
            line += os.read(fd, 64)
        port = int(line)
        received = 0

        def count() -> None:
            nonlocal received
            received += os.read(fd, 65536).count(b"r")

        loop = asyncio.get_running_loop()
        loop.add_reader(fd, count)
        url = f"http://127.0.0.1:{port}/v1/messages"

        async def call() -> None:
            async with http.stream("POST", url, json=BODY, headers={"x-api-key": "k"}) as response:
                await response.aread()

        before = os.times()
        tasks = []
        for n in range(calls):
            tasks.append(asyncio.create_task(call()))
            if n % 50 == 49:
                await asyncio.sleep(0.05)
        deadline = time.monotonic() + 60
        while received < calls and time.monotonic() < deadline:  # noqa: ASYNC110 (a counter)
            await asyncio.sleep(0.01)
        after = os.times()
        loop.remove_reader(fd)
        if received < calls:
            raise SystemExit(f"only {received} of {calls} requests reached the holder within 60 s")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # the holder never answers
        spent = (after.user - before.user) + (after.system - before.system)
        return spent * 1000 / calls
    finally:
        holder.kill()
        holder.wait()


async def main() -> int:
    p = parser(__doc__, check=f"the sharded pool costs more than {RATIO} x the single pool's CPU per request")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()

    async def sharded_pool() -> float:
        async with make_http_client(max_connections=args.calls, read_timeout=3600) as http:
            return await cpu_per_request(http, args.calls)

    async def one_pool() -> float:
        async with single_pool(args.calls) as http:
            return await cpu_per_request(http, args.calls)

    pools = await alternate({"sharded": sharded_pool, "single": one_pool}, args.rounds)
    sharded, single = pools["sharded"], pools["single"]
    ours, theirs = median(sharded), median(single)
    print(f"provider pool bench (issue 24): {args.calls:,} calls held at once, {args.rounds} rounds, 2 cores")
    print()
    print("| pool | CPU per request sent, median (rounds) |")
    print("|---|---|")
    print(f"| shards of <= 64 (the server's) | {ours:.2f} ms ({', '.join(f'{v:.2f}' for v in sharded)}) |")
    print(f"| one pool of {args.calls:,} | {theirs:.2f} ms ({', '.join(f'{v:.2f}' for v in single)}) |")
    target = Check(f"sharded <= {RATIO} x one pool", ours <= RATIO * theirs, f"{ours / theirs:.2f} x")
    return conclude([target], check=args.check)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

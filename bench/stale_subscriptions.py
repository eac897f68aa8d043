"""Idle CPU of a server left with stale resource subscriptions (not a test: run it and read the figures).

Starts ``construct-mcp serve --transport streamable-http`` on a fresh home, opens ``--sessions``
handshake-era sessions that each send ``resources/subscribe`` for ``--per-session`` run URIs (valid
ids of runs that do not exist: the watcher reads each of them from the store at every poll), then
closes every session with DELETE, as a client that goes away does, waits ``--settle`` seconds and
prints the server's CPU use (user + system, from /proc) over ``--seconds`` seconds.

    python bench/stale_subscriptions.py [--sessions 50] [--per-session 100] [--seconds 10]
                                        [--repo PATH]   # the server code to run (default: this checkout)

Issue 9 measured 5,000 stale subscriptions keeping a core about 60 % busy; with subscriptions tied to
their session, nothing is left to poll once the sessions are gone.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import anyio
import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import cpu_seconds, parser
from tests.acceptance.harness import REPO, SERVER_COMMAND, free_port

HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
VERSION = "2025-11-25"


async def session(http: httpx2.AsyncClient, url: str, uris: list[str]) -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": VERSION,
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        },
    }
    response = await http.post(url, headers=HEADERS, json=init)
    response.raise_for_status()
    headers = {
        **HEADERS,
        "mcp-session-id": response.headers["mcp-session-id"],
        "mcp-protocol-version": VERSION,
    }
    await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    for n, uri in enumerate(uris, start=1):
        sub = {"jsonrpc": "2.0", "id": n, "method": "resources/subscribe", "params": {"uri": uri}}
        (await http.post(url, headers=headers, json=sub)).raise_for_status()
    await http.delete(url, headers=headers)


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="construct-stale-subs-") as tmp:
        home = Path(tmp)
        port = free_port()
        env = {
            "CONSTRUCT_HOME": str(home),
            "CONSTRUCT_LOG_LEVEL": "WARNING",
            "CONSTRUCT_MAX_SUBSCRIPTIONS": str(args.per_session),
            "PYTHONPATH": str(args.repo),
            "PATH": os.environ.get("PATH", ""),
        }
        with (home / "server.log").open("wb") as log:
            process = await anyio.open_process(
                [*SERVER_COMMAND, "serve", "--transport", "streamable-http", "--port", str(port)],
                env=env,
                stdout=log,
                stderr=log,
                cwd=str(args.repo),
            )
            try:
                url = f"http://127.0.0.1:{port}/mcp"
                async with httpx2.AsyncClient(timeout=60) as http:
                    with anyio.fail_after(30):
                        while True:
                            try:
                                await http.get(url)
                                break
                            except httpx2.TransportError:
                                await anyio.sleep(0.1)
                    for s in range(args.sessions):
                        uris = [f"run://run-bench-{s:04d}-{n:04d}" for n in range(args.per_session)]
                        await session(http, url, uris)
                await anyio.sleep(args.settle)
                before = cpu_seconds(process.pid)
                await anyio.sleep(args.seconds)
                used = cpu_seconds(process.pid) - before
                total = args.sessions * args.per_session
                print(
                    f"{total} subscriptions in {args.sessions} closed sessions: server CPU "
                    f"{100 * used / args.seconds:.1f} % of a core over {args.seconds:.0f} s"
                )
            finally:
                process.terminate()
                await process.wait()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--per-session", type=int, default=100)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--settle", type=float, default=2.0)
    p.add_argument("--repo", type=Path, default=REPO)
    anyio.run(bench, p.parse_args())


if __name__ == "__main__":
    main()

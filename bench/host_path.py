"""The host's path over stdio (issue 23), for bench/boundaries.py: what a host that runs tasks on its
own model pays per call, against a bare ``bench_echo`` tool on the same server in the same session.

One server (bench/_echo_server.py over stdio) per store; a host plays ``samples`` inline runs of
architect -> engineer -> reviewer with 1 KB outputs. Timed: each ``orchestrate_start`` (it answers
with the first host task), each ``orchestrate_resume`` that hands in an output and receives the
next task (two per run; the third, which finishes the run, is not timed), and a ``bench_echo``
after each timed call. Each start's request differs (a retried identical start would answer the
run the first one made).
"""

from __future__ import annotations

import secrets
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import echo_client
from bench.shape import OUTPUT

TASKS = ["architect", "engineer", "reviewer"]


@dataclass
class HostPathFigures:
    """Seconds per call, each list in the order measured."""

    resume: list[float] = field(default_factory=list)
    start: list[float] = field(default_factory=list)
    echo: list[float] = field(default_factory=list)


@asynccontextmanager
async def store_url(store: str, tmp: Path, dsn: str) -> AsyncIterator[str]:
    """The store URL a server gets: a fresh store of kind ``store`` (postgres: a throwaway schema,
    migrated, dropped afterwards)."""
    if store == "filesystem":
        yield f"file://{tmp / 'store'}"
    elif store == "sqlite":
        yield f"sqlite:///{tmp / 'construct.db'}"
    elif store == "postgres":
        import asyncpg  # type: ignore[import-untyped]

        from stores import migrate, parse_store_spec

        schema = f"construct_bench_host_{secrets.token_hex(4)}"
        url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
        await migrate(url, home=tmp)
        try:
            yield url
        finally:
            spec = parse_store_spec(url, home=tmp)
            conn = await asyncpg.connect(spec.dsn)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()
    else:
        raise ValueError(store)


async def _timed(client: Any, tool: str, arguments: dict[str, Any], into: list[float] | None) -> Any:
    started = time.perf_counter()
    result = await client.call_tool(tool, arguments)
    if into is not None:
        into.append(time.perf_counter() - started)
    assert not result.is_error, result.content
    return result


async def _echo(client: Any, run_id: str, into: list[float]) -> None:
    from mcp.types import TextContent

    result = await _timed(client, "bench_echo", {"run_id": run_id}, into)
    assert isinstance(result.content[0], TextContent) and len(result.content[0].text) == 1024


async def _play(client: Any, n: int, figures: HostPathFigures | None) -> None:
    """Play ``n`` runs as a host; timed into ``figures`` (None: a warm-up)."""
    for i in range(n):
        starts = None if figures is None else figures.start
        resumes = None if figures is None else figures.resume
        arguments = {"request": f"bench host path {i} {secrets.token_hex(4)}", "chain": TASKS}
        view = (await _timed(client, "orchestrate_start", arguments, starts)).structured_content
        run_id = view["run_id"]
        if figures is not None:
            await _echo(client, run_id, figures.echo)
        for step in range(len(TASKS)):
            action = view["next_action"]
            assert action["kind"] == "run_host_task", (view["status"], action)
            last = step == len(TASKS) - 1
            arguments = {"run_id": run_id, "task_id": action["task_id"], "output": OUTPUT}
            result = await _timed(client, "orchestrate_resume", arguments, None if last else resumes)
            view = result.structured_content
            if figures is not None and not last:
                await _echo(client, run_id, figures.echo)
        assert view["status"] == "completed", view["status"]


async def measure_host_path(store: str, dsn: str, samples: int) -> HostPathFigures:
    """``samples`` starts and ``2 * samples`` resumes (and an echo after each) on a fresh store."""
    figures = HostPathFigures()
    with tempfile.TemporaryDirectory(prefix="construct-bench-host-") as name:
        tmp = Path(name)
        async with store_url(store, tmp, dsn) as url, AsyncExitStack() as stack:
            env = echo_client.server_env(
                tmp, CONSTRUCT_ORCHESTRATION_STORE=url, CONSTRUCT_STORE_FALLBACK="false"
            )
            client = await echo_client.stdio_client(stack, tmp, env)
            await _play(client, 5, None)
            await _play(client, samples, figures)
    return figures

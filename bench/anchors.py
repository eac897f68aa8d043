"""The anchors of bench/boundaries.py: LangGraph (``durability="sync"``; memory, sqlite and
postgres savers) and DBOS (postgres), run with the same shape on the same databases. They need the
optional ``bench`` extra (``pip install -e '.[bench]'``); without it each says what it skipped."""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from bench.harness import median
from bench.shape import CONCURRENT, OUTPUT, STEPS


@dataclass
class AnchorFigures:
    per_step: dict[str, float] = field(default_factory=dict)
    concurrent: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def langgraph_graph(checkpointer: Any) -> Any:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    state = TypedDict("State", {f"o{i:02d}": str for i in range(STEPS)}, total=False)  # type: ignore[misc]

    def node(i: int) -> Callable[[dict[str, str]], Any]:
        async def run(s: dict[str, str]) -> dict[str, str]:
            _prompt = s.get(f"o{i - 1:02d}", "")  # what the step reads: the previous output
            return {f"o{i:02d}": OUTPUT}

        return run

    builder: Any = StateGraph(state)
    for i in range(STEPS):
        builder.add_node(f"n{i:02d}", node(i))
        builder.add_edge(START if i == 0 else f"n{i - 1:02d}", f"n{i:02d}")
    builder.add_edge(f"n{STEPS - 1:02d}", END)
    return builder.compile(checkpointer=checkpointer)


async def langgraph_chain(graph: Any) -> float:
    """One 50-step graph run with durability "sync"; seconds per superstep."""
    config = {"configurable": {"thread_id": secrets.token_hex(8)}}
    started = time.perf_counter()
    await graph.ainvoke({}, config, durability="sync")
    return (time.perf_counter() - started) / STEPS


async def langgraph_concurrent(graph: Any) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(langgraph_chain(graph) for _ in range(CONCURRENT)))
    return CONCURRENT * STEPS / (time.perf_counter() - started)


async def measure_langgraph(figures: AnchorFigures, dsn: str, runs: int, concurrent: bool) -> None:
    try:
        from langgraph.checkpoint.memory import InMemorySaver
    except ImportError:
        figures.skipped.append("LangGraph (not installed: pip install -e '.[bench]')")
        return

    async def series(name: str, graph: Any, with_concurrent: bool) -> None:
        await langgraph_chain(graph)  # warm-up
        figures.per_step[name] = median([await langgraph_chain(graph) for _ in range(runs)])
        if with_concurrent:
            figures.concurrent[name] = median([await langgraph_concurrent(graph) for _ in range(3)])

    await series("memory", langgraph_graph(InMemorySaver()), False)
    try:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        with tempfile.TemporaryDirectory(prefix="langgraph-bench-") as tmp:
            async with AsyncSqliteSaver.from_conn_string(str(Path(tmp) / "lg.db")) as saver:
                await series("sqlite", langgraph_graph(saver), concurrent)
    except ImportError:
        figures.skipped.append("LangGraph sqlite (langgraph-checkpoint-sqlite not installed)")
    if not dsn:
        figures.skipped.append("LangGraph postgres (no Postgres)")
        return
    try:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool
    except ImportError:
        figures.skipped.append("LangGraph postgres (langgraph-checkpoint-postgres not installed)")
        return
    import asyncpg  # type: ignore[import-untyped]

    schema = f"langgraph_bench_{secrets.token_hex(4)}"
    conn = await asyncpg.connect(dsn)
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        async with AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=CONCURRENT,
            open=False,
            kwargs={
                "autocommit": True,
                "prepare_threshold": 0,
                "row_factory": dict_row,
                "options": f"-c search_path={schema}",
            },
        ) as pool:
            pg_saver = AsyncPostgresSaver(cast(Any, pool))
            await pg_saver.setup()
            await series("postgres", langgraph_graph(pg_saver), concurrent)
    finally:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()


async def measure_dbos(figures: AnchorFigures, dsn: str, runs: int, concurrent: bool) -> None:
    try:
        from dbos import DBOS
    except ImportError:
        figures.skipped.append("DBOS (not installed: pip install -e '.[bench]')")
        return
    if not dsn:
        figures.skipped.append("DBOS (no Postgres)")
        return
    import asyncpg

    database = f"construct_bench_dbos_{secrets.token_hex(4)}"
    base, _, _ = dsn.rpartition("/")
    url = f"{base}/{database}"

    @DBOS.step()
    async def step(i: int, previous: str) -> str:
        return OUTPUT

    @DBOS.workflow()
    async def chain(n: int) -> str:
        previous = ""
        for i in range(n):
            previous = await step(i, previous)
        return previous

    async def one() -> float:
        started = time.perf_counter()
        handle = await DBOS.start_workflow_async(chain, STEPS)
        await handle.get_result()
        return (time.perf_counter() - started) / STEPS

    async def many() -> float:
        started = time.perf_counter()
        handles = [await DBOS.start_workflow_async(chain, STEPS) for _ in range(CONCURRENT)]
        for handle in handles:
            await handle.get_result()
        return CONCURRENT * STEPS / (time.perf_counter() - started)

    DBOS(
        config=cast(
            Any,
            {
                "name": "construct-bench",
                "system_database_url": url,
                "run_admin_server": False,
                "log_level": "WARNING",
            },
        )
    )
    try:
        DBOS.launch()
        await one()  # warm-up
        figures.per_step["postgres"] = median([await one() for _ in range(runs)])
        if concurrent:
            figures.concurrent["postgres"] = median([await many() for _ in range(3)])
    finally:
        DBOS.destroy(destroy_registry=True)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await conn.close()


# -------------------------------------------------------------------------------------------- MCP

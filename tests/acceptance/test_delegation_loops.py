"""Issue 22, finding 2, through real processes: delegation cannot loop. A construct-mcp whose agent
is itself refuses the delegated start (``delegation_loop``) and its run fails, with no remote run
made; a chain of two servers A → B → A is refused at A, and A's run fails with the same code; a
start whose ``_meta`` hop count is over ``max_depth`` is refused (``delegation_depth_exceeded``),
and so is a malformed one (``invalid_argument``), with nothing recorded. Every store; the servers
run the inline backend (agent steps need no model)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.acceptance.harness import call, free_port, text_of
from tests.acceptance.processes import http_server
from tests.acceptance.store_targets import BACKENDS, StoreTarget, store_target

pytestmark = pytest.mark.slow

#: the ``_meta`` key the README documents (``orchestration.core.hops.DELEGATION_META``)
DELEGATION_META = "construct-mcp/delegation"


def agent_config(agent_port: int, chain: str, next_chain: str) -> str:
    """A server whose chain ``chain`` has one step: delegate ``next_chain`` to the server on
    ``agent_port``."""
    arguments = f'{{ chain = "{next_chain}", request = "{{request}}" }}'
    step = f'{{ name = "hop", agent = "next", tool = "orchestrate_start", arguments = {arguments} }}'
    return f"""
[agents.next]
url = "http://127.0.0.1:{agent_port}/mcp"
follow_wait_seconds = 1
call_timeout_seconds = 10

[chains.{chain}]
steps = [{step}]
"""


@asynccontextmanager
async def server(target: StoreTarget, home: Path, config: str, port: int) -> AsyncIterator[Client]:
    await anyio.Path(home).mkdir(parents=True, exist_ok=True)
    await anyio.Path(home / "construct.toml").write_text(config)
    async with (
        http_server(target.env(home), home / "server.log", port),
        Client(f"http://127.0.0.1:{port}/mcp") as client,
    ):
        yield client


async def runs_of(client: Client) -> list[dict[str, Any]]:
    page = await call(client, "runs_list")
    runs: list[dict[str, Any]] = page["runs"]
    return runs


async def ended(client: Client, run_id: str) -> dict[str, Any]:
    """The run once it ended; fails (rather than waiting forever) as soon as more runs than the
    two a bounded delegation may make exist: a loop makes runs without end."""
    with anyio.fail_after(60):
        while True:
            view = await call(client, "run_status", run_id=run_id, wait_seconds=1)
            if view["status_kind"] == "terminal":
                return await call(client, "run_status", run_id=run_id, detail="full")
            assert len(await runs_of(client)) <= 2, "the delegation loops"


def hop_error(view: dict[str, Any]) -> dict[str, Any]:
    task = next(t for t in view["tasks"] if t["task_id"] == "hop")
    error: dict[str, Any] = task["error"]
    return error


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_server_whose_agent_is_itself_refuses_the_delegated_start(
    tmp_path: Path, backend: str
) -> None:
    port = free_port()
    async with (
        store_target(backend, tmp_path / "store") as target,
        server(target, tmp_path / "a", agent_config(port, "again", "again"), port) as client,
    ):
        started = await call(client, "orchestrate_start", chain="again", request="Loop", wait_seconds=0)
        view = await ended(client, started["run_id"])
        runs = await runs_of(client)
    assert view["status"] == "failed", view
    error = hop_error(view)
    assert error["code"] == "delegation_loop" and not error["retryable"], error
    assert len(view["tasks"][0]["attempts"]) == 1  # refused once, not retried
    assert [r["run_id"] for r in runs] == [started["run_id"]]  # no remote run was made


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_cycle_of_two_servers_is_refused_where_it_comes_back(tmp_path: Path, backend: str) -> None:
    port_a, port_b = free_port(), free_port()
    async with (
        store_target(backend, tmp_path / "store-a") as store_a,
        store_target(backend, tmp_path / "store-b") as store_b,
        server(store_a, tmp_path / "a", agent_config(port_b, "ping", "pong"), port_a) as a,
        server(store_b, tmp_path / "b", agent_config(port_a, "pong", "ping"), port_b) as b,
    ):
        started = await call(a, "orchestrate_start", chain="ping", request="Ping", wait_seconds=0)
        view = await ended(a, started["run_id"])
        runs_a, runs_b = await runs_of(a), await runs_of(b)
    # B's run delegated back to A, which refused it; B's run failed so, and A's with it.
    assert view["status"] == "failed", view
    assert hop_error(view)["code"] == "delegation_loop", hop_error(view)
    assert [r["run_id"] for r in runs_a] == [started["run_id"]]
    assert [r["status"] for r in runs_b] == ["failed"], runs_b


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_start_over_max_depth_hops_is_refused_and_records_nothing(
    tmp_path: Path, backend: str
) -> None:
    port = free_port()
    async with (
        store_target(backend, tmp_path / "store") as target,
        server(target, tmp_path / "a", "", port) as client,
    ):
        arguments = {"request": "Deep", "chain": ["writer"], "wait_seconds": 0}
        deep = {DELEGATION_META: {"hops": 4, "servers": ["srv-elsewhere"]}}
        refused = await client.call_tool("orchestrate_start", arguments, meta=deep)  # type: ignore[arg-type]
        bad = {DELEGATION_META: {"hops": "many"}}
        malformed = await client.call_tool("orchestrate_start", arguments, meta=bad)  # type: ignore[arg-type]
        assert await runs_of(client) == []
        ok = {DELEGATION_META: {"hops": 3, "servers": ["srv-elsewhere"]}}
        admitted = await client.call_tool("orchestrate_start", arguments, meta=ok)  # type: ignore[arg-type]
        runs = await runs_of(client)
        async with target.opened() as store:
            head = await store.load(runs[0]["run_id"])
    assert refused.is_error and text_of(refused).startswith("delegation_depth_exceeded: "), text_of(refused)
    assert "max_depth" in text_of(refused)
    assert malformed.is_error and text_of(malformed).startswith("invalid_argument: "), text_of(malformed)
    assert not admitted.is_error, text_of(admitted)
    assert len(runs) == 1  # hop 3 is within the default max_depth (3)
    assert head.delegation is not None and head.delegation.hops == 3

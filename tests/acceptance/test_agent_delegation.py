"""Issue 13, part 2, through real processes: a parent construct-mcp (filesystem store) whose chain's
middle step delegates a ``review-loop`` run to a second construct-mcp (sqlite store) over Streamable
HTTP with a bearer token (then every store in each role: :data:`PAIRS`). Both run the provider
backend against the fake provider, so no API key is needed. One trial SIGKILLs the parent while the
remote run is in flight, the other the remote server; both finish with one remote run, followed by
every attempt of the step (the remote's ``runs_list``), and the token is nowhere in the parent's
records or log."""

from __future__ import annotations

import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from mcp import Client

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.runtime import Runtime
from orchestration.workers.agent_calls import AgentEndpoint
from orchestration.workers.mcp_agents import AgentWorker, Workers
from stores.memory import MemoryStore
from tests.acceptance.harness import REPO, call, free_port, full_view, read_log, server_env
from tests.acceptance.processes import http_server
from tests.acceptance.store_targets import StoreTarget, store_target
from tests.fakes.fake_provider import FakeProvider
from tests.unit.helpers import play

pytestmark = pytest.mark.slow

TOKEN = "remote-token-" + secrets.token_hex(16)
VERDICT = '{"verdict": "approve", "notes": "fine"}'

REVIEW_STEP = (
    '{ name = "review", agent = "reviewer2", tool = "orchestrate_start", output_step = "engineer", '
    'arguments = { chain = "review-loop", request = "Build this.\\n\\n{outputs.architect}" } }'
)
PARENT_CONFIG = f"""
[agents.reviewer2]
url = "http://127.0.0.1:PORT/mcp"
token_env = "REVIEWER2_TOKEN"
follow_wait_seconds = 1
call_timeout_seconds = 10

[chains.delegated]
steps = ["architect", {REVIEW_STEP}, "writer"]
"""


def scenario() -> dict[str, Any]:
    return {
        # the parent's own steps (its request carries [run:parent])
        "parent/architect": [{"text": "design from the parent's architect"}],
        "parent/writer": [{"text": "the parent's docs"}],
        # the remote review-loop: a slow engineer, so that the kill lands while it works
        "architect": [{"text": "the remote design"}],
        "engineer": [{"delay_seconds": 6, "text": "the remote code"}, {"text": "the remote code"}],
        "reviewer": [{"text": VERDICT}],
    }


def provider_vars(fake: FakeProvider) -> dict[str, str]:
    """The provider backend against the fake provider, and short leases (a killed server's runs
    are taken over within seconds)."""
    return {
        "CONSTRUCT_WORKER_BACKEND": "provider",
        "CONSTRUCT_MODEL": "open/test-model",
        "CONSTRUCT_OPENROUTER_BASE_URL": f"{fake.base_url}/api",
        "OPENROUTER_API_KEY": "sk-or-test",
        "CONSTRUCT_LEASE_TTL_SECONDS": "2",
    }


def provider_env(home: Path, fake: FakeProvider) -> dict[str, str]:
    return server_env(home, **provider_vars(fake))


#: (parent's store, remote's store): the pair the issue names first, then every store in each role
PAIRS = [("filesystem", "sqlite"), ("sqlite", "postgres"), ("postgres", "filesystem")]


@dataclass
class Pair:
    tmp: Path
    fake: FakeProvider
    remote_port: int
    parent_store: StoreTarget
    remote_store: StoreTarget

    @property
    def parent_home(self) -> Path:
        return self.tmp / "parent"

    @property
    def remote_home(self) -> Path:
        return self.tmp / "remote"

    def parent_env(self) -> dict[str, str]:
        extra = {"REVIEWER2_TOKEN": TOKEN, "CONSTRUCT_MAX_ATTEMPTS": "8"}
        return self.parent_store.env(self.parent_home, **provider_vars(self.fake), **extra)

    def remote_env(self) -> dict[str, str]:
        return self.remote_store.env(self.remote_home, **provider_vars(self.fake), CONSTRUCT_AUTH_TOKEN=TOKEN)

    @asynccontextmanager
    async def parent(self) -> AsyncIterator[tuple[Process, Client]]:
        log = self.parent_home / "server.log"
        async with http_server(self.parent_env(), log) as (process, port):
            client = Client(f"http://127.0.0.1:{port}/mcp")
            async with client:
                yield process, client

    @asynccontextmanager
    async def remote(self) -> AsyncIterator[Process]:
        log = self.remote_home / "server.log"
        async with http_server(self.remote_env(), log, self.remote_port) as (process, _):
            yield process


@asynccontextmanager
async def make_pair(tmp_path: Path, fake: FakeProvider, backends: tuple[str, str]) -> AsyncIterator[Pair]:
    parent_backend, remote_backend = backends
    async with (
        store_target(parent_backend, tmp_path / "parent-store") as parent_store,
        store_target(remote_backend, tmp_path / "remote-store") as remote_store,
    ):
        pair = Pair(tmp_path, fake, free_port(), parent_store, remote_store)
        for home in (pair.parent_home, pair.remote_home):
            home.mkdir(exist_ok=True)
        config = PARENT_CONFIG.replace("PORT", str(pair.remote_port))
        (pair.parent_home / "construct.toml").write_text(config)
        yield pair


async def until(client: Client, run_id: str, predicate: Any, seconds: float = 60) -> dict[str, Any]:
    """The run's full view once ``predicate`` holds for it: the predicates read the review step's
    attempts, which only the full view carries."""
    with anyio.fail_after(seconds):
        while True:
            view = await call(client, "run_status", run_id=run_id, wait_seconds=1, detail="full")
            if predicate(view):
                return view
            await anyio.sleep(0.1)


def review_of(view: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in view["tasks"] if t["task_id"] == "review")


def remote_run_known(view: dict[str, Any]) -> bool:
    attempts = review_of(view)["attempts"]
    return bool(attempts) and attempts[-1]["remote_run_id"] is not None


async def remote_runs(pair: Pair) -> list[dict[str, Any]]:
    """The remote's ``runs_list``, read with the token (its HTTP surface needs it)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(headers=headers) as http:
        url = f"http://127.0.0.1:{pair.remote_port}/mcp"
        async with Client(streamable_http_client(url, http_client=http)) as client:
            page = await call(client, "runs_list")
            runs: list[dict[str, Any]] = page["runs"]
            return runs


async def check_finished(
    view: dict[str, Any], record: dict[str, Any], runs: list[dict[str, Any]], pair: Pair
) -> str:
    """The common outcome of both trials: the parent completed with the remote engineer's code as
    the review step's output (``view``: run_status for the task, which carries its whole output);
    one remote run, completed, which every attempt of the step followed (``record``: the full view,
    where the attempts are)."""
    assert view["status"] == "completed", (view.get("error"), review_of(record).get("attempts"))
    assert review_of(view)["output"] == "the remote code"
    assert review_of(record)["output"] == "the remote code"
    assert len(runs) == 1, runs
    remote_id = runs[0]["run_id"]
    assert runs[0]["status"] == "completed"
    attempts = review_of(record)["attempts"]
    assert {a["remote_run_id"] for a in attempts} == {remote_id}, attempts
    assert attempts[0]["follows"] is None and all(a["follows"] == 1 for a in attempts[1:])
    assert not any(a["telemetry"]["possible_duplicate_call"] for a in attempts)
    assert pair.fake.calls_for("reviewer") == 1
    # The token: in the remote's request headers only, never in the parent's records or log.
    stored = "".join(
        head.model_dump_json() + "".join(f.model_dump_json() for f in facts)
        for head, facts in await pair.parent_store.runs()
    )
    assert "the remote code" in stored and TOKEN not in stored
    assert TOKEN not in read_log(pair.parent_home / "server.log")
    return str(remote_id)


def pair_id(backends: tuple[str, str]) -> str:
    return f"{backends[0]}-parent-{backends[1]}-remote"


async def start_delegated(client: Client) -> str:
    view = await call(
        client, "orchestrate_start", chain="delegated", request="[run:parent] Build a cache", wait_seconds=0
    )
    await until(client, view["run_id"], remote_run_known)
    return str(view["run_id"])


@pytest.mark.parametrize("backends", PAIRS, ids=pair_id)
async def test_sigkill_of_the_parent_while_the_remote_run_works(
    tmp_path: Path, backends: tuple[str, str]
) -> None:
    with FakeProvider(scenario()) as fake:
        async with make_pair(tmp_path, fake, backends) as pair, pair.remote():
            async with pair.parent() as (parent, client):
                run_id = await start_delegated(client)
                awaiting = await call(client, "run_status", run_id=run_id)
                assert awaiting["status"] == "awaiting_agent", awaiting  # no lease, no slot held
                parent.kill()  # SIGKILL, while the remote engineer is still at work
                await parent.wait()
            assert fake.calls_for("engineer") == 1
            async with pair.parent() as (_, client):
                await until(client, run_id, lambda v: v["status_kind"] == "terminal")
                view = await call(client, "run_status", run_id=run_id, task_id="review")
                record = await full_view(client, run_id)
            await check_finished(view, record, await remote_runs(pair), pair)
            facts = next(f for h, f in await pair.parent_store.runs() if h.run_id == run_id)
    # The restarted parent's sweep followed the same attempt's remote run: one outcome recorded.
    attempts = review_of(record)["attempts"]
    assert [a["error"]["code"] if a["error"] else None for a in attempts] == [None]
    assert [f.type for f in facts if getattr(f, "task_id", None) == "review"] == [
        "attempt_started",
        "remote_run_started",
        "task_completed",
    ]
    assert fake.calls_for("engineer") == 1, "the remote run was not started again"


def unreachable_seen(view: dict[str, Any]) -> bool:
    return any((a["error"] or {}).get("code") == "agent_unreachable" for a in review_of(view)["attempts"])


@pytest.mark.parametrize("backends", PAIRS, ids=pair_id)
async def test_sigkill_of_the_remote_server_while_its_run_works(
    tmp_path: Path, backends: tuple[str, str]
) -> None:
    with FakeProvider(scenario()) as fake:
        async with make_pair(tmp_path, fake, backends) as pair, pair.parent() as (_, client):
            async with pair.remote() as remote:
                run_id = await start_delegated(client)
                remote.kill()  # SIGKILL, while its engineer is at work
                await remote.wait()
            # The parent cannot reach it meanwhile: its attempts fail as agent_unreachable.
            await until(client, run_id, unreachable_seen, seconds=30)
            async with pair.remote():
                await until(client, run_id, lambda v: v["status_kind"] == "terminal")
                view = await call(client, "run_status", run_id=run_id, task_id="review")
                record = await full_view(client, run_id)
                await check_finished(view, record, await remote_runs(pair), pair)
    codes = {a["error"]["code"] for a in review_of(record)["attempts"] if a["error"]}
    assert codes == {"agent_unreachable"}, codes
    # The remote's orphaned engineer call was made again by the restarted remote: its own affair.
    assert fake.calls_for("engineer") == 2


async def test_a_stdio_agent_runs_a_delegated_chain_and_a_plain_tool(tmp_path: Path) -> None:
    """A stdio agent (``command``): another construct-mcp spawned for each call, on its own
    filesystem store; the parent (in process) delegates a one-step chain, then calls a plain tool."""
    with FakeProvider({"writer": [{"text": "the remote docs"}]}) as fake:
        remote_home = tmp_path / "remote"
        endpoint = AgentEndpoint(
            name="local",
            command=(sys.executable, "-m", "server", "serve"),
            env=provider_env(remote_home, fake),
            cwd=str(REPO),
            follow_wait_seconds=1,
        )
        steps: list[Any] = [
            {
                "name": "docs",
                "agent": "local",
                "tool": "orchestrate_start",
                "arguments": {"chain": ["writer"]},
            },
            {"name": "listing", "agent": "local", "tool": "runs_list", "arguments": {"limit": 5}},
        ]
        raw = {"agents": {"local": {}}, "chains": {"c": {"steps": steps}}}
        runtime = Runtime(
            MemoryStore(),
            Catalog.builtin().extended(raw, "construct.toml", Path(".")),
            worker=Workers(None, AgentWorker({"local": endpoint})),
        )
        # The remote's request is the argument's: the step gives none, so the remote refuses it.
        head, _ = await runtime.start(StartRequest(request="Document the cache", chain="c"))
        with anyio.fail_after(120):
            await play(runtime, head.run_id)  # the drive, and the follower of the remote run
        failed = await runtime.status(head.run_id)
        assert failed.status == RunStatus.FAILED and failed.error is not None
        assert failed.error.code == "tool_error" and "invalid_argument" in failed.error.message

        fixed = [{**steps[0], "arguments": {"chain": ["writer"], "request": "{request}"}}, steps[1]]
        runtime.catalog = Catalog.builtin().extended(
            {"agents": {"local": {}}, "chains": {"c": {"steps": fixed}}}, "construct.toml", Path(".")
        )
        head, _ = await runtime.start(StartRequest(request="Document the cache", chain="c"))
        with anyio.fail_after(120):
            await play(runtime, head.run_id)  # the drive, and the follower of the remote run
        done = await runtime.snapshot(head.run_id)
    assert done.head.status == RunStatus.COMPLETED, done.head.error
    assert done.outputs["docs"] == "the remote docs"
    remote_id = done.head.task("docs").attempts[0].remote_run_id
    assert remote_id is not None and remote_id in done.outputs["listing"]
    assert fake.calls() == {"writer": 1}

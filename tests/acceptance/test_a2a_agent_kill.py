"""An A2A agent step through real processes: a construct-mcp (the provider backend against the fake
provider, on the filesystem and on sqlite) whose chain's middle step sends its message to an A2A
agent served by the a2a-sdk's own server (:mod:`tests.fakes.a2a_peer`, a process of its own,
behind a bearer token). The parent is SIGKILLed while the remote task works; restarted on the same
store, it follows the same task to its end: the step completes with the task's artifacts as its
output, and the agent received exactly one message."""

from __future__ import annotations

import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.acceptance.harness import REPO, call, free_port, full_view, read_log
from tests.acceptance.processes import http_server
from tests.acceptance.store_targets import StoreTarget, store_target
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

TOKEN = "peer-token-" + secrets.token_hex(16)

CONFIG = """
[agents.peer]
protocol = "a2a"
url = "http://127.0.0.1:PORT"
token_env = "PEER_TOKEN"
paused_poll_seconds = 0.2
poll_cap_seconds = 1
call_timeout_seconds = 10

[chains.delegated]
steps = ["architect", { name = "review", agent = "peer", message = "review {outputs.architect}" }, "writer"]
"""


@asynccontextmanager
async def peer(port: int, log: Path, *extra: str) -> AsyncIterator[None]:
    """The A2A agent as a process on ``port``: 6 s of work per task, each message id logged;
    ``extra``: more of its arguments."""
    command = [sys.executable, "-m", "tests.fakes.a2a_peer", "--port", str(port), "--token", TOKEN]
    command += ["--log", str(log), "--work-seconds", "6", *extra]
    with (log.parent / "peer.err").open("ab") as err:
        process = await anyio.open_process(command, cwd=str(REPO), stdout=err, stderr=err)
        try:
            with anyio.fail_after(30):
                while True:
                    try:
                        stream = await anyio.connect_tcp("127.0.0.1", port)
                    except OSError:
                        await anyio.sleep(0.05)
                        continue
                    await stream.aclose()
                    break
            yield
        finally:
            process.kill()
            await process.aclose()


def peer_env(store: StoreTarget, home: Path, fake: FakeProvider) -> dict[str, str]:
    """The server's environment: ``store``, the provider backend on ``fake``, short leases, and
    the agent's token in ``PEER_TOKEN``."""
    return store.env(
        home,
        CONSTRUCT_WORKER_BACKEND="provider",
        CONSTRUCT_MODEL="open/test-model",
        CONSTRUCT_OPENROUTER_BASE_URL=f"{fake.base_url}/api",
        OPENROUTER_API_KEY="sk-or-test",
        CONSTRUCT_LEASE_TTL_SECONDS="2",
        PEER_TOKEN=TOKEN,
    )


def review_of(view: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in view["tasks"] if t["task_id"] == "review")


async def until(client: Client, run_id: str, predicate: Any, seconds: float = 60) -> dict[str, Any]:
    with anyio.fail_after(seconds):
        while True:
            view = await call(client, "run_status", run_id=run_id, wait_seconds=1, detail="full")
            if predicate(view):
                return view
            await anyio.sleep(0.1)


def task_known(view: dict[str, Any]) -> bool:
    attempts = review_of(view)["attempts"]
    return bool(attempts) and attempts[-1]["remote_run_id"] is not None


@pytest.mark.parametrize("backend", ["filesystem", "sqlite"])
async def test_sigkill_of_the_server_while_the_a2a_task_works(tmp_path: Path, backend: str) -> None:
    scenario = {"architect": [{"text": "the design"}], "writer": [{"text": "the docs"}]}
    home, port, log = tmp_path / "home", free_port(), tmp_path / "messages.log"
    home.mkdir()
    (home / "construct.toml").write_text(CONFIG.replace("PORT", str(port)))
    with FakeProvider(scenario) as fake:
        async with store_target(backend, tmp_path / "store") as store, peer(port, log):
            env = peer_env(store, home, fake)
            async with http_server(env, home / "server.log") as (process, server_port):
                async with Client(f"http://127.0.0.1:{server_port}/mcp") as client:
                    view = await call(
                        client, "orchestrate_start", chain="delegated", request="a cache", wait_seconds=0
                    )
                    run_id = str(view["run_id"])
                    await until(client, run_id, task_known)
                    awaiting = await call(client, "run_status", run_id=run_id)
                    assert awaiting["status"] == "awaiting_agent", awaiting
                process.kill()  # SIGKILL while the remote task works
                await process.wait()
            assert log.read_text().split() and len(log.read_text().split()) == 1
            async with (
                http_server(env, home / "server.log") as (_, server_port),
                Client(f"http://127.0.0.1:{server_port}/mcp") as client,
            ):
                done = await until(client, run_id, lambda v: v["status_kind"] == "terminal")
                record = await full_view(client, run_id)
            runs = await store.runs()
    assert done["status"] == "completed", (done.get("error"), review_of(record)["attempts"])
    assert review_of(record)["output"] == "reviewed:\nreview the design\nok"
    attempts = review_of(record)["attempts"]
    assert len(attempts) == 1 and attempts[0]["error"] is None, attempts
    assert len(log.read_text().split()) == 1, "the message was sent again"
    facts = next(f for h, f in runs if h.run_id == run_id)
    assert [f.type for f in facts if getattr(f, "task_id", None) == "review"] == [
        "attempt_started",
        "remote_run_started",
        "task_completed",
    ]
    stored = "".join(h.model_dump_json() + "".join(f.model_dump_json() for f in fs) for h, fs in runs)
    assert TOKEN not in stored and TOKEN not in read_log(home / "server.log")

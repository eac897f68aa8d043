"""Who may do what, and who did: named tokens with roles over Streamable HTTP (a real server
subprocess, the official client), and decision records made over HTTP, stdio and the CLI, as the
run view and the timeline show them."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ResourceUpdated
from mcp.shared.exceptions import MCPDeprecationWarning

from orchestration.chains.catalog import Catalog
from tests.acceptance.harness import (
    SERVER_COMMAND,
    call,
    call_error,
    free_port,
    full_view,
    play_host,
    read_log,
    server_env,
    stdio_client_for,
)
from tests.acceptance.store_targets import BACKENDS, store_target
from tests.acceptance.test_mcp_http import http_server

pytestmark = pytest.mark.slow

ALICE = "alice-token-" + "3b8e61f0c2d94a57"  # read, operate
BOB = "bob-token-" + "9c04d7e2a1f65b38"  # read, approve (from the environment)
CAROL = "carol-token-" + "5f2a8c1e7d3b9064"  # read, operate, approve; only her own runs
DAVE = "dave-token-" + "0e7b3d9a6c2f4185"  # approve only
TOKENS = (ALICE, BOB, CAROL, DAVE)

CONFIG = f"""
[tokens.alice]
token = "{ALICE}"
roles = ["read", "operate"]

[tokens.bob]
token_env = "BOB_TOKEN"
roles = ["approve", "read"]

[tokens.carol]
token = "{CAROL}"
roles = ["read", "operate", "approve"]
own_runs_only = true

[tokens.dave]
token = "{DAVE}"
roles = ["approve"]
"""


@asynccontextmanager
async def as_identity(port: int, token: str, mode: str = "auto") -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as authed,
        Client(
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=authed), mode=mode
        ) as client,
    ):
        yield client


async def run_uris(client: Client) -> list[str]:
    """The runs among the listed resources (the run panel, ``ui://construct/run``, is listed too)."""
    return [str(r.uri) for r in (await client.list_resources()).resources if str(r.uri).startswith("run://")]


def assert_forbidden(text: str, role: str | None = None) -> None:
    assert text.startswith("forbidden: "), text
    if role is not None:
        assert f"needs the role '{role}'" in text, text
    for token in TOKENS:
        assert token not in text


async def test_roles_are_enforced_per_tool_over_streamable_http(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG)
    async with (
        http_server(tmp_path, "streamable-http", BOB_TOKEN=BOB) as port,
        as_identity(port, ALICE) as alice,
        as_identity(port, BOB) as bob,
        as_identity(port, CAROL) as carol,
    ):
        # alice operates: she starts and runs the chain, but may not decide its gate.
        view = await call(alice, "orchestrate_start", request="Roles, please.", approve_before=["engineer"])
        run_id = view["run_id"]
        assert (await full_view(alice, run_id))["started_by"] == "alice"
        view = await play_host(alice, view)
        gate = view["next_action"]["gate_id"]
        text = await call_error(alice, "orchestrate_approve", run_id=run_id, decision="approve", gate_id=gate)
        assert_forbidden(text, "approve")
        assert "identity 'alice' has operate, read" in text

        # bob reads and approves, and may not operate.
        text = await call_error(bob, "orchestrate_start", request="Not bob's to start.")
        assert_forbidden(text, "operate")
        assert_forbidden(await call_error(bob, "orchestrate_resume", run_id=run_id), "operate")
        assert_forbidden(await call_error(bob, "orchestrate_cancel", run_id=run_id), "operate")
        assert (await call(bob, "run_status", run_id=run_id))["status"] == "awaiting_approval"
        assert (await call(bob, "run_events", run_id=run_id))["events"][0]["type"] == "run_created"
        # He decides as himself: another name is refused, not recorded.
        text = await call_error(
            bob, "orchestrate_approve", run_id=run_id, decision="approve", gate_id=gate, approver="mallory"
        )
        assert_forbidden(text)
        assert "'bob'" in text
        view = await call(
            bob,
            "orchestrate_approve",
            run_id=run_id,
            decision="approve",
            gate_id=gate,
            comment="ok",
            wait_seconds=0,
        )
        decided = next(g for g in view["gates"] if g["gate_id"] == gate)
        assert (decided["approver"], decided["channel"], decided["verified"]) == ("bob", "http", True)
        assert decided["comment"] == "ok"
        recorded = next(g for g in (await full_view(bob, run_id))["gates"] if g["gate_id"] == gate)
        assert recorded["decided_at"] is not None
        # A repeat is a no-op, with his name given explicitly or not.
        repeat = {"run_id": run_id, "decision": "approve", "gate_id": gate, "comment": "ok"}
        again = await call(bob, "orchestrate_approve", **repeat, approver="bob")
        assert next(g for g in again["gates"] if g["gate_id"] == gate) == decided
        settled = await full_view(bob, run_id)
        assert next(g for g in settled["gates"] if g["gate_id"] == gate) == recorded
        assert await call(bob, "orchestrate_approve", **repeat) == again
        assert (await full_view(bob, run_id))["version"] == settled["version"]

        # carol sees only the runs she started.
        mine = await call(carol, "orchestrate_start", request="Carol's own.", chain=["writer"])
        assert (await full_view(carol, mine["run_id"]))["started_by"] == "carol"
        assert_forbidden(await call_error(carol, "run_status", run_id=run_id))
        assert_forbidden(await call_error(carol, "run_events", run_id=run_id))
        with pytest.raises(MCPError, match="forbidden"):
            await carol.read_resource(f"run://{run_id}/events")
        assert (await call(carol, "run_events", run_id=mine["run_id"]))["events"]
        assert_forbidden(await call_error(carol, "orchestrate_cancel", run_id=run_id))
        assert_forbidden(
            await call_error(carol, "orchestrate_approve", run_id=run_id, decision="reject", gate_id=gate)
        )
        assert_forbidden(await call_error(carol, "orchestrate_approve", run_id=run_id, decision="reject"))
        assert [r["run_id"] for r in (await call(carol, "runs_list"))["runs"]] == [mine["run_id"]]
        assert await run_uris(carol) == [f"run://{mine['run_id']}"]
        with pytest.raises(MCPError, match="forbidden"):
            await carol.read_resource(f"run://{run_id}")
        # An idempotency key someone else used is another key for carol: her own run, theirs unnamed.
        theirs = await call(
            alice, "orchestrate_start", request="Keyed.", chain=["writer"], idempotency_key="k-1"
        )
        keyed = await call(
            carol, "orchestrate_start", request="Keyed.", chain=["writer"], idempotency_key="k-1"
        )
        assert keyed["run_id"] != theirs["run_id"] and theirs["run_id"] not in json.dumps(keyed)

        # Without the read role there is nothing to list; the others see every run.
        listed = {r["run_id"] for r in (await call(bob, "runs_list"))["runs"]}
        assert listed == {run_id, mine["run_id"], theirs["run_id"], keyed["run_id"]}
        assert len(await run_uris(alice)) == 4
        # Discovery needs only a valid token.
        assert {p.name for p in (await bob.list_prompts()).prompts} == set(Catalog.builtin().chains)

        # dave may only decide gates (and connects the handshake way: the same rules hold).
        async with as_identity(port, DAVE, mode="legacy") as dave:
            assert_forbidden(await call_error(dave, "run_status", run_id=run_id), "read")
            assert_forbidden(await call_error(dave, "run_events", run_id=run_id, wait_seconds=5), "read")
            assert_forbidden(await call_error(dave, "runs_list"), "read")
            assert await run_uris(dave) == []
            refused = "forbidden: subscribing to a run resource needs the role 'read'"
            with pytest.warns(MCPDeprecationWarning), pytest.raises(MCPError, match=refused):
                await dave.subscribe_resource(f"run://{run_id}")
            assert {p.name for p in (await dave.list_prompts()).prompts} == set(Catalog.builtin().chains)
        async with as_identity(port, DAVE) as dave:
            with pytest.raises(MCPError, match=refused):
                async with dave.listen(resource_subscriptions=[f"run://{run_id}"]):
                    pass
    log = read_log(tmp_path / "server.log")
    assert "identities: alice, bob, carol, dave" in log
    for token in TOKENS:
        assert token not in log


@pytest.mark.parametrize("backend", BACKENDS)
async def test_own_runs_only_holds_for_subscriptions_and_keys_on_every_store(
    tmp_path: Path, backend: str
) -> None:
    """carol (limited to her own runs) may not watch alice's run, by either era's subscription, and
    hears of changes to her own runs only; alice's idempotency key is another key for her."""
    (tmp_path / "construct.toml").write_text(CONFIG)
    async with (
        store_target(backend, tmp_path / "target") as target,
        http_server(
            tmp_path,
            "streamable-http",
            BOB_TOKEN=BOB,
            CONSTRUCT_ORCHESTRATION_STORE=target.url,
            CONSTRUCT_STORE_FALLBACK="false",
        ) as port,
        as_identity(port, ALICE) as alice,
        as_identity(port, CAROL) as carol,
        as_identity(port, CAROL, mode="legacy") as carol_legacy,
    ):
        keyed = {"request": "Keyed.", "chain": ["writer"], "idempotency_key": "k-1"}
        theirs = await call(alice, "orchestrate_start", **keyed)
        uri = f"run://{theirs['run_id']}"
        with pytest.warns(MCPDeprecationWarning), pytest.raises(MCPError, match=r"^forbidden: run "):
            await carol_legacy.subscribe_resource(uri)
        with pytest.raises(MCPError, match=r"^forbidden: run "):
            async with carol.listen(resource_subscriptions=[uri]):
                pass
        mine = await call(carol, "orchestrate_start", **keyed)
        assert mine["run_id"] != theirs["run_id"] and theirs["run_id"] not in json.dumps(mine)
        assert (await call(carol, "orchestrate_start", **keyed))["run_id"] == mine["run_id"]
        assert (await call(alice, "orchestrate_start", **keyed))["run_id"] == theirs["run_id"]
        # Her own run she may watch: she hears of its change, and of nothing of alice's.
        own = f"run://{mine['run_id']}"
        async with carol.listen(resource_subscriptions=[own]) as subscription:
            await call(alice, "orchestrate_cancel", run_id=theirs["run_id"])
            await call(carol, "orchestrate_cancel", run_id=mine["run_id"])
            with anyio.fail_after(15):
                async for event in subscription:
                    assert event == ResourceUpdated(uri=own)
                    break


async def test_a_session_belongs_to_the_identity_that_opened_it(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    async with http_server(tmp_path, "streamable-http", BOB_TOKEN=BOB) as port, httpx2.AsyncClient() as http:
        url = f"http://127.0.0.1:{port}/mcp"
        opened = await http.post(url, headers={**headers, "Authorization": f"Bearer {BOB}"}, json=initialize)
        assert opened.status_code == 200
        session = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        stolen = await http.post(
            url,
            headers={**headers, "Authorization": f"Bearer {ALICE}", "mcp-session-id": session},
            json=listing,
        )
        assert stolen.status_code == 404, "another identity's token cannot use bob's session"


async def test_roles_hold_over_sse_too(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG)
    async with http_server(tmp_path, "sse", BOB_TOKEN=BOB) as port:
        url = f"http://127.0.0.1:{port}/sse"
        async with Client(sse_client(url, headers={"Authorization": f"Bearer {ALICE}"})) as alice:
            view = await call(
                alice, "orchestrate_start", request="Over SSE.", chain=["writer"], approve_before=["writer"]
            )
            assert (await full_view(alice, view["run_id"]))["started_by"] == "alice"
        async with Client(sse_client(url, headers={"Authorization": f"Bearer {BOB}"})) as bob:
            assert_forbidden(await call_error(bob, "orchestrate_start", request="No."), "operate")
            view = await call(
                bob, "orchestrate_approve", run_id=view["run_id"], decision="approve", gate_id="before:writer"
            )
            assert (
                view["gates"][0]["approver"],
                view["gates"][0]["channel"],
                view["gates"][0]["verified"],
            ) == (
                "bob",
                "http",
                True,
            )


def cli(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVER_COMMAND, *args],
        capture_output=True,
        text=True,
        env={**server_env(home), "PATH": os.environ.get("PATH", ""), **env},
        timeout=120,
        check=False,
    )


async def test_decisions_record_who_when_and_through_which_channel(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG)
    gate = "before:writer"
    # Three runs gated before their one step, each decided another way.
    async with http_server(tmp_path, "streamable-http", BOB_TOKEN=BOB) as port:
        async with as_identity(port, ALICE) as alice:
            runs = [
                (
                    await call(
                        alice,
                        "orchestrate_start",
                        request=f"Run {n}",
                        chain=["writer"],
                        approve_before=["writer"],
                    )
                )["run_id"]
                for n in range(3)
            ]
        async with as_identity(port, BOB) as bob:
            await call(
                bob, "orchestrate_approve", run_id=runs[0], decision="approve", gate_id=gate, comment="bob ok"
            )
    env = {**server_env(tmp_path), "PATH": os.environ.get("PATH", "")}
    async with stdio_client_for(env, tmp_path / "stdio.log") as client:
        view = await call(
            client, "orchestrate_approve", run_id=runs[1], decision="reject", gate_id=gate, approver="dana"
        )
        # A repeat through another channel (the CLI) with the same record is a no-op.
        decided = next(g for g in view["gates"] if g["gate_id"] == gate)
        assert (decided["approver"], decided["channel"], decided.get("verified", False)) == (
            "dana",
            "stdio",
            False,
        )
        version = (await full_view(client, runs[1]))["version"]
    repeat = cli(
        tmp_path, "runs", "approve", runs[1], "--gate-id", gate, "--reject", "--approver", "dana", "--json"
    )
    # Exit status 3: the command was taken (a no-op) and the run is rejected.
    assert repeat.returncode == 3, repeat.stderr
    assert json.loads(repeat.stdout)["version"] == version

    user = {"USER": "erin", "LOGNAME": "erin", "LNAME": "erin", "USERNAME": "erin"}
    approved = cli(
        tmp_path, "runs", "approve", runs[2], "--gate-id", gate, "--comment", "from the shell", **user
    )
    assert approved.returncode == 0, approved.stderr
    assert "gate before:writer: approved by erin (claimed, cli) at " in approved.stdout

    views: list[dict[str, Any]] = []
    for run_id in runs:
        status = cli(tmp_path, "runs", "status", run_id, "--json")
        assert status.returncode == 0, status.stderr
        views.append(json.loads(status.stdout))
    records = [
        {k: g[k] for k in ("approver", "channel", "verified", "comment")}
        | {"decided": g["decided_at"] is not None}
        for g in (v["gates"][0] for v in views)
    ]
    assert records == [
        {"approver": "bob", "channel": "http", "verified": True, "comment": "bob ok", "decided": True},
        {"approver": "dana", "channel": "stdio", "verified": False, "comment": None, "decided": True},
        {
            "approver": "erin",
            "channel": "cli",
            "verified": False,
            "comment": "from the shell",
            "decided": True,
        },
    ]
    assert [v["started_by"] for v in views] == ["alice"] * 3

    shown = cli(tmp_path, "runs", "status", runs[0])
    assert "gate before:writer: approved by bob (verified, http) at " in shown.stdout
    timelines = [cli(tmp_path, "runs", "timeline", run_id).stdout for run_id in runs]
    assert 'before:writer: approve by bob (verified, http) "bob ok"' in timelines[0]
    assert all("started by alice (verified)" in timeline for timeline in timelines)
    assert "before:writer: reject by dana (claimed, stdio)" in timelines[1]
    assert 'before:writer: approve by erin (claimed, cli) "from the shell"' in timelines[2]


async def test_a_bad_tokens_table_stops_the_server_at_startup(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(
        f'[tokens.alice]\ntoken = "{ALICE}"\nroles = ["read"]\n'
        f'[tokens.bob]\ntoken = "{ALICE}"\nroles = ["approve"]\n'
    )
    env = {**server_env(tmp_path), "PATH": os.environ.get("PATH", "")}
    refused = await anyio.run_process(
        [*SERVER_COMMAND, "serve", "--transport", "streamable-http", "--port", str(free_port())],
        env=env,
        check=False,
    )
    assert refused.returncode == 2
    message = refused.stderr.decode()
    assert "tokens.bob" in message and "same as tokens.alice" in message
    assert ALICE not in message


GUARDED = """
[chains.guarded]
steps = ["architect", { specialist = "writer", approve_before = true, approvers = ["bob"] }]
"""


async def test_a_gate_with_approvers_is_decided_only_by_them_over_http_and_stdio(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG + GUARDED)
    gate = "before:writer"
    async with (
        http_server(tmp_path, "streamable-http", BOB_TOKEN=BOB) as port,
        as_identity(port, ALICE) as alice,
        as_identity(port, BOB) as bob,
        as_identity(port, DAVE) as dave,
    ):
        view = await play_host(
            alice, await call(alice, "orchestrate_start", request="Guarded", chain="guarded")
        )
        run_id = view["run_id"]
        shown = next(g for g in view["gates"] if g["gate_id"] == gate)
        assert shown["approvers"] == ["bob"] and shown["decisions"] == ["approve", "reject", "revise"]
        assert "Only bob may decide this gate." in view["next_action"]["instruction"]
        # dave has the approve role, but this gate names only bob.
        text = await call_error(dave, "orchestrate_approve", run_id=run_id, decision="approve", gate_id=gate)
        assert_forbidden(text)
        assert "may be decided only by bob" in text and "'dave' (verified)" in text
        view = await call(bob, "orchestrate_approve", run_id=run_id, decision="approve", gate_id=gate)
        decided = next(g for g in view["gates"] if g["gate_id"] == gate)
        assert (decided["status"], decided["approver"], decided["verified"]) == ("approved", "bob", True)

    # stdio is a local, trusted channel: the approver is claimed, and must be one of the gate's.
    env = {**server_env(tmp_path), "PATH": os.environ.get("PATH", "")}
    async with stdio_client_for(env, tmp_path / "stdio.log") as client:
        view = await play_host(
            client, await call(client, "orchestrate_start", request="Local", chain="guarded")
        )
        run_id = view["run_id"]
        for claimed in ({}, {"approver": "mallory"}):
            text = await call_error(
                client, "orchestrate_approve", run_id=run_id, decision="approve", gate_id=gate, **claimed
            )
            assert_forbidden(text)
            assert "may be decided only by bob" in text
        view = await call(
            client, "orchestrate_approve", run_id=run_id, decision="approve", gate_id=gate, approver="bob"
        )
        decided = next(g for g in view["gates"] if g["gate_id"] == gate)
        assert (decided["approver"], decided["channel"], decided.get("verified", False)) == (
            "bob",
            "stdio",
            False,
        )


AGENT_GATED = """
[chains.agent-gated]
steps = ["architect", { specialist = "writer", approve_before = true, approvers = ["agent"] }]

[chains.person-gated]
steps = ["architect", { specialist = "writer", approve_before = true }]
"""


async def test_over_http_the_agent_decides_its_own_gate_as_the_agent_and_not_a_persons(
    tmp_path: Path,
) -> None:
    """A verified caller sends the approve action's arguments as they are (``approver: "agent"``):
    the record names the agent, claimed (no token identity may be called ``agent``), over http.
    On a person's gate the same call is ``forbidden``: the gate is a person's, ask the user."""
    (tmp_path / "construct.toml").write_text(CONFIG + AGENT_GATED)
    gate = "before:writer"
    async with (
        http_server(tmp_path, "streamable-http", BOB_TOKEN=BOB) as port,
        as_identity(port, ALICE) as alice,
        as_identity(port, BOB) as bob,
    ):
        view = await play_host(
            alice, await call(alice, "orchestrate_start", request="Mine", chain="agent-gated")
        )
        action = view["next_action"]
        assert action["arguments"]["approver"] == "agent"
        view = await call(bob, action["tool"], **action["arguments"])
        decided = next(g for g in view["gates"] if g["gate_id"] == gate)
        assert (decided["approver"], decided["channel"], decided.get("verified", False)) == (
            "agent",
            "http",
            False,
        )

        view = await play_host(
            alice, await call(alice, "orchestrate_start", request="Theirs", chain="person-gated")
        )
        action = view["next_action"]
        assert "approver" not in action["arguments"]
        text = await call_error(bob, action["tool"], **action["arguments"], approver="agent")
        assert_forbidden(text)
        assert f"gate {gate} of run {view['run_id']} is a person's, not the agent's: ask the user" in text
        view = await call(bob, action["tool"], **action["arguments"])  # bob, as himself: a person
        decided = next(g for g in view["gates"] if g["gate_id"] == gate)
        assert (decided["approver"], decided["verified"]) == ("bob", True)

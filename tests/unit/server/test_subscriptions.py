"""Resource subscriptions are bounded (server/mcp/subscriptions.py): only ``run://<valid run id>``, at most
``max_subscriptions`` per session, and a handshake-era session's subscriptions end with it; a run's
updates reach only the callers who may read it."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client
from mcp.server.subscriptions import ResourceUpdated, ServerEvent, ToolsListChanged
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from orchestration.core.facts import RunCreated
from orchestration.core.fold import head_from_creation
from server.app import ConstructApp
from server.identity import LOCAL, ROLES, Caller, NamedToken, Role, caller_for
from server.mcp.subscriptions import RunEventBus
from server.settings.config import load_settings
from tests.stores.builders import new_run, run_id


def make_app(tmp_path: Path, **env: str) -> ConstructApp:
    settings = load_settings(
        env={
            "CONSTRUCT_HOME": str(tmp_path),
            "CONSTRUCT_POLL_SECONDS": "0.1",
            "CONSTRUCT_LOG_LEVEL": "WARNING",
            **env,
        }
    )
    return ConstructApp(settings)


async def start_run(client: Client) -> str:
    result = await client.call_tool("orchestrate_start", {"request": "watch me", "chain": ["writer"]})
    assert result.structured_content is not None
    run_id: str = result.structured_content["run_id"]
    return run_id


async def test_a_sessions_subscriptions_end_with_the_session(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    server = app.build_server()
    async with Client(server, mode="legacy") as client:
        run_id = await start_run(client)
        with pytest.warns(MCPDeprecationWarning):
            await client.subscribe_resource(f"run://{run_id}")
            await client.subscribe_resource(f"run://{run_id}")  # the same client again: one entry
        assert app._legacy.count() == 1
        assert list(app._legacy.by_uri) == [f"run://{run_id}"]
        assert app._subscriptions.watched() == {run_id}
        with pytest.warns(MCPDeprecationWarning):
            await client.unsubscribe_resource(f"run://{run_id}")
        assert app._legacy.count() == 0 and app._subscriptions.watched() == set()
        with pytest.warns(MCPDeprecationWarning):
            await client.subscribe_resource(f"run://{run_id}")
        assert app._legacy.count() == 1
    # The client closed its session without unsubscribing: nothing is held for it any more.
    assert app._legacy.count() == 0
    assert app._legacy.by_uri == {}
    assert app._subscriptions.watched() == set()


async def test_only_run_uris_with_valid_ids_can_be_subscribed(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    async with Client(app.build_server(), mode="legacy") as client:
        for uri in ("run://../../etc/passwd", "run://", "run://" + "x" * 5000):
            with pytest.raises(MCPError) as refused, pytest.warns(MCPDeprecationWarning):
                await client.subscribe_resource(uri)
            assert refused.value.error.message.startswith("invalid_argument: "), uri
            assert "run://<run_id>" in refused.value.error.message
            assert len(refused.value.error.message) < 400
        # Another scheme names nothing here that can change: acknowledged, nothing kept, no cap used.
        with pytest.warns(MCPDeprecationWarning):
            for n in range(app.settings.max_subscriptions + 5):
                await client.subscribe_resource(f"test://watched-resource-{n}")
            await client.subscribe_resource("file:///etc/passwd")
        assert app._legacy.count() == 0
        assert app._subscriptions.watched() == set()


async def test_a_session_has_a_cap_on_subscriptions(tmp_path: Path) -> None:
    app = make_app(tmp_path, CONSTRUCT_MAX_SUBSCRIPTIONS="3")
    async with Client(app.build_server(), mode="legacy") as client:
        uris = [f"run://run-{n:04d}" for n in range(3)]
        with pytest.warns(MCPDeprecationWarning):
            for uri in uris:
                await client.subscribe_resource(uri)
            await client.subscribe_resource(uris[0])  # already held: not a new one
        with pytest.raises(MCPError) as refused, pytest.warns(MCPDeprecationWarning):
            await client.subscribe_resource("run://run-0003")
        assert refused.value.error.message.startswith("too_many_subscriptions: ")
        assert "CONSTRUCT_MAX_SUBSCRIPTIONS" in refused.value.error.message
        assert app._legacy.count() == 3
        # Room again after an unsubscribe.
        with pytest.warns(MCPDeprecationWarning):
            await client.unsubscribe_resource(uris[0])
            await client.subscribe_resource("run://run-0003")
        assert app._legacy.count() == 3
    assert app._legacy.count() == 0


async def test_a_listen_stream_is_bounded_the_same_way(tmp_path: Path) -> None:
    app = make_app(tmp_path, CONSTRUCT_MAX_SUBSCRIPTIONS="2")
    async with Client(app.build_server()) as client:
        with pytest.raises(MCPError) as refused:
            async with client.listen(resource_subscriptions=["run://../x"]):
                pass
        assert refused.value.error.message.startswith("invalid_argument: ")
        async with client.listen(resource_subscriptions=[f"test://r{n}" for n in range(5)]):
            assert app._subscriptions.watched() == set()
        with pytest.raises(MCPError) as refused:
            async with client.listen(resource_subscriptions=[f"run://run-{n}" for n in range(3)]):
                pass
        assert refused.value.error.message.startswith("too_many_subscriptions: ")
        run_id = await start_run(client)
        async with client.listen(resource_subscriptions=[f"run://{run_id}"]):
            assert app._subscriptions.watched() == {run_id}
    assert app._subscriptions.watched() == set()


def _caller(identity: str, roles: frozenset[Role] = ROLES, own_runs_only: bool = False) -> Caller:
    return caller_for(NamedToken(identity, f"{identity}-token-0123456789", roles, own_runs_only))


async def test_a_run_update_reaches_only_the_callers_who_may_read_the_run() -> None:
    """The listen streams' bus is keyed by caller (issue 22, finding 7): a stream that named a run
    (even before it existed) hears of it only while its caller may read it."""
    bus = RunEventBus()
    callers = {
        "alice": _caller("alice", own_runs_only=True),  # the run's owner
        "carol": _caller("carol", own_runs_only=True),  # another identity limited to its own runs
        "dave": _caller("dave", frozenset({"approve"})),  # no read
        "erin": _caller("erin", frozenset({"read"})),
        "local": LOCAL,
    }
    heard: dict[str, list[ServerEvent]] = {name: [] for name in callers}
    for name, caller in callers.items():
        bus.bus_for(caller).subscribe(heard[name].append)
    _, facts = new_run(run_id(1))
    assert isinstance(facts[0], RunCreated)
    head = head_from_creation(facts[0].model_copy(update={"started_by": "alice"}))

    await bus.publish_run(head)
    update = ResourceUpdated(uri=f"run://{head.run_id}")
    assert heard == {"alice": [update], "carol": [], "dave": [], "erin": [update], "local": [update]}
    # Through the SDK's seam, a run's update without its run reaches nobody; other events everyone.
    await bus.publish(ResourceUpdated(uri=f"run://{head.run_id}"))
    await bus.publish(ToolsListChanged())
    assert all(events[-1] == ToolsListChanged() for events in heard.values())
    assert [len(events) for events in heard.values()] == [2, 1, 1, 2, 2]

"""Resource subscribers hear of changes that another process writes to the run (the CLI here; in a
scale-out, another server): the server polls the runs that have subscribers
(``server/mcp/subscriptions.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.subscriptions import ResourceUpdated
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import ServerNotification

from tests.acceptance.harness import SERVER_COMMAND, call, stdio_client_for
from tests.acceptance.store_targets import BACKENDS, StoreTarget, store_target

pytestmark = pytest.mark.slow


async def cancel_elsewhere(env: dict[str, str], run_id: str) -> None:
    """``construct-mcp runs cancel`` in its own process, on the same store."""
    proc = await anyio.run_process(
        [*SERVER_COMMAND, "runs", "cancel", run_id, "--reason", "from the CLI"],
        env=env,
        check=False,
        stderr=subprocess.PIPE,
    )
    assert proc.returncode == 0, proc.stderr.decode()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_listener_hears_of_a_change_made_by_another_process(tmp_path: Path, backend: str) -> None:
    async with store_target(backend, tmp_path / "target") as target:
        env = target.env(tmp_path / "home")
        async with stdio_client_for(env, tmp_path / "server.log") as client:
            view = await call(client, "orchestrate_start", request="watch me", wait_seconds=10)
            assert view["status"] == "awaiting_host"
            uri = f"run://{view['run_id']}"
            async with client.listen(resource_subscriptions=[uri]) as subscription:
                # The cancel is the run's last write, and nothing in the server writes after it:
                # only the watcher can announce it.
                await cancel_elsewhere(env, view["run_id"])
                with anyio.fail_after(15):
                    async for event in subscription:
                        assert event == ResourceUpdated(uri=uri)
                        break
            after = await call(client, "run_status", run_id=view["run_id"])
            assert after["status"] == "cancelled"


async def test_a_legacy_subscriber_hears_of_a_change_made_by_another_process(tmp_path: Path) -> None:
    received: list[str] = []
    got = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, ServerNotification) and message.method == "notifications/resources/updated":
            received.append(str(message.params.uri))
            got.set()

    async with store_target("sqlite", tmp_path / "target") as target:
        env = _env(target, tmp_path)
        async with stdio_client_for(
            env, tmp_path / "server.log", mode="legacy", message_handler=on_message
        ) as legacy:
            view = await call(legacy, "orchestrate_start", request="watch me", wait_seconds=10)
            uri = f"run://{view['run_id']}"
            with pytest.warns(MCPDeprecationWarning):
                await legacy.subscribe_resource(uri)
            assert received == []
            await cancel_elsewhere(env, view["run_id"])
            with anyio.fail_after(15):
                await got.wait()
            assert received == [uri]


def _env(target: StoreTarget, tmp_path: Path) -> dict[str, str]:
    return target.env(tmp_path / "home")

"""The objects one server process runs with, as the lifespan hands them to tools and resources.

Built only by the composition root (:mod:`server.app`); tools reach them through
``ctx.request_context.lifespan_context``. Nothing here is a module-level singleton.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp.server.session import ServerSession
from mcp.server.subscriptions import ResourceUpdated, SubscriptionBus

from orchestration.dispatcher import Dispatcher
from orchestration.models import RunHead
from orchestration.runtime import Runtime
from server.config import Settings
from server.views import Detail, RunView, run_view

log = logging.getLogger("construct.server")


def run_uri(run_id: str) -> str:
    return f"run://{run_id}"


@dataclass
class LegacySubscribers:
    """Sessions of handshake-era clients (``resources/subscribe``) per resource URI.

    2026-07-28 clients subscribe with ``subscriptions/listen`` and are served by the SDK's
    subscription bus; older clients need a ``notifications/resources/updated`` sent on their own
    session, so we remember which session asked for which URI."""

    by_uri: dict[str, list[ServerSession]] = field(default_factory=dict)

    def add(self, uri: str, session: ServerSession) -> None:
        sessions = self.by_uri.setdefault(uri, [])
        if all(s is not session for s in sessions):
            sessions.append(session)

    def remove(self, uri: str, session: ServerSession) -> None:
        sessions = [s for s in self.by_uri.get(uri, []) if s is not session]
        if sessions:
            self.by_uri[uri] = sessions
        else:
            self.by_uri.pop(uri, None)

    async def notify(self, uri: str) -> None:
        for session in list(self.by_uri.get(uri, [])):
            try:
                await session.send_resource_updated(uri)
            except Exception as exc:
                # The client went away: forget it rather than fail the write that triggered this.
                log.info(
                    "dropping a resource subscriber: %s",
                    type(exc).__name__,
                    extra={"action": "subscriber_dropped"},
                )
                self.remove(uri, session)


@dataclass(frozen=True)
class Services:
    """Everything a tool needs: the runtime (store, catalog), the dispatcher, the settings."""

    settings: Settings
    runtime: Runtime
    dispatcher: Dispatcher
    bus: SubscriptionBus
    legacy_subscribers: LegacySubscribers
    store_description: str
    warnings: Sequence[str] = ()

    async def view(
        self,
        run_id: str,
        head: RunHead | None = None,
        detail: Detail = "compact",
        full_task: str | None = None,
    ) -> RunView:
        """The run as the tools show it, read from the store (``head`` if the caller has it);
        ``detail`` and ``full_task`` as in :func:`~server.views.run_view`."""
        return run_view(await self.runtime.snapshot(run_id, head), detail, full_task)

    async def publish_change(self, head: RunHead) -> None:
        """Runtime listener: tell resource subscribers that ``run://<id>`` changed."""
        uri = run_uri(head.run_id)
        await self.bus.publish(ResourceUpdated(uri=uri))
        await self.legacy_subscribers.notify(uri)

    def describe(self) -> dict[str, Any]:
        """Safe-to-log facts about this process (no secrets)."""
        s = self.settings
        return {
            "store": self.store_description,
            "owner": self.runtime.owner,
            "worker_backend": s.worker_backend,
            "concurrency": s.dispatch_concurrency,
            "recover_on_start": s.recover_on_start,
        }

"""The objects one server process runs with, as the lifespan hands them to tools and resources.

Built only by the composition root (:mod:`server.app`); tools reach them through
``ctx.request_context.lifespan_context``. Nothing here is a module-level singleton.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestration.core import RunHead
from orchestration.engine import Dispatcher, RunSnapshot, Runtime
from server.identity import Caller
from server.mcp.shown_runs import ShownRuns
from server.mcp.subscriptions import LegacySubscribers, RunEventBus
from server.settings.config import Settings
from server.views.chain_behind import ChainNews
from server.views.children_view import with_children, with_gone_links
from server.views.compact import content_for
from server.views.record_parts import RecordTexts
from server.views.run_view import Detail, RunView, run_view

log = logging.getLogger("construct.server")


def run_uri(run_id: str) -> str:
    return f"run://{run_id}"


@dataclass(frozen=True)
class Services:
    """Everything a tool needs: the runtime (store, catalog), the dispatcher, the settings."""

    settings: Settings
    runtime: Runtime
    dispatcher: Dispatcher
    bus: RunEventBus
    legacy_subscribers: LegacySubscribers
    store_description: str
    #: what this process keeps of the runs it showed (also the runtime's memory)
    memory: ShownRuns
    warnings: Sequence[str] = ()
    #: whether a run's chain has a newer version in the configuration (None: not said)
    chain_news: ChainNews | None = None

    #: the texts of the records ``run_status`` handed out in parts lately (see
    #: :class:`~server.views.record_parts.RecordTexts`)
    records: RecordTexts = field(default_factory=RecordTexts, repr=False, compare=False)

    async def view(
        self,
        run_id: str,
        head: RunHead | None = None,
        detail: Detail = "compact",
        full_task: str | None = None,
        *,
        caller: Caller,
    ) -> RunView:
        """The run as ``caller`` is answered with it: :meth:`whole_view`, without the run's content
        when ``caller`` may not see it (:func:`~server.views.compact.content_for`: an identity with
        only ``operate`` or ``approve`` acting on another identity's run). Every answer made of a
        run view goes through here."""
        if head is None:
            head = await self.runtime.status(run_id)
        view = content_for(await self.whole_view(run_id, head, detail, full_task), caller.sees_content(head))
        return view if self.chain_news is None else await self.chain_news.shown(view, head)

    async def whole_view(
        self,
        run_id: str,
        head: RunHead | None = None,
        detail: Detail = "compact",
        full_task: str | None = None,
    ) -> RunView:
        """The run as the tools show it, read from the store (``head`` if the caller has it);
        ``detail`` and ``full_task`` as in :func:`~server.views.run_view.run_view`.

        The head is always read (or given); the log behind it only when this version of the run
        was not viewed lately: a version is one committed state (each write is a compare-and-swap
        on it), so its snapshot never changes, nor its compact view (:func:`run_view` is a pure
        function of the snapshot: it is built once per version). A host polling ``run_status`` on
        a run that does not move reads one head per call. What a view shows of other runs (its
        children, links to runs pruned or moved away) is read at each call."""
        if head is None:
            head = await self.runtime.status(run_id)
        snapshot = await self.snapshot_of(head)
        if detail == "compact" and full_task is None:
            view = self.memory.compact_view(snapshot)
        else:
            view = run_view(snapshot, detail, full_task)
        # A parent shows its child runs, and what a waiting child needs (server.views.children_view);
        # a link to a run pruned or moved away says so.
        view = await with_gone_links(view, self.runtime)
        return await with_children(view, head, self.whole_view)

    def answer_of(self, view: RunView) -> tuple[str, dict[str, Any]]:
        """The text and structured content of an answer that is ``view``
        (:meth:`~server.mcp.shown_runs.ShownRuns.answer`: dumped once per version kept)."""
        return self.memory.answer(view)

    async def snapshot_of(self, head: RunHead) -> RunSnapshot:
        """The snapshot of the run at ``head`` (kept per version, as :meth:`whole_view` keeps it)."""
        snapshot = self.memory.snapshot(head)
        if snapshot is None:
            snapshot = self.memory.keep_snapshot(await self.runtime.snapshot(head.run_id, head))
        return snapshot

    async def publish_change(self, head: RunHead) -> None:
        """Runtime listener: tell the resource subscribers who may read the run that ``run://<id>``
        changed (see :mod:`server.mcp.subscriptions`)."""
        await self.bus.publish_run(head)
        await self.legacy_subscribers.notify(run_uri(head.run_id), head)

    def describe(self) -> dict[str, Any]:
        """Safe-to-log facts about this process (no secrets)."""
        s = self.settings
        return {
            "store": self.store_description,
            "owner": self.runtime.settings.owner,
            "worker_backend": s.worker_backend,
            "concurrency": s.dispatch_concurrency,
            "recover_on_start": s.recover_on_start,
        }

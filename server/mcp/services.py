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
from orchestration.engine import Answered, Dispatcher, RunSnapshot, Runtime, Seen
from server.identity import Caller
from server.mcp.prompt_reads import PromptReads, actions_of
from server.mcp.subscriptions import LegacySubscribers, RunEventBus
from server.settings.config import Settings
from server.views.children_view import with_children, with_gone_links
from server.views.compact import answer_data, content_for
from server.views.parts import fit_prompts, fitted
from server.views.record_parts import RecordTexts, is_record
from server.views.run_view import Detail, RunView, run_view

log = logging.getLogger("construct.server")


#: how many run versions' snapshots :meth:`Services.view` keeps (the oldest goes first)
SNAPSHOTS_KEPT = 64


def run_uri(run_id: str) -> str:
    return f"run://{run_id}"


@dataclass(frozen=True, slots=True)
class PreparedAnswer:
    """A host call's answer built ahead (:class:`Preparing`): the snapshot it was built from, the
    compact view and what the answer of that view is (its text and structured content)."""

    answered: Answered
    snapshot: RunSnapshot
    view: RunView
    text: str
    data: dict[str, Any]


class Preparing:
    """The ``meanwhile`` of a host's call (:data:`~orchestration.engine.Meanwhile`): the answer's
    compact view built, and dumped, while the write that makes it true is in flight (a store's
    round trip, its commit's fsync: time the call spends waiting otherwise). Nothing is kept
    anywhere until the write succeeded: :meth:`Services.remember` then takes it (:meth:`of` the
    answer the write returned; an answer it was not built for is built again, as before)."""

    __slots__ = ("_bound", "_ready")

    def __init__(self, bound: int) -> None:
        self._bound = bound  # max_answer_chars
        self._ready: PreparedAnswer | None = None

    def __call__(self, answered: Answered) -> None:
        snapshot = answered.snapshot
        if snapshot is None:
            return
        view = run_view(snapshot)
        text, data = fitted(answer_data(view), self._bound)
        self._ready = PreparedAnswer(answered, snapshot, view, text, data)

    def of(self, answered: Answered) -> PreparedAnswer | None:
        ready = self._ready
        return ready if ready is not None and ready.answered is answered else None


@dataclass(frozen=True)
class Services:
    """Everything a tool needs: the runtime (store, catalog), the dispatcher, the settings."""

    settings: Settings
    runtime: Runtime
    dispatcher: Dispatcher
    bus: RunEventBus
    legacy_subscribers: LegacySubscribers
    store_description: str
    warnings: Sequence[str] = ()

    #: the snapshots of the last few run versions viewed (see :meth:`view`)
    snapshots: dict[tuple[str, int], RunSnapshot] = field(default_factory=dict, repr=False, compare=False)
    #: their compact views (built from the snapshot alone, so fixed for a version too)
    compact_views: dict[tuple[str, int], RunView] = field(default_factory=dict, repr=False, compare=False)
    #: and their answers' text and structured content (see :meth:`answer_of`)
    compact_answers: dict[tuple[str, int], tuple[RunView, str, dict[str, Any]]] = field(
        default_factory=dict, repr=False, compare=False
    )
    #: the last write this process's host's path made on each of the last few runs it wrote
    #: (see :meth:`remember`)
    answers: dict[str, Answered] = field(default_factory=dict, repr=False, compare=False)
    #: how much of each long host task prompt this process handed out (recorded with the output)
    prompt_reads: PromptReads = field(default_factory=PromptReads, repr=False, compare=False)
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
        view = await self.whole_view(run_id, head, detail, full_task)
        return content_for(view, caller.sees_content(head))

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
        key = (head.run_id, head.version)
        snapshot = await self.snapshot_of(head)
        if detail == "compact" and full_task is None:
            view = self.compact_views.get(key) or run_view(snapshot)
            self.compact_views[key] = view
        else:
            view = run_view(snapshot, detail, full_task)
        # A parent shows its child runs, and what a waiting child needs (server.views.children_view);
        # a link to a run pruned or moved away says so.
        view = await with_gone_links(view, self.runtime)
        return await with_children(view, head, self.whole_view)

    def keep(self, snapshot: RunSnapshot) -> RunSnapshot:
        """Keep ``snapshot`` as its version's (the oldest kept goes first): a call that built the
        snapshot of the run it wrote (:mod:`orchestration.engine.host_answers`) hands it here, so
        the view of its answer reads nothing more."""
        key = (snapshot.head.run_id, snapshot.head.version)
        if key in self.snapshots:
            return self.snapshots[key]
        while len(self.snapshots) >= SNAPSHOTS_KEPT:
            oldest = next(iter(self.snapshots))
            del self.snapshots[oldest]
            self.compact_views.pop(oldest, None)
            self.compact_answers.pop(oldest, None)
        self.snapshots[key] = snapshot
        return snapshot

    def remember(self, answered: Answered, prepared: Preparing | None = None) -> None:
        """Keep what a host's call recorded (:class:`~orchestration.engine.Answered`): its snapshot
        as its version's (:meth:`keep`: the answer's view reads nothing more), and the answer
        itself as the run's last, which the run's next host call starts from (:meth:`seen`).
        ``prepared``: the compact view and answer built for it while its write was in flight
        (:class:`Preparing`), kept as its version's too (the answer is then not built again)."""
        snapshot = answered.snapshot
        if snapshot is None:
            return
        snapshot = self.keep(snapshot)
        ready = None if prepared is None else prepared.of(answered)
        if ready is not None and ready.snapshot is snapshot:
            key = (snapshot.head.run_id, snapshot.head.version)
            view = self.compact_views.setdefault(key, ready.view)
            if view is ready.view:
                self.compact_answers[key] = (view, ready.text, ready.data)
                self.prompt_reads.shown(actions_of(ready.data))
        self.answers.pop(answered.head.run_id, None)
        while len(self.answers) >= SNAPSHOTS_KEPT:
            del self.answers[next(iter(self.answers))]
        self.answers[answered.head.run_id] = answered

    def seen(self, run_id: str) -> Seen:
        """What this process showed last of ``run_id``: the last answer its host's path recorded
        (the next call writes on its head without reading it: the compare-and-swap checks it),
        else the newest snapshot kept (only the facts after it are read), else None."""
        answered = self.answers.get(run_id)
        if answered is not None:
            return answered
        found = [s for (r, _), s in self.snapshots.items() if r == run_id]
        return max(found, key=lambda s: s.head.version) if found else None

    def answer_of(self, view: RunView) -> tuple[str, dict[str, Any]]:
        """The text (JSON without indentation) and structured content of an answer that is
        ``view`` (compact unless it is a full view: :func:`~server.views.compact.answer_data`).
        A compact view kept here (the very object :meth:`view` returned: nothing of other
        runs was added to it) is dumped once, like it is built once: a host polling ``run_status``
        on a run that does not move gets the same bytes at each call without paying for them.
        Callers must not change the structured content (it is shared between answers)."""
        key = (view.run_id, view.version)
        if self.compact_views.get(key) is not view:
            return self.fitted(view)
        dumped = self.compact_answers.get(key)
        if dumped is None or dumped[0] is not view:
            dumped = (view, *self.fitted(view))
            self.compact_answers[key] = dumped
        return dumped[1], dumped[2]

    def fitted(self, view: RunView) -> tuple[str, dict[str, Any]]:
        """The text and structured content of an answer that is ``view``, its host tasks' prompts handed
        out in parts where they would make it longer than ``max_answer_chars``, and a compact
        view's tasks shrunk where they would (:func:`~server.views.parts.fitted`). A view with whole
        outputs (``detail="full"``, a ``task_id``) keeps them all: ``run_status`` hands out one
        too long for an answer in parts (:mod:`server.views.record_parts`)."""
        shape = fit_prompts if is_record(view) else fitted
        text, data = shape(answer_data(view), self.settings.max_answer_chars)
        self.prompt_reads.shown(actions_of(data))
        return text, data

    async def snapshot_of(self, head: RunHead) -> RunSnapshot:
        """The snapshot of the run at ``head`` (kept per version, as :meth:`whole_view` keeps it)."""
        snapshot = self.snapshots.get((head.run_id, head.version))
        return snapshot if snapshot is not None else self.keep(await self.runtime.snapshot(head.run_id, head))

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
            "owner": self.runtime.owner,
            "worker_backend": s.worker_backend,
            "concurrency": s.dispatch_concurrency,
            "recover_on_start": s.recover_on_start,
        }

"""What this server process keeps of the runs it showed, per run version (its snapshot, compact view
and answer, and its host's path's last write: :class:`~orchestration.engine.RunMemory`). A version
never changes, so entries are only evicted, least recently used first; what a call builds while its
write flushes is kept only when the write succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from orchestration.core import PromptRead, RunHead, TaskCompleted
from orchestration.engine import RunSnapshot, Written
from server.mcp.prompt_reads import PromptReads, actions_of
from server.views.compact import answer_data
from server.views.parts import fit_prompts, fitted
from server.views.record_parts import is_record
from server.views.run_view import RunView, run_view

#: how many run versions are kept (the least recently used goes first)
VERSIONS_KEPT = 64

Answer = tuple[str, dict[str, Any]]


@dataclass(slots=True)
class _Version:
    """What is kept of one version of a run."""

    snapshot: RunSnapshot
    written: Written | None = None
    view: RunView | None = None  # compact
    answer: Answer | None = None  # of ``view``


class ShownRuns:
    """The process's memory of runs (see the module docstring). ``bound``: ``max_answer_chars``."""

    builds = True

    def __init__(self, bound: int, kept: int = VERSIONS_KEPT) -> None:
        self.bound = bound
        self._versions: LRUCache[tuple[str, int], _Version] = LRUCache(kept)
        #: each run's newest version kept
        self._newest: LRUCache[str, int] = LRUCache(kept)
        #: how much of each long host task prompt this process handed out
        self.prompt_reads = PromptReads()

    # -- the runtime's side (RunMemory) ----------------------------------------------------

    def last(self, run_id: str) -> Written | RunSnapshot | None:
        version = self._newest.get(run_id)
        kept = None if version is None else self._versions.get((run_id, version))
        if kept is None:
            return None
        return kept.written or kept.snapshot

    def build(self, written: Written) -> _Version:
        """The answer of ``written``'s compact view, built (and dumped) while its write flushes."""
        view = run_view(written.snapshot)
        return _Version(written.snapshot, written, view, fitted(answer_data(view), self.bound))

    def keep(self, written: Written, built: object) -> None:
        head = written.head
        for fact in written.facts:
            if isinstance(fact, TaskCompleted):
                self.prompt_reads.forget(head.run_id, fact.task_id)
        kept = self._versions.get((head.run_id, head.version))
        if kept is None:
            kept = built if isinstance(built, _Version) else _Version(written.snapshot, written)
            self._add(head, kept)
            if kept.answer is not None:
                self.prompt_reads.shown(actions_of(kept.answer[1]))
        kept.written = written

    def prompt_read(self, run_id: str, task_id: str) -> PromptRead | None:
        return self.prompt_reads.of(run_id, task_id)

    # -- the server's side -----------------------------------------------------------------

    def snapshot(self, head: RunHead) -> RunSnapshot | None:
        """The snapshot kept of the run at ``head``, if any."""
        kept = self._versions.get((head.run_id, head.version))
        return None if kept is None else kept.snapshot

    def keep_snapshot(self, snapshot: RunSnapshot) -> RunSnapshot:
        """Keep ``snapshot`` as its version's (one kept already is returned instead)."""
        head = snapshot.head
        kept = self._versions.get((head.run_id, head.version))
        if kept is None:
            kept = self._add(head, _Version(snapshot))
        return kept.snapshot

    def compact_view(self, snapshot: RunSnapshot) -> RunView:
        """The compact view of the run at ``snapshot``, built once per version kept."""
        head = snapshot.head
        kept = self._versions.get((head.run_id, head.version))
        if kept is None:
            return run_view(snapshot)
        if kept.view is None:
            kept.view = run_view(kept.snapshot)
        return kept.view

    def answer(self, view: RunView) -> Answer:
        """The text (JSON without indentation) and structured content of an answer that is
        ``view``: dumped once per version when ``view`` is the version's compact view kept here
        (views are never changed in place: one with other runs' facts added, or content withheld,
        is another object, dumped each time). Host task prompts are handed out in parts where
        they would make it longer than :attr:`bound`, a compact view's tasks shrunk where they
        would (:func:`~server.views.parts.fitted`); a view with whole outputs keeps them all
        (``run_status`` hands out such a record in parts: :mod:`server.views.record_parts`).
        Callers must not change the structured content (it is shared between answers)."""
        kept = self._versions.get((view.run_id, view.version))
        if kept is None or kept.view is not view:
            return self._dumped(view)
        if kept.answer is None:
            kept.answer = self._dumped(view)
        return kept.answer

    def _dumped(self, view: RunView) -> Answer:
        shape = fit_prompts if is_record(view) else fitted
        text, data = shape(answer_data(view), self.bound)
        self.prompt_reads.shown(actions_of(data))
        return text, data

    def _add(self, head: RunHead, kept: _Version) -> _Version:
        self._versions[(head.run_id, head.version)] = kept
        newest = self._newest.get(head.run_id)
        if newest is None or newest <= head.version or (head.run_id, newest) not in self._versions:
            self._newest[head.run_id] = head.version
        return kept


__all__ = ["VERSIONS_KEPT", "ShownRuns"]

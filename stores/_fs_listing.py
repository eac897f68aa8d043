"""Listing for the filesystem store (a mixin of :class:`stores.filesystem.FilesystemStore`):
``list_runs`` and ``runnable`` scan the run directories. A terminal run's head never changes
again, so a store object reads it once and remembers its list position and status; later scans read
only the runs that can still change (plus, for ``list_runs``, the heads of the page returned). A
run whose head cannot be read is left out and logged, at WARNING once per damage, then at DEBUG.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from orchestration.core import RUN_ID_PATTERN, RunHead, RunStatus
from orchestration.errors import CorruptRecord, RunNotFound
from orchestration.store import RunPage
from stores._common import ListKey, encode_cursor_key, is_runnable, list_order_key
from stores._fs_files import HEAD_FILE, head_signature

logger = logging.getLogger("construct.stores")


@dataclass(frozen=True, slots=True)
class _Listed:
    """A run as a scan sees it: its list position and status, and its head when it was read."""

    run_id: str
    key: ListKey
    status: RunStatus
    head: RunHead | None


class FilesystemListing:
    """The scans behind ``list_runs`` and ``runnable`` of the filesystem store (see above)."""

    _runs: Path
    #: run id -> (mtime, size) of the unreadable head last reported at WARNING
    _unreadable_reported: dict[str, tuple[int, int] | None]
    #: run id -> list position and status of a terminal run
    _terminal: dict[str, tuple[ListKey, RunStatus]]

    if TYPE_CHECKING:

        def _load_sync(self, run_id: str) -> RunHead: ...

    def _scan(self) -> list[_Listed]:
        """Every readable run: terminal runs from what an earlier scan learned of them, the others
        (the few that can still change) read afresh."""
        listed: list[_Listed] = []
        seen: set[str] = set()
        for entry in os.scandir(self._runs):
            if not RUN_ID_PATTERN.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            seen.add(entry.name)
            known = self._terminal.get(entry.name)
            if known is not None:
                listed.append(_Listed(entry.name, known[0], known[1], None))
                continue
            head = self._load_listed(entry.name)
            if head is None:
                continue
            key = list_order_key(head)
            if head.status.is_terminal:
                self._terminal[entry.name] = (key, head.status)
            listed.append(_Listed(entry.name, key, head.status, head))
        for gone in [run_id for run_id in list(self._terminal) if run_id not in seen]:
            self._terminal.pop(gone, None)  # a run directory removed by hand
        return listed

    def _load_listed(self, run_id: str) -> RunHead | None:
        """The head of a run met by a scan, or None (logged) when it cannot be read."""
        try:
            return self._load_sync(run_id)
        except (CorruptRecord, RunNotFound, OSError) as exc:
            # One damaged run must not hide every other run from the operator. Scans repeat
            # (a dispatcher polls every second): a damage already reported is logged again only
            # at DEBUG, until the head changes.
            seen = head_signature(self._runs / run_id / HEAD_FILE)
            repeated = run_id in self._unreadable_reported and self._unreadable_reported[run_id] == seen
            self._unreadable_reported[run_id] = seen
            logger.log(
                logging.DEBUG if repeated else logging.WARNING,
                "skipping run %s: %s",
                run_id,
                exc,
                extra={"action": "store.run_unreadable", "run_id": run_id},
            )
            return None

    def _list_sync(self, statuses: frozenset[RunStatus] | None, limit: int, after: ListKey | None) -> RunPage:
        listed = sorted(self._scan(), key=lambda run: run.key, reverse=True)
        if statuses:
            listed = [run for run in listed if run.status in statuses]
        if after is not None:
            listed = [run for run in listed if run.key < after]
        page = listed[:limit]
        more = len(listed) > limit
        # Only the page's terminal runs are read (a run removed meanwhile is left out).
        heads = [run.head or self._load_listed(run.run_id) for run in page]
        cursor = encode_cursor_key(page[-1].key) if more and page else None
        return RunPage([head for head in heads if head is not None], cursor)

    def _runnable_sync(self, now: datetime, limit: int) -> list[str]:
        listed = sorted(self._scan(), key=lambda run: run.key)
        return [run.run_id for run in listed if run.head is not None and is_runnable(run.head, now)][:limit]

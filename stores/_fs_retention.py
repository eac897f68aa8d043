"""Retention for the filesystem store (a mixin of :class:`stores.filesystem.FilesystemStore`):
importing a whole run, deleting a run behind a tombstone, and what a deleted run's id answers.

A deletion, under the run's lock, writes the tombstone durably, then renames the run directory out
of ``runs/`` in one step (into ``trash/``) and removes it: a reader sees the whole directory, or
none and the tombstone. An import is a create of a whole run (staged under ``tmp/``).
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from orchestration.core import Fact, RunHead, validate_run_id
from orchestration.errors import Conflict, RunNotFound
from orchestration.store import Tombstone
from stores._fs_files import flocked, fsync_dir, replace_file
from stores._retention import check_delete, check_import, decode_tombstone, deleted_already, encode_tombstone

_P = ParamSpec("_P")
_T = TypeVar("_T")

TOMBSTONES_DIR = "tombstones"
TRASH_DIR = "trash"
_LOCK_FILE = "lock"


class FilesystemRetention:
    """``import_run``, ``delete_run`` and ``tombstone`` of the filesystem store (see above)."""

    _root: Path
    _runs: Path

    if TYPE_CHECKING:

        async def _call(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T: ...

        def _run_dir(self, run_id: str) -> Path: ...

        def _load_sync(self, run_id: str) -> RunHead: ...

        def _create_sync(self, head: RunHead, facts: Sequence[Fact], imported: bool = False) -> object: ...

        def _read_committed(self, run_id: str, first: int, last: int) -> list[Fact]: ...

    # ---------------------------------------------------------------- blocking internals

    def _tombstone_path(self, run_id: str) -> Path:
        return self._root / TOMBSTONES_DIR / f"{run_id}.json"

    def _read_tombstone(self, run_id: str) -> Tombstone | None:
        try:
            data = self._tombstone_path(run_id).read_bytes()
        except FileNotFoundError:
            return None
        return decode_tombstone(run_id, data)

    def _gone(self, run_id: str, *, by_key: bool = False) -> RunNotFound:
        """The error for a run id whose directory is missing: its tombstone's, else not found."""
        tombstone = self._read_tombstone(run_id)
        if tombstone is None:
            return RunNotFound(run_id)
        return tombstone.error(by_key=by_key)

    @contextmanager
    def _locked(self, run_id: str) -> Iterator[None]:
        """Hold the run's lock (as every write does); a run deleted before its lock file could be
        opened is its tombstone error, like one deleted while the writer waited for the lock."""
        with ExitStack() as stack:
            try:
                stack.enter_context(flocked(self._run_dir(run_id) / _LOCK_FILE))
            except FileNotFoundError:
                raise self._gone(run_id) from None
            yield

    def _read_range(self, run_id: str, first: int, last: int) -> list[Fact]:
        """Committed facts ``first..last`` of a run whose head was just read. A file missing because
        the run was deleted since is the run's tombstone error: a reader never gets part of it."""
        try:
            return self._read_committed(run_id, first, last)
        except FileNotFoundError:
            if self._run_dir(run_id).is_dir():
                raise
            raise self._gone(run_id) from None

    def _import_key(self, owner: str, head: RunHead, key_path: Path) -> Path | None:
        """An import's idempotency key file, which names ``owner``: None when it is the run's own
        already (a deleted run coming back), the path to publish when it is dangling (its run
        neither exists nor has a tombstone). ``Conflict`` when it is another run's."""
        if owner == head.run_id:
            return None
        if self._run_dir(owner).is_dir() or self._read_tombstone(owner) is not None:
            raise Conflict(f"the idempotency key of run {head.run_id} is run {owner}'s in this store")
        key_path.unlink()
        return key_path

    def _drop_tombstone(self, run_id: str) -> None:
        path = self._tombstone_path(run_id)
        if path.exists():
            path.unlink()
            fsync_dir(path.parent)

    def _delete_sync(self, tombstone: Tombstone) -> None:
        run_id = tombstone.run_id
        run_dir = self._run_dir(run_id)
        stored = self._read_tombstone(run_id)
        if stored is not None and not run_dir.is_dir():
            deleted_already(stored, tombstone)
            return
        if not run_dir.is_dir():
            raise RunNotFound(run_id)
        with flocked(run_dir / _LOCK_FILE):
            if not run_dir.is_dir():  # deleted while this waited for the lock
                stored = self._read_tombstone(run_id)
                if stored is None:
                    raise RunNotFound(run_id)
                deleted_already(stored, tombstone)
                return
            check_delete(self._load_sync(run_id), tombstone)
            (self._root / TOMBSTONES_DIR).mkdir(exist_ok=True)
            replace_file(self._tombstone_path(run_id), encode_tombstone(tombstone).encode())
            trash = self._root / TRASH_DIR
            trash.mkdir(exist_ok=True)
            doomed = trash / f"{run_id}.{secrets.token_hex(8)}"
            os.rename(run_dir, doomed)
            fsync_dir(self._runs)
        # This run's directory, and any a deleter killed before removing it left behind: once in
        # trash/ a directory is no run's, and removing it twice at once is harmless.
        for entry in os.scandir(trash):
            shutil.rmtree(entry.path, ignore_errors=True)

    # ---------------------------------------------------------------- RunStore

    async def import_run(self, head: RunHead, facts: Sequence[Fact]) -> RunHead:
        validate_run_id(head.run_id)
        check_import(head, facts)
        await self._call(self._create_sync, head, facts, True)
        return head

    async def delete_run(self, tombstone: Tombstone) -> None:
        validate_run_id(tombstone.run_id)
        await self._call(self._delete_sync, tombstone)

    async def tombstone(self, run_id: str) -> Tombstone | None:
        validate_run_id(run_id)
        if await self._call(self._run_dir(run_id).is_dir):
            return None
        return await self._call(self._read_tombstone, run_id)

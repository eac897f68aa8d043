"""Chain versions for the filesystem store (a mixin of :class:`stores.filesystem.FilesystemStore`):
each version one file, ``chain-versions/<name>/<ordinal>.json``, written once (to a temporary name,
fsync'd, renamed) under the name's lock, so that processes sharing the root number a name's
versions alike. A clean-up reads the heads of the runs it keeps to know the versions they hold.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from orchestration.core import ChainSnapshot, RunHead
from orchestration.errors import ConstructError
from orchestration.store import ChainSource, ChainVersion
from stores._chain_versions import (
    decode_version,
    encode_version,
    forgettable,
    found_version,
    next_version,
)
from stores._fs_files import flocked, fsync_dir, write_new_file

_P = ParamSpec("_P")
_T = TypeVar("_T")

VERSIONS_DIR = "chain-versions"
_LOCK_FILE = "lock"
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,100}")


def _name_dir(name: str) -> str:
    """A chain name as a directory name: itself when plainly safe, else its UTF-8 bytes in hex."""
    return name if _SAFE_NAME.fullmatch(name) else "x-" + name.encode().hex()


class FilesystemChainVersions:
    """``keep_chain_version``, ``chain_versions`` and ``forget_chain_versions`` (see above)."""

    _root: Path
    _runs: Path

    if TYPE_CHECKING:

        async def _call(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T: ...

        def _load_sync(self, run_id: str) -> RunHead: ...

    # ---------------------------------------------------------------- blocking internals

    def _versions_dir(self, name: str) -> Path:
        return self._root / VERSIONS_DIR / _name_dir(name)

    def _read_versions(self, where: Path) -> list[ChainVersion]:
        try:
            files = sorted(p for p in where.iterdir() if p.suffix == ".json")
        except FileNotFoundError:
            return []
        return sorted(
            (decode_version(str(path), path.read_bytes()) for path in files),
            key=lambda v: v.ordinal,
        )

    def _keep_sync(
        self, chain: ChainSnapshot, source: ChainSource, label: str | None, now: datetime
    ) -> ChainVersion:
        where = self._versions_dir(chain.name)
        where.mkdir(parents=True, exist_ok=True)
        with flocked(where / _LOCK_FILE):
            kept = self._read_versions(where)
            found = found_version(kept, chain.content_hash())
            if found is not None:
                return found
            version = next_version(chain, source, label, now, after=kept[-1].ordinal if kept else 0)
            final = where / f"{version.ordinal:06d}.json"
            tmp = where / f"{version.ordinal:06d}.json.tmp"
            write_new_file(tmp, encode_version(version).encode())
            os.replace(tmp, final)
            fsync_dir(where)
            return version

    def _held_hashes(self) -> set[str]:
        """The chain hash of every run whose head can be read (a run it cannot read holds nothing
        a clean-up could lose: the run keeps its own snapshot)."""
        held: set[str] = set()
        try:
            entries = list(os.scandir(self._runs))
        except FileNotFoundError:
            return held
        for entry in entries:
            try:
                held.add(self._load_sync(entry.name).chain_hash)
            except (ConstructError, ValueError):
                continue
        return held

    def _forget_sync(self, keep: Sequence[str]) -> int:
        top = self._root / VERSIONS_DIR
        try:
            dirs = [p for p in top.iterdir() if p.is_dir()]
        except FileNotFoundError:
            return 0
        held = self._held_hashes()
        removed = 0
        for where in dirs:
            with flocked(where / _LOCK_FILE):
                for version in forgettable(self._read_versions(where), held, keep):
                    (where / f"{version.ordinal:06d}.json").unlink(missing_ok=True)
                    removed += 1
                fsync_dir(where)
        return removed

    # ---------------------------------------------------------------- the ability

    async def keep_chain_version(
        self, chain: ChainSnapshot, source: ChainSource, label: str | None, now: datetime
    ) -> ChainVersion:
        """See ``KeepsChainVersions.keep_chain_version``."""
        return await self._call(self._keep_sync, chain, source, label, now)

    async def chain_versions(self, name: str) -> list[ChainVersion]:
        """See ``KeepsChainVersions.chain_versions``."""
        return await self._call(self._read_versions, self._versions_dir(name))

    async def forget_chain_versions(self, keep: Sequence[str]) -> int:
        """See ``KeepsChainVersions.forget_chain_versions``."""
        return await self._call(self._forget_sync, keep)

"""The filesystem ``RunStore``: one directory per run, safe across processes on one machine.

``head.json`` is the commit point: a fact is part of the run only if its ``seq`` is at most the
head's ``last_seq``. An append writes its facts (fsync'd) first, then replaces the head atomically;
readers never look past ``last_seq``, and the next append truncates whatever a killed writer left
beyond it, so nothing uncommitted is duplicated or resurrected. A run is created under ``tmp/`` and
renamed into ``runs/``, so no crash leaves a half-created run. Every write to a run holds its lock
file; an append's cost does not depend on the run's history. OS errors become ``StoreError``.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import ParamSpec, TypeVar

import anyio

from orchestration.core import RUN_ID_PATTERN, Fact, RunHead, RunStatus, validate_run_id
from orchestration.errors import (
    Conflict,
    ConstructError,
    CorruptRecord,
    FactNotFound,
    InvalidArgument,
    LeaseLost,
    RunMoved,
    RunNotFound,
    RunPruned,
    StoreError,
    VersionConflict,
)
from orchestration.store import CreateResult, Lease, RunPage, new_lease_token
from stores._common import (
    ListKey,
    check_append,
    check_create,
    decode_cursor,
    decode_stored_fact,
    decode_stored_head,
    from_thread,
    not_continuing,
)
from stores._fs_chain import CHAIN_FILE, encode_stored_chain, encode_stored_head, with_chain
from stores._fs_files import (
    HEAD_FILE,
    HEAD_PREFIX_BYTES,
    INDEX_RECORD,
    LEASE_FILE,
    decode_problem,
    encode_facts,
    flocked,
    fsync_dir,
    fsync_together,
    head_position,
    holds,
    index_records,
    key_name,
    open_dir,
    open_written,
    read_lease,
    replace_file,
    write_all,
    write_lease,
    write_new_file,
)
from stores._fs_index import chained, committed_end, rebuild, repair, unpack
from stores._fs_listing import FilesystemListing
from stores._fs_retention import TOMBSTONES_DIR, FilesystemRetention
from stores._fs_versions import FilesystemChainVersions
from stores._lease import check_aware, lease_lost

logger = logging.getLogger("construct.stores")

# Layout under root:
#   runs/<run_id>/facts.jsonl  the fact log: one JSON fact per line, only ever appended to
#   runs/<run_id>/facts.idx    16 bytes per fact (big-endian start and end offsets of its line),
#                              derived from the log (stores._fs_index)
#   runs/<run_id>/head.json    the head, replaced atomically (temp file, fsync, rename, fsync dir);
#                              without the chain snapshot when chain.json holds it (stores._fs_chain)
#   runs/<run_id>/lease.json   the lease (owner, expiry, token), absent when nobody holds it
#   runs/<run_id>/lock         flock(2) target of every write to the run: a fenced append reads the
#                              lease and the head and writes under the one lock every claim takes
#   keys/<sha256(key)>         a symbolic link to the id of the run created with that key (a file
#                              holding it, in stores written before); published under create.lock
#                              before the run's rename, a dangling one (its creator died) replaced
#   create.lock, tmp/          creation's lock, and where runs are built before their rename
#   tombstones/, trash/        deleted runs (stores._fs_retention)
FACTS_FILE = "facts.jsonl"
INDEX_FILE = "facts.idx"
LOCK_FILE = "lock"


_P = ParamSpec("_P")
_T = TypeVar("_T")


# --------------------------------------------------------------------------------------------
# The adapter


class FilesystemStore(FilesystemListing, FilesystemRetention, FilesystemChainVersions):
    """A :class:`~orchestration.store.RunStore` keeping each run in its own directory under
    ``root``. Several processes may share one ``root`` (compare-and-swap and leases are guarded by
    per-run ``flock`` locks); ``root`` must be on a local filesystem where ``flock`` and
    ``rename`` behave (not NFS)."""

    name = "filesystem"

    def __init__(self, root: Path) -> None:
        self._root = Path(root)
        self._runs = self._root / "runs"
        self._keys = self._root / "keys"
        self._tmp = self._root / "tmp"
        self._create_lock = self._root / "create.lock"
        self._layout_ready = False
        self._closed = False
        #: run id -> (mtime, size) of the unreadable head last reported at WARNING
        self._unreadable_reported: dict[str, tuple[int, int] | None] = {}
        #: run id -> list position and status of a terminal run. A terminal head never changes
        #: again, so scans do not read it twice (only runs that can still change are re-read).
        self._terminal: dict[str, tuple[ListKey, RunStatus]] = {}

    @property
    def root(self) -> Path:
        return self._root

    # ---------------------------------------------------------------- plumbing

    async def _call(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run blocking ``fn`` in a worker thread; translate OS errors at this edge."""
        if self._closed:
            raise StoreError(f"the filesystem store at {self._root} is closed")
        try:
            if not self._layout_ready:
                await anyio.to_thread.run_sync(self._ensure_layout)
            return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
        except ConstructError:
            raise
        except OSError as exc:
            raise self._failed(exc) from exc

    async def _read(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run ``fn``, a read of a few small files that takes no lock, on the event loop: a worker
        thread's round trip costs several times the read (about 190 us against 45 us, most of what
        ``run_status`` cost over a bare tool), and a head is a few KB replaced by rename. A head
        read from a cold, slow disk stalls the loop for that read. Like :meth:`_call` otherwise."""
        if self._closed:
            raise StoreError(f"the filesystem store at {self._root} is closed")
        if not self._layout_ready:
            return await self._call(fn, *args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except ConstructError:
            raise
        except OSError as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: OSError) -> StoreError:
        return StoreError(
            f"the filesystem store at {self._root} failed: {exc.strerror or exc} "
            f"({exc.filename or 'no file'})"
        )

    def _ensure_layout(self) -> None:
        for path in (self._runs, self._keys, self._tmp, self._root / TOMBSTONES_DIR):
            path.mkdir(parents=True, exist_ok=True)
        self._layout_ready = True

    def _run_dir(self, run_id: str) -> Path:
        # Every caller validated run_id, so it cannot climb out of runs/.
        return self._runs / run_id

    def _require_run(self, run_id: str) -> Path:
        run_dir = self._run_dir(run_id)
        if not run_dir.is_dir():
            raise self._gone(run_id)
        return run_dir

    # ---------------------------------------------------------------- blocking internals

    def _load_sync(self, run_id: str) -> RunHead:
        path = self._run_dir(run_id) / HEAD_FILE
        try:
            data = with_chain(run_id, path, path.read_bytes())
        except FileNotFoundError:
            if not path.parent.is_dir():
                raise self._gone(run_id) from None
            raise CorruptRecord(run_id, str(path), "the file is missing") from None
        head = decode_stored_head(run_id, str(path), data, decode_problem)
        if head.run_id != run_id:
            raise CorruptRecord(run_id, str(path), f"it holds the head of run {head.run_id}")
        return head

    def _read_key(self, path: Path) -> str | None:
        """The run id a key's index entry names (a symbolic link's target, or, written before
        keys were links, a file's content), None when there is no entry."""
        try:
            raw = os.readlink(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: not a link, an entry written before
                raise
            try:
                raw = path.read_text(encoding="utf-8").strip()
            except FileNotFoundError:
                return None
        if not RUN_ID_PATTERN.fullmatch(raw):
            raise StoreError(f"idempotency index entry {path} does not hold a run id")
        return raw

    def _stage(
        self,
        staging: Path,
        head: RunHead,
        lines: list[bytes],
        key_path: Path | None,
        told: Callable[[], None] | None = None,
    ) -> None:
        """Write a new run's files into ``staging`` and publish its key (``key_path``), all of it
        durable when this returns: the log, the chain, the head and the directories holding them
        and the key fsync'd together (:func:`fsync_together`). Not fsync'd: the index (derived from
        the log, stores._fs_index rebuilds it) and the empty lock file (the directory's fsync keeps
        its entry). Key before run (the caller renames ``staging`` into ``runs/`` after this): a
        crash in between leaves a dangling key (repaired at the next create under it), never a
        keyed run without its key (which would let a retry create a second run). ``told``: called
        as the fsyncs begin."""
        write_new_file(staging / INDEX_FILE, index_records(lines, 0), sync=False)
        write_new_file(staging / LOCK_FILE, b"", sync=False)
        fds: list[int] = []
        try:
            fds.append(open_written(staging / FACTS_FILE, b"".join(lines)))
            fds.append(open_written(staging / CHAIN_FILE, encode_stored_chain(head)))
            fds.append(open_written(staging / HEAD_FILE, encode_stored_head(head, chain_apart=True)))
            fds.append(open_dir(staging))
            if key_path is not None:
                self._publish_key(key_path, head.run_id)
                fds.append(open_dir(self._keys))
            fsync_together(fds, told)
        finally:
            for fd in fds:
                os.close(fd)

    def _publish_key(self, path: Path, run_id: str) -> None:
        """The key's index entry: a symbolic link whose target is the run id, made in one step
        (symlink(2) writes the entry and its content together, so no crash leaves an entry
        without its run id) and refused when the name exists: at most one creator can own a key,
        even if the create lock were ever bypassed. Durable once ``keys/`` is fsync'd (the
        caller's). Entries written before are regular files holding the run id (:meth:`_read_key`
        reads both)."""
        try:
            os.symlink(run_id, path)
        except FileExistsError:
            raise StoreError(f"idempotency index entry {path} appeared during create") from None

    def _sweep_tmp(self) -> None:
        # Only creators holding create.lock use tmp/, and we hold it: anything left there was
        # abandoned by a creator that died.
        for entry in os.scandir(self._tmp):
            logger.warning(
                "removing %s left by an interrupted create",
                entry.path,
                extra={"action": "store.tmp_swept", "path": entry.path},
            )
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)

    def _create_sync(
        self,
        head: RunHead,
        facts: Sequence[Fact],
        imported: bool = False,
        told: Callable[[], None] | None = None,
    ) -> CreateResult:
        run_id = head.run_id
        lines = encode_facts(facts)
        with flocked(self._create_lock):
            self._sweep_tmp()
            key_path: Path | None = None
            if head.idempotency_key is not None:
                key_path = self._keys / key_name(head.idempotency_key)
                existing = self._read_key(key_path)
                if existing is not None and imported:  # a whole run: the key must be free or its own
                    key_path = self._import_key(existing, head, key_path)
                elif existing is not None:
                    try:
                        return CreateResult(self._load_sync(existing), created=False)
                    except (RunPruned, RunMoved):
                        raise self._gone(existing, by_key=True) from None
                    except RunNotFound:
                        # Its creator died between publishing the key and the run (we hold the
                        # create lock, so it is not still working): the key is free again.
                        logger.warning(
                            "idempotency key entry %s points to missing run %s; reusing it",
                            key_path.name,
                            existing,
                            extra={"action": "store.dangling_key", "run_id": existing},
                        )
                        key_path.unlink()
            run_dir = self._run_dir(run_id)
            if run_dir.exists():
                raise Conflict(f"a run with id {run_id} already exists")

            staging = self._tmp / f"run.{run_id}.{secrets.token_hex(8)}"
            try:
                staging.mkdir()
                self._stage(staging, head, lines, key_path, told)
                try:
                    os.rename(staging, run_dir)
                except OSError as exc:
                    if key_path is not None:
                        key_path.unlink(missing_ok=True)
                    if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                        raise Conflict(f"a run with id {run_id} already exists") from exc
                    raise
                fsync_dir(self._runs)
                if imported:
                    self._drop_tombstone(run_id)
            finally:
                if staging.exists():
                    shutil.rmtree(staging, ignore_errors=True)
        return CreateResult(head, created=True)

    def _stored_position(self, run_id: str) -> tuple[int, int]:
        """The stored head's ``(version, last_seq)``, read from the start of head.json."""
        path = self._run_dir(run_id) / HEAD_FILE
        try:
            with open(path, "rb") as file:
                prefix = file.read(HEAD_PREFIX_BYTES)
        except FileNotFoundError:
            if not path.parent.is_dir():  # deleted while the writer waited for the run lock
                raise self._gone(run_id) from None
            raise CorruptRecord(run_id, str(path), "the file is missing") from None
        position = head_position(prefix)
        if position is None or position[0] != run_id:
            current = self._load_sync(run_id)  # raises CorruptRecord for a damaged head
            return current.version, current.last_seq
        return position[1], position[2]

    def _append_sync(
        self,
        run_id: str,
        expected_version: int,
        facts: Sequence[Fact],
        head: RunHead,
        lease: Lease | None,
        told: Callable[[], None] | None = None,
    ) -> None:
        run_dir = self._run_dir(run_id)
        # A run keeps its layout: the chain apart (created by this version) or in its head; a run
        # that moved to another chain keeps that one in its head (chain.json is its first chain).
        chain_apart = not head.chain_moved and os.path.exists(run_dir / CHAIN_FILE)
        if not chain_apart:
            self._require_run(run_id)
        # Encode before taking the lock, which other writers wait for.
        lines, head_bytes = encode_facts(facts), encode_stored_head(head, chain_apart=chain_apart)
        with self._locked(run_id):
            # The fence: claims write lease.json under this same lock, so none can slip in
            # between this check and the write below.
            if lease is not None and not holds(run_dir, lease):
                raise lease_lost(lease)
            version, last_seq = self._stored_position(run_id)
            if version != expected_version:
                raise VersionConflict(run_id, expected_version, version)
            if facts[0].seq != last_seq + 1:
                raise not_continuing(run_id, facts[0].seq, last_seq)
            facts_fd = os.open(run_dir / FACTS_FILE, os.O_RDWR | os.O_APPEND)
            try:
                index_fd = os.open(run_dir / INDEX_FILE, os.O_RDWR | os.O_APPEND)
                try:
                    end = committed_end(facts_fd, index_fd, last_seq)
                    if end is None:  # the index is behind the log (an OS crash): rebuild it
                        end = repair(run_id, run_dir, index_fd, last_seq)
                    self._discard_uncommitted(run_id, facts_fd, index_fd, end, last_seq)
                    # Facts first, durable, then the head: the head is the commit point, so a crash
                    # anywhere before its rename leaves the run as it was. The index is derived
                    # from the log and not fsync'd (stores._fs_index rebuilds what a power loss cuts).
                    write_all(facts_fd, b"".join(lines))
                    write_all(index_fd, index_records(lines, end))
                finally:
                    os.close(index_fd)
                # The log and the new head's temp file are fsync'd together, before the rename.
                replace_file(run_dir / HEAD_FILE, head_bytes, also=[facts_fd], told=told)
            finally:
                os.close(facts_fd)

    def _discard_uncommitted(
        self, run_id: str, facts_fd: int, index_fd: int, end: int, last_seq: int
    ) -> None:
        run_dir = self._run_dir(run_id)
        facts_size = os.fstat(facts_fd).st_size
        if facts_size < end:
            raise CorruptRecord(
                run_id, str(run_dir / FACTS_FILE), f"it has {facts_size} bytes, the index says {end}"
            )
        index_end = last_seq * INDEX_RECORD.size
        index_size = os.fstat(index_fd).st_size
        if facts_size > end or index_size > index_end:
            # Left by a writer that died before replacing the head: never committed, so dropped.
            logger.warning(
                "run %s: discarding %d uncommitted bytes of facts and %d of index",
                run_id,
                facts_size - end,
                index_size - index_end,
                extra={"action": "store.uncommitted_discarded", "run_id": run_id},
            )
            os.ftruncate(facts_fd, end)
            os.ftruncate(index_fd, index_end)

    def _read_facts_sync(self, run_id: str, after_seq: int, limit: int | None) -> list[Fact]:
        # Reading the head first bounds the read to committed facts: bytes past head.last_seq may
        # belong to a write that is in progress or was abandoned by a dead writer.
        head = self._load_sync(run_id)
        first = max(after_seq, 0) + 1
        last = head.last_seq if limit is None else min(head.last_seq, first + limit - 1)
        if first > last:
            return []
        return self._read_range(run_id, first, last)

    def _read_committed(self, run_id: str, first: int, last: int) -> list[Fact]:
        """Committed facts ``first..last``: their index records, then one read of their bytes
        (through ``_read_range``, which reports a run deleted meanwhile)."""
        run_dir = self._run_dir(run_id)
        count = last - first + 1
        with open(run_dir / INDEX_FILE, "rb") as index:
            index.seek((first - 1) * INDEX_RECORD.size)
            raw = index.read(count * INDEX_RECORD.size)
        records = unpack(raw)
        if len(records) != count or not chained(records, 0 if first == 1 else records[0][0]):
            records = rebuild(run_id, run_dir, last)[first - 1 :]  # behind the log: an OS crash
        start, end = records[0][0], records[-1][1]
        path = run_dir / FACTS_FILE
        with open(path, "rb") as log:
            log.seek(start)
            blob = log.read(end - start)
        if len(blob) != end - start:
            raise CorruptRecord(run_id, str(path), f"it ends before committed fact {last}")
        return [
            self._decode_fact(run_id, path, seq, blob[s - start : e - start])
            for seq, (s, e) in enumerate(records, start=first)
        ]

    def _decode_fact(self, run_id: str, path: Path, seq: int, line: bytes) -> Fact:
        fact = decode_stored_fact(run_id, f"{path} (fact {seq})", line, decode_problem)
        if fact.seq != seq:
            raise CorruptRecord(run_id, f"{path} (fact {seq})", f"the line holds fact {fact.seq}")
        return fact

    def _read_fact_sync(self, run_id: str, seq: int) -> Fact:
        head = self._load_sync(run_id)
        if not 1 <= seq <= head.last_seq:
            raise FactNotFound(run_id, seq)
        return self._read_range(run_id, seq, seq)[0]

    def _claim_sync(self, run_id: str, owner: str, ttl_seconds: float, now: datetime) -> Lease | None:
        run_dir = self._require_run(run_id)
        with self._locked(run_id):
            self._require_run(run_id)  # still there: not deleted while this waited for the lock
            current = read_lease(run_id, run_dir)
            if current is not None and current.owner != owner and current.expires_at > now:
                return None
            lease = Lease(run_id, owner, now + timedelta(seconds=ttl_seconds), new_lease_token())
            write_lease(run_dir, lease)
            return lease

    def _renew_sync(self, lease: Lease, ttl_seconds: float, now: datetime) -> Lease:
        run_dir = self._run_dir(lease.run_id)
        if not run_dir.is_dir():
            raise lease_lost(lease)
        with flocked(run_dir / LOCK_FILE):
            if not holds(run_dir, lease):
                raise lease_lost(lease)
            renewed = Lease(lease.run_id, lease.owner, now + timedelta(seconds=ttl_seconds), lease.token)
            write_lease(run_dir, renewed)
            return renewed

    def _renew_all_sync(
        self, leases: Sequence[Lease], ttl_seconds: float, now: datetime
    ) -> dict[str, Lease | None]:
        renewed: dict[str, Lease | None] = {}
        for lease in leases:
            try:
                renewed[lease.run_id] = self._renew_sync(lease, ttl_seconds, now)
            except LeaseLost:
                renewed[lease.run_id] = None
        return renewed

    def _versions_sync(self, run_ids: Sequence[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for run_id in run_ids:
            try:
                found[run_id] = self._stored_position(run_id)[0]
            except (RunNotFound, CorruptRecord):
                continue  # deleted or never made: left out (an unreadable head: its drive finds out)
        return found

    def _release_sync(self, lease: Lease) -> None:
        run_dir = self._run_dir(lease.run_id)
        if not run_dir.is_dir():
            return
        with flocked(run_dir / LOCK_FILE):
            if holds(run_dir, lease):
                (run_dir / LEASE_FILE).unlink()
                fsync_dir(run_dir)

    # ---------------------------------------------------------------- RunStore

    async def create(
        self, head: RunHead, facts: Sequence[Fact], *, flushing: Callable[[], None] | None = None
    ) -> CreateResult:
        """See ``RunStore.create``; ``flushing`` is called as the new run's files are fsync'd
        (after the key was found free and the files were written)."""
        validate_run_id(head.run_id)
        check_create(head, facts)
        told = None if flushing is None else from_thread(flushing)
        return await self._call(self._create_sync, head, facts, told=told)

    async def find_by_idempotency_key(self, key: str) -> RunHead | None:
        return await self._read(self._find_by_key_sync, key)

    def _find_by_key_sync(self, key: str) -> RunHead | None:
        """The run the key's index entry names (read without the create lock, like ``load``)."""
        existing = self._read_key(self._keys / key_name(key))
        if existing is None:
            return None
        try:
            return self._load_sync(existing)
        except (RunPruned, RunMoved):
            raise self._gone(existing, by_key=True) from None
        except RunNotFound:
            # A dangling entry: its creator died between the key and the run (the next create
            # under the key repairs it), or is between the two now (its create holds the lock).
            return None

    async def load(self, run_id: str) -> RunHead:
        validate_run_id(run_id)
        return await self._read(self._load_sync, run_id)

    async def append(
        self,
        run_id: str,
        expected_version: int,
        facts: Sequence[Fact],
        head: RunHead,
        lease: Lease | None = None,
        *,
        flushing: Callable[[], None] | None = None,
    ) -> RunHead:
        """See ``RunStore.append``; ``flushing`` is called as the log and the new head are fsync'd
        (after the checks passed)."""
        check_append(run_id, expected_version, facts, head, lease)
        told = None if flushing is None else from_thread(flushing)
        await self._call(self._append_sync, run_id, expected_version, facts, head, lease, told)
        return head

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        validate_run_id(run_id)
        if limit is not None and limit < 0:
            raise InvalidArgument(f"limit must be >= 0, not {limit}")
        return await self._call(self._read_facts_sync, run_id, after_seq, limit)

    async def read_fact(self, run_id: str, seq: int) -> Fact:
        validate_run_id(run_id)
        return await self._call(self._read_fact_sync, run_id, seq)

    async def list_runs(
        self,
        statuses: frozenset[RunStatus] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunPage:
        after = decode_cursor(cursor)
        return await self._call(self._list_sync, statuses, limit, after)

    async def runnable(self, now: datetime, limit: int = 100) -> list[str]:
        check_aware(now)
        return await self._call(self._runnable_sync, now, limit)

    async def claim_lease(self, run_id: str, owner: str, ttl_seconds: float, now: datetime) -> Lease | None:
        validate_run_id(run_id)
        check_aware(now)
        return await self._call(self._claim_sync, run_id, owner, ttl_seconds, now)

    async def renew_lease(self, lease: Lease, ttl_seconds: float, now: datetime) -> Lease:
        validate_run_id(lease.run_id)
        check_aware(now)
        return await self._call(self._renew_sync, lease, ttl_seconds, now)

    async def renew_leases(
        self, leases: Sequence[Lease], ttl_seconds: float, now: datetime
    ) -> dict[str, Lease | None]:
        """One call on the store's thread; each lease renewed under its run's lock, as by
        :meth:`renew_lease` (a file per run: there is no single statement to make)."""
        for lease in leases:
            validate_run_id(lease.run_id)
        check_aware(now)
        if not leases:
            return {}
        return await self._call(self._renew_all_sync, leases, ttl_seconds, now)

    async def versions(self, run_ids: Sequence[str]) -> dict[str, int]:
        """One call on the store's thread; each version read from the first bytes of its run's
        head (a file per run: there is no single statement to make)."""
        for run_id in run_ids:
            validate_run_id(run_id)
        if not run_ids:
            return {}
        return await self._call(self._versions_sync, run_ids)

    async def lease_of(self, run_id: str) -> Lease | None:
        """``ReadsLeases`` (:mod:`orchestration.store`): ``lease.json`` as the last claim or renewal
        replaced it (whole: written by rename), read without the run's lock."""
        validate_run_id(run_id)
        return await self._call(self._lease_sync, run_id)

    def _lease_sync(self, run_id: str) -> Lease | None:
        run_dir = self._run_dir(run_id)
        record = read_lease(run_id, run_dir) if run_dir.is_dir() else None
        return None if record is None else Lease(run_id, record.owner, record.expires_at, record.token)

    async def release_lease(self, lease: Lease) -> None:
        validate_run_id(lease.run_id)
        await self._call(self._release_sync, lease)

    async def close(self) -> None:
        # No descriptor outlives a call, so closing only refuses further use.
        self._closed = True

"""What only the filesystem adapter promises: several processes on one root, crash safety of its
files (torn tails, a death between any two system calls of a write), corruption reported per run,
run ids that never become paths outside the root, and appends that never rewrite history."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path

import anyio
import pytest

from orchestration.core.facts import AttemptStarted
from orchestration.core.fold import fold
from orchestration.core.models import RunHead
from orchestration.core.vocabulary import RunStatus
from orchestration.errors import (
    CorruptRecord,
    FactNotFound,
    InvalidArgument,
    RunMoved,
    RunNotFound,
    StoreError,
    VersionConflict,
)
from orchestration.store import Lease, Tombstone
from stores._fs_files import head_position as _head_position
from stores._fs_files import key_name
from stores.filesystem import FilesystemStore
from tests.stores.builders import (
    BASE_TIME,
    Write,
    cancel,
    complete_task,
    new_run,
    run_id,
    start_attempt,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("fs_child.py")
CRASH_EXIT = 77


@pytest.fixture
async def fs(tmp_path: Path) -> AsyncIterator[FilesystemStore]:
    store = FilesystemStore(tmp_path / "store")
    yield store
    await store.close()


async def create(
    store: FilesystemStore, rid: str, *, at: datetime = BASE_TIME, key: str | None = None
) -> RunHead:
    head, facts = new_run(rid, at=at, key=key)
    assert (await store.create(head, facts)).created
    return head


async def commit(store: FilesystemStore, write: Write) -> RunHead:
    return await store.append(write.head.run_id, write.expected_version, write.facts, write.head)


async def run_child(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    with anyio.fail_after(120):
        return await anyio.run_process([sys.executable, str(CHILD), *args], env=env, check=False)


def run_dir(store: FilesystemStore, rid: str) -> Path:
    return store.root / "runs" / rid


def tree(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*"))


def assert_clean_log(store: FilesystemStore, rid: str, count: int) -> None:
    """facts.jsonl holds exactly ``count`` whole lines and the index exactly ``count`` records."""
    raw = (run_dir(store, rid) / "facts.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    assert raw.count(b"\n") == count
    assert (run_dir(store, rid) / "facts.idx").stat().st_size == 16 * count


# ------------------------------------------------------------------------------ processes


async def test_two_processes_appending_to_one_run(fs: FilesystemStore, tmp_path: Path) -> None:
    n = 40
    await create(fs, run_id(1))
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    results: dict[str, subprocess.CompletedProcess[bytes]] = {}

    async def worker(tag: str) -> None:
        results[tag] = await run_child("append", str(fs.root), run_id(1), tag, str(n), str(barrier), "2")

    async with anyio.create_task_group() as tg:
        for tag in ("alpha", "beta"):
            tg.start_soon(worker, tag)
    for tag, proc in results.items():
        assert proc.returncode == 0, f"{tag}: {proc.stderr.decode()}"

    facts = await fs.read_facts(run_id(1))
    assert [f.seq for f in facts] == list(range(1, 2 * n + 2))
    started = [f for f in facts if isinstance(f, AttemptStarted)]
    assert len(started) == 2 * n
    assert sum(f.executor == "provider:alpha:m" for f in started) == n
    assert sum(f.executor == "provider:beta:m" for f in started) == n
    # Each write was built on the head it replaced: attempts are numbered 1..2n with no gaps.
    assert [f.attempt for f in started] == list(range(1, 2 * n + 1))
    head = await fs.load(run_id(1))
    assert head.version == 2 * n + 1
    assert head.last_seq == 2 * n + 1
    assert fold(facts).model_copy(update={"version": head.version}) == head
    assert_clean_log(fs, run_id(1), 2 * n + 1)


async def test_processes_creating_with_one_key_make_one_run(fs: FilesystemStore, tmp_path: Path) -> None:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs: list[subprocess.CompletedProcess[bytes]] = []

    async def creator(n: int) -> None:
        procs.append(
            await run_child("create", str(fs.root), run_id(n), "one-key", str(barrier), f"p{n}", "4")
        )

    async with anyio.create_task_group() as tg:
        for n in range(1, 5):
            tg.start_soon(creator, n)
    assert all(p.returncode == 0 for p in procs), [p.stderr.decode() for p in procs]
    outcomes = sorted((barrier / f"p{n}.result").read_text() for n in range(1, 5))
    assert outcomes == ["created", "existing", "existing", "existing"]
    page = await fs.list_runs()
    assert len(page.runs) == 1
    assert page.runs[0].idempotency_key == "one-key"


async def test_two_store_objects_on_one_root_share_the_compare_and_swap(tmp_path: Path) -> None:
    first, second = FilesystemStore(tmp_path / "s"), FilesystemStore(tmp_path / "s")
    head = await create(first, run_id(1))
    for _ in range(10):
        writes = [start_attempt(head, executor="provider:a:m"), start_attempt(head, executor="provider:b:m")]
        outcomes: list[str] = []

        async def write(store: FilesystemStore, w: Write, outcomes: list[str]) -> None:
            try:
                await commit(store, w)
                outcomes.append("won")
            except VersionConflict:
                outcomes.append("lost")

        async with anyio.create_task_group() as tg:
            tg.start_soon(write, first, writes[0], outcomes)
            tg.start_soon(write, second, writes[1], outcomes)
        assert sorted(outcomes) == ["lost", "won"]
        head = await second.load(run_id(1))
    assert [f.seq for f in await first.read_facts(run_id(1))] == list(range(1, 12))


async def test_a_reopened_store_sees_everything(tmp_path: Path) -> None:
    first = FilesystemStore(tmp_path / "s")
    head = await create(first, run_id(1), key="k")
    head = await commit(first, complete_task(head, output="persisted"))
    lease = await first.claim_lease(run_id(1), "worker-a", 30, BASE_TIME)
    await first.close()

    second = FilesystemStore(tmp_path / "s")
    assert await second.load(run_id(1)) == head
    assert [f.seq for f in await second.read_facts(run_id(1))] == [1, 2, 3]
    assert (await second.create(*new_run(run_id(2), key="k"))).head == head
    assert await second.claim_lease(run_id(1), "worker-b", 30, BASE_TIME) is None
    assert lease is not None
    assert await second.renew_lease(lease, 30, BASE_TIME) == Lease(
        run_id(1), "worker-a", BASE_TIME + timedelta(seconds=30), lease.token
    )
    await second.close()


# --------------------------------------------------------------------------------- crashes


async def test_a_torn_tail_is_ignored_by_readers_and_discarded_by_the_next_append(
    fs: FilesystemStore, caplog: pytest.LogCaptureFixture
) -> None:
    head = await create(fs, run_id(1))
    head = await commit(fs, complete_task(head))
    before = await fs.read_facts(run_id(1))
    with (run_dir(fs, run_id(1)) / "facts.jsonl").open("ab") as log:
        log.write(b'{"seq":4,"at":"2026-01-01T00:00:09Z","type":"attempt_sta')
    with (run_dir(fs, run_id(1)) / "facts.idx").open("ab") as index:
        index.write(b"\x00\x00\x00\x00\x00\x00\x01")

    assert await fs.read_facts(run_id(1)) == before
    assert await fs.read_fact(run_id(1), 3) == before[-1]
    with pytest.raises(FactNotFound):
        await fs.read_fact(run_id(1), 4)

    write = start_attempt(head, "engineer")
    with caplog.at_level(logging.WARNING, logger="construct.stores"):
        await commit(fs, write)
    assert any("uncommitted" in r.getMessage() for r in caplog.records)
    assert await fs.read_facts(run_id(1)) == [*before, *write.facts]
    assert await fs.read_fact(run_id(1), 4) == write.facts[0]
    assert_clean_log(fs, run_id(1), 4)


CRASHES_DURING_APPEND = [
    pytest.param("write:1", id="before-the-facts"),
    pytest.param("write:1:torn", id="half-a-fact-line"),
    pytest.param("write:2", id="facts-written-no-index"),
    pytest.param("write:2:torn", id="half-an-index-record"),
    pytest.param("write:3:torn", id="half-the-new-head-temp-file"),
    pytest.param("replace:1", id="facts-and-index-durable-head-not-replaced"),
]


@pytest.mark.parametrize("crash", CRASHES_DURING_APPEND)
async def test_a_crash_during_an_append_leaves_the_run_as_it_was(fs: FilesystemStore, crash: str) -> None:
    head = await create(fs, run_id(1))
    head = await commit(fs, start_attempt(head))
    before = await fs.read_facts(run_id(1))

    proc = await run_child("crash-append", str(fs.root), run_id(1), crash)
    assert proc.returncode == CRASH_EXIT, proc.stderr.decode()

    assert await fs.load(run_id(1)) == head
    assert await fs.read_facts(run_id(1)) == before
    # The writer that comes next (same version, same seqs) succeeds, and nothing is duplicated.
    write = complete_task(head, output="the real output")
    assert await commit(fs, write) == write.head
    facts = await fs.read_facts(run_id(1))
    assert facts == [*before, *write.facts]
    assert [f.seq for f in facts] == [1, 2, 3, 4]
    assert_clean_log(fs, run_id(1), 4)
    reopened = FilesystemStore(fs.root)
    assert await reopened.read_facts(run_id(1)) == facts


CRASHES_DURING_CREATE = [
    pytest.param("write:1", id="staging-the-index"),
    pytest.param("write:2:torn", id="staging-the-facts"),
    pytest.param("write:3:torn", id="staging-the-chain"),
    pytest.param("write:4:torn", id="staging-the-head"),
    pytest.param("symlink:1", id="before-the-key"),
    pytest.param("fsync:3", id="key-published-not-durable"),
    pytest.param("rename:1", id="key-published-run-not"),
]


@pytest.mark.parametrize("crash", CRASHES_DURING_CREATE)
async def test_a_crash_during_create_leaves_no_run_visible(fs: FilesystemStore, crash: str) -> None:
    proc = await run_child("crash-create", str(fs.root), run_id(1), "the-key", crash)
    assert proc.returncode == CRASH_EXIT, proc.stderr.decode()

    with pytest.raises(RunNotFound):
        await fs.load(run_id(1))
    assert (await fs.list_runs()).runs == []
    assert await fs.runnable(BASE_TIME) == []
    assert not (fs.root / "runs" / run_id(1)).exists()

    # A retry with the same key (and a fresh run id) creates the run; the id is free, too.
    retried = await fs.create(*new_run(run_id(2), key="the-key"))
    assert retried.created is True
    assert retried.head.run_id == run_id(2)
    assert (await fs.create(*new_run(run_id(3), key="the-key"))).created is False
    assert (await fs.create(*new_run(run_id(1)))).created is True
    assert sorted(h.run_id for h in (await fs.list_runs()).runs) == [run_id(1), run_id(2)]
    assert list((fs.root / "tmp").iterdir()) == []


async def test_a_key_is_a_link_to_its_run_and_a_key_file_written_before_still_answers(
    fs: FilesystemStore,
) -> None:
    await fs.create(*new_run(run_id(1), key="linked"))
    entry = fs.root / "keys" / key_name("linked")
    assert entry.is_symlink() and os.readlink(entry) == run_id(1)

    # A store written before keys were links holds the run id in a regular file.
    await fs.create(*new_run(run_id(2), key="old"))
    entry = fs.root / "keys" / key_name("old")
    entry.unlink()
    entry.write_text(run_id(2) + "\n")
    found = await fs.find_by_idempotency_key("old")
    assert found is not None and found.run_id == run_id(2)
    again = await fs.create(*new_run(run_id(3), key="old"))
    assert again.created is False and again.head.run_id == run_id(2)


# ------------------------------------------------------------------------------ corruption


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b'{"run_id": "run-test-000002"}', id="missing-fields"),
        pytest.param(b"\xff\xfe\x00garbage", id="binary"),
        pytest.param(b"", id="empty"),
    ],
)
async def test_a_corrupt_head_is_reported_for_its_run_only(
    fs: FilesystemStore, damage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    for n in (1, 2, 3):
        await create(fs, run_id(n), at=BASE_TIME + timedelta(minutes=n))
    (run_dir(fs, run_id(2)) / "head.json").write_bytes(damage)

    with pytest.raises(CorruptRecord) as info:
        await fs.load(run_id(2))
    assert info.value.run_id == run_id(2)
    assert info.value.code == "corrupt_record"
    assert "head.json" in str(info.value)
    assert run_id(2) in str(info.value)
    for call in (fs.read_facts(run_id(2)), fs.read_fact(run_id(2), 1)):
        with pytest.raises(CorruptRecord):
            await call
    write = start_attempt(new_run(run_id(2))[0])
    with pytest.raises(CorruptRecord):
        await commit(fs, write)

    with caplog.at_level(logging.DEBUG, logger="construct.stores"):
        page = await fs.list_runs()
        due = await fs.runnable(BASE_TIME)
    assert [h.run_id for h in page.runs] == [run_id(3), run_id(1)]
    assert due == [run_id(1), run_id(3)]
    skipped = [r for r in caplog.records if r.name == "construct.stores" and run_id(2) in r.getMessage()]
    # Reported once at WARNING; the next scan (a dispatcher polls) repeats it only at DEBUG...
    assert [r.levelno for r in skipped] == [logging.WARNING, logging.DEBUG]
    # ... until the damage changes.
    (run_dir(fs, run_id(2)) / "head.json").write_bytes(damage + b"!")
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="construct.stores"):
        await fs.list_runs()
    skipped = [r for r in caplog.records if r.name == "construct.stores" and run_id(2) in r.getMessage()]
    assert [r.levelno for r in skipped] == [logging.WARNING]


async def test_a_missing_or_foreign_head_is_corrupt(fs: FilesystemStore) -> None:
    await create(fs, run_id(1))
    await create(fs, run_id(2))
    (run_dir(fs, run_id(1)) / "head.json").unlink()
    with pytest.raises(CorruptRecord, match=r"head\.json"):
        await fs.load(run_id(1))
    (run_dir(fs, run_id(2)) / "head.json").write_bytes(new_run(run_id(3))[0].model_dump_json().encode())
    with pytest.raises(CorruptRecord, match="run-test-000003"):
        await fs.load(run_id(2))
    # The compare-and-swap, which reads only the head's first bytes, notices it too.
    write = start_attempt(new_run(run_id(2))[0])
    with pytest.raises(CorruptRecord, match="run-test-000003"):
        await commit(fs, write)


async def test_a_corrupt_fact_is_reported_and_does_not_hide_the_others(fs: FilesystemStore) -> None:
    head = await create(fs, run_id(1))
    head = await commit(fs, complete_task(head))
    head = await commit(fs, start_attempt(head, "engineer"))
    path = run_dir(fs, run_id(1)) / "facts.jsonl"
    raw = bytearray(path.read_bytes())
    second_line = raw.index(b"\n") + 1
    raw[second_line : second_line + 6] = b"#$%^&*"  # same length: offsets stay valid
    path.write_bytes(bytes(raw))

    with pytest.raises(CorruptRecord) as info:
        await fs.read_facts(run_id(1))
    assert info.value.run_id == run_id(1)
    assert "facts.jsonl" in str(info.value)
    # read_fact goes through the index: it reads only the line it needs.
    assert (await fs.read_fact(run_id(1), 4)).seq == 4
    assert (await fs.read_fact(run_id(1), 1)).seq == 1
    with pytest.raises(CorruptRecord):
        await fs.read_fact(run_id(1), 2)
    assert [f.seq for f in await fs.read_facts(run_id(1), after_seq=2)] == [3, 4]


async def test_a_corrupt_lease_is_reported(fs: FilesystemStore) -> None:
    await create(fs, run_id(1))
    (run_dir(fs, run_id(1)) / "lease.json").write_bytes(b"{")
    with pytest.raises(CorruptRecord, match=r"lease\.json"):
        await fs.claim_lease(run_id(1), "worker-a", 30, BASE_TIME)


# ------------------------------------------------------------------------------- run ids


TRAVERSALS = [
    ".",
    "..",
    "../x",
    "../../etc",
    "../../etc/passwd",
    "/etc/passwd",
    "a/../../b",
    "run-1/../../outside",
    "run-1\x00",
    "run-1\\..\\..",
    "RUN-UPPER",
    "ab",
    "x" * 81,
]


@pytest.mark.parametrize("bad", TRAVERSALS, ids=repr)
async def test_run_ids_never_become_paths(fs: FilesystemStore, tmp_path: Path, bad: str) -> None:
    head = await create(fs, run_id(1))
    lease = Lease(bad, "worker-a", BASE_TIME, "token")
    bad_head, bad_facts = new_run(run_id(2))
    bad_head = bad_head.model_copy(update={"run_id": bad})
    write = start_attempt(head.model_copy(update={"run_id": bad}))
    before = tree(tmp_path)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "create": lambda: fs.create(bad_head, bad_facts),
        "load": lambda: fs.load(bad),
        "append": lambda: fs.append(bad, 1, write.facts, write.head),
        "read_facts": lambda: fs.read_facts(bad),
        "read_fact": lambda: fs.read_fact(bad, 1),
        "claim_lease": lambda: fs.claim_lease(bad, "worker-a", 30, BASE_TIME),
        "renew_lease": lambda: fs.renew_lease(lease, 30, BASE_TIME),
        "release_lease": lambda: fs.release_lease(lease),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidArgument):
            await call()
            pytest.fail(f"{name} accepted {bad!r}")
    assert tree(tmp_path) == before


# ------------------------------------------------------------------------------- costs


async def test_appends_never_rewrite_the_log(fs: FilesystemStore) -> None:
    head = await create(fs, run_id(1))
    head = await commit(fs, complete_task(head, "architect", "x" * 200_000))
    log = run_dir(fs, run_id(1)) / "facts.jsonl"
    prefix, inode = log.read_bytes(), log.stat().st_ino

    write = complete_task(head, "engineer", "short")
    await commit(fs, write)
    grown = log.read_bytes()
    assert log.stat().st_ino == inode
    assert grown.startswith(prefix)
    assert len(grown) - len(prefix) == sum(len(f.model_dump_json()) + 1 for f in write.facts)
    # The head references outputs by seq instead of carrying them.
    assert (run_dir(fs, run_id(1)) / "head.json").stat().st_size < 10_000


async def test_the_compare_and_swap_reads_only_the_start_of_the_head(fs: FilesystemStore) -> None:
    head = await create(fs, run_id(1))
    head = await commit(fs, complete_task(head))
    raw = (run_dir(fs, run_id(1)) / "head.json").read_bytes()
    # If RunHead's leading fields ever move, this fails and the fast path needs a new prefix.
    assert _head_position(raw[:160]) == (run_id(1), 2, 3)
    assert _head_position(raw[:40]) is None


async def test_a_head_in_another_key_order_is_read_in_full(fs: FilesystemStore) -> None:
    head = await create(fs, run_id(1))
    path = run_dir(fs, run_id(1)) / "head.json"
    path.write_text(json.dumps(json.loads(path.read_bytes()), sort_keys=True, indent=1))
    assert _head_position(path.read_bytes()[:160]) is None
    write = start_attempt(head)
    with pytest.raises(VersionConflict) as info:
        await commit(fs, Write(5, write.facts, write.head.model_copy(update={"version": 6})))
    assert info.value.actual == 1
    assert await commit(fs, write) == write.head
    assert await fs.load(run_id(1)) == write.head


# --------------------------------------------------------------------------- validation


async def test_lease_times_must_be_timezone_aware(fs: FilesystemStore) -> None:
    await create(fs, run_id(1))
    naive = datetime(2026, 1, 1)
    with pytest.raises(InvalidArgument):
        await fs.claim_lease(run_id(1), "worker-a", 30, naive)
    with pytest.raises(InvalidArgument):
        await fs.runnable(naive)


async def test_a_closed_store_refuses_work(fs: FilesystemStore) -> None:
    await create(fs, run_id(1))
    await fs.close()
    await fs.close()
    with pytest.raises(StoreError, match="closed"):
        await fs.load(run_id(1))


async def test_os_errors_become_store_errors(fs: FilesystemStore) -> None:
    await create(fs, run_id(1))
    (run_dir(fs, run_id(1)) / "facts.idx").unlink()
    write = start_attempt(await fs.load(run_id(1)))
    with pytest.raises(StoreError) as info:
        await commit(fs, write)
    assert isinstance(info.value.__cause__, OSError)


async def test_scans_read_a_terminal_run_once_and_see_every_change_of_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``list_runs`` and ``runnable`` scan every run directory; a terminal head never changes
    again, so after one scan only the runs that can still change (and a listed page) are read."""
    store, other = FilesystemStore(tmp_path / "s"), FilesystemStore(tmp_path / "s")
    heads = [await create(store, run_id(i), at=BASE_TIME + timedelta(seconds=i)) for i in range(6)]
    for head in heads[:4]:
        await commit(store, cancel(head))
    reads: list[str] = []
    load = store._load_sync

    def counting(rid: str) -> RunHead:
        reads.append(rid)
        return load(rid)

    monkeypatch.setattr(store, "_load_sync", counting)
    now = BASE_TIME + timedelta(days=1)
    assert await store.runnable(now) == [run_id(4), run_id(5)]
    assert sorted(reads) == [run_id(i) for i in range(6)]
    reads.clear()
    assert await store.runnable(now) == [run_id(4), run_id(5)]
    assert sorted(reads) == [run_id(4), run_id(5)], "terminal runs are not read again"

    # Another store object (another process) finishes run 4: this one sees it at once.
    await commit(other, cancel(await other.load(run_id(4))))
    assert await store.runnable(now) == [run_id(5)]
    reads.clear()
    page = await store.list_runs(frozenset({RunStatus.CANCELLED}), limit=2)
    assert [h.run_id for h in page.runs] == [run_id(4), run_id(3)]
    assert all(h.status == RunStatus.CANCELLED for h in page.runs)
    assert sorted(reads) == [run_id(3), run_id(4), run_id(5)], "the page and the live run only"
    rest = await store.list_runs(frozenset({RunStatus.CANCELLED}), limit=10, cursor=page.next_cursor)
    assert [h.run_id for h in rest.runs] == [run_id(2), run_id(1), run_id(0)]
    assert rest.next_cursor is None

    # A run directory removed by hand leaves the listing.
    shutil.rmtree(tmp_path / "s" / "runs" / run_id(2))
    listed = await store.list_runs(limit=10)
    assert [h.run_id for h in listed.runs] == [run_id(i) for i in (5, 4, 3, 1, 0)]
    await other.close()
    await store.close()


async def test_a_deletion_leaves_nothing_in_trash_also_after_a_crash_before_the_removal(
    tmp_path: Path,
) -> None:
    store = FilesystemStore(tmp_path)
    for n in (1, 2):
        head, facts = new_run(run_id(n))
        await store.create(head, facts)
    # A deleter killed between its rename and its removal left its run's directory in trash/.
    (tmp_path / "trash").mkdir()
    os.rename(tmp_path / "runs" / run_id(1), tmp_path / "trash" / f"{run_id(1)}.dead")
    await store.delete_run(Tombstone.of(head, "moved", head.created_at))
    assert list((tmp_path / "trash").iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == []
    await store.close()


async def test_a_write_that_reaches_a_run_deleted_meanwhile_gets_its_tombstone_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FilesystemStore(tmp_path)
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    await store.delete_run(Tombstone.of(head, "moved", head.created_at, moved_to="elsewhere"))
    # The run is deleted between a writer's check that it exists and the opening of its lock.
    monkeypatch.setattr(store, "_require_run", store._run_dir)
    write = start_attempt(head)
    with pytest.raises(RunMoved):
        await store.append(run_id(1), write.expected_version, write.facts, write.head)
    with pytest.raises(RunMoved):
        await store.claim_lease(run_id(1), "worker", 30, head.created_at)
    await store.close()


async def test_a_head_is_read_on_the_event_loop_without_a_worker_thread(
    fs: FilesystemStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load`` reads the head without a worker thread's round trip (it cost several times the read
    itself); its errors stay those of the store (gone, an OS error translated, closed)."""
    head, facts = new_run(run_id(1))
    await fs.create(head, facts)

    async def no_thread(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker thread was used")

    monkeypatch.setattr(anyio.to_thread, "run_sync", no_thread)
    assert await fs.load(run_id(1)) == head
    with pytest.raises(RunNotFound):
        await fs.load(run_id(2))
    head_file = fs.root / "runs" / run_id(1) / "head.json"
    head_file.rename(head_file.with_name("head.kept"))
    head_file.mkdir()  # reading it fails with an OSError, whoever the tests run as
    with pytest.raises(StoreError, match="failed: Is a directory"):
        await fs.load(run_id(1))
    head_file.rmdir()
    head_file.with_name("head.kept").rename(head_file)
    assert await fs.load(run_id(1)) == head
    await fs.close()
    with pytest.raises(StoreError, match="closed"):
        await fs.load(run_id(1))

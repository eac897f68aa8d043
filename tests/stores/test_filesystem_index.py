"""The filesystem store's fact index is derived from the fact log and not fsync'd by appends
(:mod:`stores._fs_index`): what an OS crash or a power loss can leave of it (short, zeroed blocks,
nothing) is read around by readers and rebuilt by the next append; a log that lacks a committed
fact is still a corrupt record."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orchestration.core.facts import Fact
from orchestration.core.models import RunHead
from orchestration.errors import CorruptRecord
from stores.filesystem import FilesystemStore
from tests.stores.builders import Write, complete_task, new_run, run_id, start_attempt


@pytest.fixture
async def fs(tmp_path: Path) -> AsyncIterator[FilesystemStore]:
    store = FilesystemStore(tmp_path / "store")
    yield store
    await store.close()


def index(store: FilesystemStore) -> Path:
    return store.root / "runs" / run_id(1) / "facts.idx"


async def commit(store: FilesystemStore, write: Write) -> RunHead:
    return await store.append(write.head.run_id, write.expected_version, write.facts, write.head)


async def five_facts(store: FilesystemStore) -> tuple[RunHead, list[Fact]]:
    head, facts = new_run(run_id(1))
    await store.create(head, facts)
    head = await commit(store, complete_task(head))
    head = await commit(store, complete_task(head, "engineer"))
    return head, await store.read_facts(run_id(1))


DAMAGE = [
    pytest.param(lambda raw: raw[:40], id="cut-mid-record"),
    pytest.param(lambda raw: raw[:32], id="short"),
    pytest.param(lambda raw: b"", id="empty"),
    pytest.param(lambda raw: raw[:48] + bytes(32), id="zeroed-last-records"),
    pytest.param(lambda raw: bytes(len(raw)), id="all-zeroed"),
]


@pytest.mark.parametrize("damage", DAMAGE)
async def test_an_index_behind_the_log_is_read_around_and_rebuilt_by_the_next_append(
    fs: FilesystemStore, damage: object, caplog: pytest.LogCaptureFixture
) -> None:
    head, facts = await five_facts(fs)
    assert len(facts) == 5
    raw = index(fs).read_bytes()
    index(fs).write_bytes(damage(raw))  # type: ignore[operator]

    assert await fs.read_facts(run_id(1)) == facts
    assert await fs.read_facts(run_id(1), after_seq=2, limit=2) == facts[2:4]
    assert [await fs.read_fact(run_id(1), seq) for seq in range(1, 6)] == facts
    assert await FilesystemStore(fs.root).read_facts(run_id(1)) == facts

    write = start_attempt(head, "reviewer")
    with caplog.at_level(logging.WARNING, logger="construct.stores"):
        await commit(fs, write)
    assert any("rebuilt" in r.getMessage() for r in caplog.records)
    assert index(fs).read_bytes()[: len(raw)] == raw
    assert index(fs).stat().st_size == 16 * 6
    assert await fs.read_facts(run_id(1)) == [*facts, *write.facts]
    assert await fs.load(run_id(1)) == write.head


async def test_an_uncommitted_tail_behind_a_short_index_is_discarded(fs: FilesystemStore) -> None:
    """A power loss after a write's facts reached the disk but before its head did, and before the
    index of earlier writes did: the next append rebuilds the committed records only."""
    head, facts = await five_facts(fs)
    log = fs.root / "runs" / run_id(1) / "facts.jsonl"
    committed = log.read_bytes()
    uncommitted = complete_task(head, "reviewer", "never committed")
    with log.open("ab") as out:
        out.write(b"".join(f.model_dump_json().encode() + b"\n" for f in uncommitted.facts))
    index(fs).write_bytes(index(fs).read_bytes()[:48])

    assert await fs.read_facts(run_id(1)) == facts
    write = start_attempt(head, "reviewer")
    await commit(fs, write)
    assert log.read_bytes() == committed + write.facts[0].model_dump_json().encode() + b"\n"
    assert await fs.read_facts(run_id(1)) == [*facts, *write.facts]


async def test_a_log_without_a_committed_fact_is_corrupt_whatever_the_index_says(
    fs: FilesystemStore,
) -> None:
    head, facts = await five_facts(fs)
    log = fs.root / "runs" / run_id(1) / "facts.jsonl"
    log.write_bytes(log.read_bytes()[: -len(facts[-1].model_dump_json()) - 1])
    index(fs).write_bytes(index(fs).read_bytes()[:32])
    with pytest.raises(CorruptRecord, match="committed fact 5"):
        await fs.read_facts(run_id(1))
    with pytest.raises(CorruptRecord, match="committed fact 5"):
        await commit(fs, start_attempt(head, "reviewer"))


async def test_an_append_fsyncs_the_log_the_head_and_the_directory(
    fs: FilesystemStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    head, _ = await five_facts(fs)
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1])
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    await commit(fs, start_attempt(head, "reviewer"))
    # The log and the new head's temp file together (either may finish first), then the rename's
    # directory; the index is not fsync'd.
    assert sorted(synced[:2]) == ["facts.jsonl", "head.json.tmp"]
    assert synced[2:] == [run_id(1)]


async def test_a_create_fsyncs_the_log_chain_head_and_directories_but_not_the_index(
    fs: FilesystemStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await fs.list_runs()  # the store's directories exist before
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1])
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    await fs.create(*new_run(run_id(1), key="k"))
    *together, last = synced
    staged = [name for name in together if name.startswith("run.")]
    assert len(staged) == 1 and sorted(set(together) - set(staged)) == [
        "chain.json",
        "facts.jsonl",
        "head.json",
        "keys",
    ]
    assert len(together) == 5 and last == "runs"


async def test_a_hole_before_the_last_records_is_read_around(fs: FilesystemStore) -> None:
    """Appends check only the last committed records (their cost must not grow with the run), so
    zeroed records before them stay on disk; readers check every record they use and read the log
    instead."""
    head, facts = await five_facts(fs)
    raw = index(fs).read_bytes()
    index(fs).write_bytes(raw[:16] + bytes(32) + raw[48:])
    write = start_attempt(head, "reviewer")
    await commit(fs, write)
    assert await fs.read_facts(run_id(1)) == [*facts, *write.facts]
    assert await fs.read_fact(run_id(1), 2) == facts[1]
    assert await fs.read_facts(run_id(1), after_seq=3) == [*facts[3:], *write.facts]

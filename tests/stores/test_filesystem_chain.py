"""The filesystem store writes a run's chain snapshot once (``chain.json``, by the create) and heads
without it (:mod:`stores._fs_chain`); runs written by the previous version, whose heads hold their
chain, stay readable and writable as they are."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orchestration.core.models import RunHead
from orchestration.errors import CorruptRecord
from stores._common import encode_head
from stores._fs_chain import holds_chain
from stores.filesystem import FilesystemStore
from tests.stores.builders import Write, complete_task, new_run, run_id, start_attempt


@pytest.fixture
async def fs(tmp_path: Path) -> AsyncIterator[FilesystemStore]:
    store = FilesystemStore(tmp_path / "store")
    yield store
    await store.close()


def run_dir(store: FilesystemStore, rid: str) -> Path:
    return store.root / "runs" / rid


async def commit(store: FilesystemStore, write: Write) -> RunHead:
    return await store.append(write.head.run_id, write.expected_version, write.facts, write.head)


def stored_head(store: FilesystemStore, rid: str) -> dict[str, object]:
    return dict(json.loads((run_dir(store, rid) / "head.json").read_bytes()))


# A request that looks like the keys around it, to fool a reader that would search the text.
TRICKY = 'x","chain":{"steps":[]},"chain_hash":"\\" é \x00'


async def test_the_chain_is_written_once_by_the_create_and_put_back_into_every_head(
    fs: FilesystemStore,
) -> None:
    head, facts = new_run(run_id(1), request=TRICKY)
    await fs.create(head, facts)
    chain = run_dir(fs, run_id(1)) / "chain.json"
    written = chain.stat()
    assert json.loads(chain.read_bytes()) == json.loads(head.chain.model_dump_json(exclude_defaults=True))
    assert "chain" not in stored_head(fs, run_id(1))
    assert await fs.load(run_id(1)) == head

    write = complete_task(head)
    await commit(fs, write)
    write = start_attempt(write.head, "engineer")
    await commit(fs, write)
    assert "chain" not in stored_head(fs, run_id(1))
    assert (chain.stat().st_ino, chain.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert await fs.load(run_id(1)) == write.head
    assert (await fs.list_runs()).runs == [write.head]
    assert await FilesystemStore(fs.root).load(run_id(1)) == write.head


async def test_a_run_written_by_the_previous_version_is_read_and_written_as_it_is(
    fs: FilesystemStore,
) -> None:
    """The previous layout: no chain.json, the chain inside head.json (written as that version
    wrote it). Loads, lists and appends work; appends keep the chain in the head."""
    head, facts = new_run(run_id(1), request=TRICKY)
    await fs.create(head, facts)
    (run_dir(fs, run_id(1)) / "head.json").write_bytes(encode_head(head).encode())
    (run_dir(fs, run_id(1)) / "chain.json").unlink()
    assert "chain" in stored_head(fs, run_id(1))
    assert await fs.load(run_id(1)) == head

    write = complete_task(head)
    await commit(fs, write)
    assert "chain" in stored_head(fs, run_id(1))
    assert not (run_dir(fs, run_id(1)) / "chain.json").exists()
    assert await fs.load(run_id(1)) == write.head
    assert (await fs.list_runs()).runs == [write.head]
    assert await fs.read_facts(run_id(1)) == [*facts, *write.facts]


async def test_a_head_holding_its_chain_is_read_as_it_is_in_any_key_order(fs: FilesystemStore) -> None:
    head, facts = new_run(run_id(1))
    await fs.create(head, facts)
    path = run_dir(fs, run_id(1)) / "head.json"
    # Next to chain.json, a head that holds a chain (written by hand) is read as it is...
    full = json.loads(encode_head(head))
    path.write_text(json.dumps(full, sort_keys=True, indent=1))
    assert await fs.load(run_id(1)) == head
    # ...and one without it, in another key order, gets chain.json's.
    path.write_text(json.dumps({k: v for k, v in full.items() if k != "chain"}, sort_keys=True))
    assert await fs.load(run_id(1)) == head


def test_holds_chain_reads_the_keys_not_the_strings() -> None:
    head = new_run(run_id(1), request=TRICKY)[0]
    assert holds_chain(encode_head(head).encode())
    assert not holds_chain(encode_head(head, with_chain=False).encode())
    assert holds_chain(b"not json") and holds_chain(b"[1]")


async def test_a_missing_chain_file_is_a_corrupt_record(fs: FilesystemStore) -> None:
    await fs.create(*new_run(run_id(1)))
    (run_dir(fs, run_id(1)) / "chain.json").unlink()
    with pytest.raises(CorruptRecord, match=r"chain\.json is missing"):
        await fs.load(run_id(1))
    assert (await fs.list_runs()).runs == []

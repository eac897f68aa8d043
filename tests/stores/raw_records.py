"""Raw access to what each adapter stores for a run, below the ``RunStore`` API: the stored head and
facts as JSON text, to read them, plant records the adapter did not write (a newer version's), and
compare everything stored for a run before and after an operation.

The memory store keeps records as objects, not text: planting there validates the text leniently
(a record that does not validate at all, such as a fact of an unknown type, cannot be planted; see
:attr:`RawRecords.holds_text`).
"""

from __future__ import annotations

import json
import sqlite3
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestration.core.facts import FACT_ADAPTER
from orchestration.core.models import RunHead
from orchestration.store import RunStore
from stores._fs_chain import with_chain
from stores._sql import queries
from stores.filesystem import FilesystemStore
from stores.memory import MemoryStore
from stores.postgres import PostgresStore
from stores.sqlite import SqliteStore

_INDEX_RECORD = struct.Struct(">QQ")  # stores.filesystem: (start, end) of each fact's line


@dataclass
class RawRecords:
    store: RunStore

    @property
    def holds_text(self) -> bool:
        """False for the memory store, which keeps records as objects."""
        return not isinstance(self.store, MemoryStore)

    async def head(self, run_id: str) -> dict[str, Any]:
        return dict(json.loads(await self.head_text(run_id)))

    async def fact(self, run_id: str, seq: int) -> dict[str, Any]:
        return dict(json.loads(await self.fact_text(run_id, seq)))

    async def head_text(self, run_id: str) -> str:
        store = self.store
        if isinstance(store, MemoryStore):
            return store._heads[run_id].model_dump_json()
        if isinstance(store, FilesystemStore):
            # The head with its chain snapshot, which the store keeps in chain.json (_fs_chain).
            path = _run_dir(store, run_id) / "head.json"
            return with_chain(run_id, path, path.read_bytes()).decode()
        if isinstance(store, SqliteStore):
            # The head with its chain snapshot, which the SQL stores keep in a column of their own.
            load = queries("sqlite")["load_head"].replace(":run_id", "?")
            return str(_sqlite(store.path, load, run_id)[0][0])
        return str(await _postgres(store, "fetchval", queries("postgres")["load_head"], run_id))

    async def fact_text(self, run_id: str, seq: int) -> str:
        store = self.store
        if isinstance(store, MemoryStore):
            return store._facts[run_id][seq - 1].model_dump_json()
        if isinstance(store, FilesystemStore):
            return _fs_lines(store, run_id)[seq - 1].decode().rstrip("\n")
        if isinstance(store, SqliteStore):
            rows = _sqlite(store.path, "SELECT body FROM facts WHERE run_id = ? AND seq = ?", run_id, seq)
            return str(rows[0][0])
        query = "SELECT body::text FROM facts WHERE run_id = $1 AND seq = $2"
        return str(await _postgres(store, "fetchval", query, run_id, seq))

    async def set_head(self, run_id: str, record: dict[str, Any]) -> None:
        """Replace the stored head by ``record`` as it is (nothing is checked)."""
        store, text = self.store, json.dumps(record, separators=(",", ":"))
        if isinstance(store, MemoryStore):
            store._heads[run_id] = RunHead.model_validate_json(text, extra="ignore")
        elif isinstance(store, FilesystemStore):
            (_run_dir(store, run_id) / "head.json").write_text(text)
        elif isinstance(store, SqliteStore):
            if "chain" not in record:
                _sqlite(store.path, "UPDATE runs SET head = ? WHERE run_id = ?", text, run_id)
            else:
                # The chain snapshot goes to its own column, as the store writes it.
                head = json.dumps({k: v for k, v in record.items() if k != "chain"}, separators=(",", ":"))
                chain = json.dumps(record["chain"], separators=(",", ":"))
                query = "UPDATE runs SET head = ?, chain = ? WHERE run_id = ?"
                _sqlite(store.path, query, head, chain, run_id)
        else:
            query = (
                "UPDATE runs SET head = $1::jsonb - 'chain', "
                "chain = coalesce($1::jsonb -> 'chain', chain) WHERE run_id = $2"
            )
            await _postgres(store, "execute", query, text, run_id)

    async def set_fact(self, run_id: str, seq: int, record: dict[str, Any]) -> None:
        """Replace stored fact ``seq`` by ``record`` as it is (nothing is checked)."""
        store, text = self.store, json.dumps(record, separators=(",", ":"))
        if isinstance(store, MemoryStore):
            store._facts[run_id][seq - 1] = FACT_ADAPTER.validate_json(text, extra="ignore")
        elif isinstance(store, FilesystemStore):
            lines = _fs_lines(store, run_id)
            lines[seq - 1] = text.encode() + b"\n"
            run_dir = _run_dir(store, run_id)
            (run_dir / "facts.jsonl").write_bytes(b"".join(lines))
            index, start = bytearray(), 0
            for line in lines:
                index += _INDEX_RECORD.pack(start, start + len(line))
                start += len(line)
            (run_dir / "facts.idx").write_bytes(bytes(index))
        elif isinstance(store, SqliteStore):
            query = "UPDATE facts SET body = ?, type = ? WHERE run_id = ? AND seq = ?"
            _sqlite(store.path, query, text, record["type"], run_id, seq)
        else:
            query = "UPDATE facts SET body = $1::jsonb, type = $2 WHERE run_id = $3 AND seq = $4"
            await _postgres(store, "execute", query, text, record["type"], run_id, seq)

    async def everything(self, run_id: str) -> object:
        """All that is stored for the run (its head and facts; the lease is not a record), exactly:
        bytes of files, text of rows, the objects the memory store holds."""
        store = self.store
        if isinstance(store, MemoryStore):
            return (store._heads[run_id], list(store._facts[run_id]))
        if isinstance(store, FilesystemStore):
            run_dir = _run_dir(store, run_id)
            names = ("head.json", "chain.json", "facts.jsonl", "facts.idx")
            return {name: (run_dir / name).read_bytes() for name in names}
        if isinstance(store, SqliteStore):
            return (
                _sqlite(store.path, "SELECT * FROM runs WHERE run_id = ?", run_id),
                _sqlite(store.path, "SELECT * FROM facts WHERE run_id = ? ORDER BY seq", run_id),
            )
        return (
            await _postgres(store, "fetch", "SELECT *, head::text FROM runs WHERE run_id = $1", run_id),
            await _postgres(
                store, "fetch", "SELECT *, body::text FROM facts WHERE run_id = $1 ORDER BY seq", run_id
            ),
        )


def _run_dir(store: FilesystemStore, run_id: str) -> Path:
    return store.root / "runs" / run_id


def _fs_lines(store: FilesystemStore, run_id: str) -> list[bytes]:
    run_dir = _run_dir(store, run_id)
    data = (run_dir / "facts.jsonl").read_bytes()
    index = (run_dir / "facts.idx").read_bytes()
    return [data[start:end] for start, end in _INDEX_RECORD.iter_unpack(index)]


def _sqlite(path: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        with conn:
            return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


async def _postgres(store: RunStore, method: str, sql: str, *params: object) -> Any:
    assert isinstance(store, PostgresStore)
    async with store._pool.acquire() as conn:
        result = await getattr(conn, method)(sql, *params)
    if method == "fetch":
        return [tuple(row) for row in result]
    return result

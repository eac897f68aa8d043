"""Chain versions for the SQL stores (mixins of :class:`stores.sqlite.SqliteStore` and
:class:`stores.postgres.PostgresStore`): a ``chain_versions`` table (migration chain_versions), a
row per version. A new version is numbered in a transaction that serializes the keeps of its name
(SQLite: the writer's ``BEGIN IMMEDIATE``; PostgreSQL: an advisory lock on the name), so servers
sharing the database number a name's versions alike."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from orchestration.core import ChainSnapshot
from orchestration.store import ChainSource, ChainVersion
from stores._chain_versions import (
    decode_version,
    encode_version,
    forgettable,
    found_version,
    next_version,
)
from stores._sql import queries
from stores._sqlite_thread import fetch_all

T = TypeVar("T")
SQ = queries("sqlite")
PQ = queries("postgres")


def _decoded(rows: Sequence[Any]) -> list[ChainVersion]:
    return [decode_version("chain_versions", str(row[0])) for row in rows]


class SqliteChainVersions:
    """``KeepsChainVersions`` of the SQLite store (see above)."""

    if TYPE_CHECKING:

        async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _read(self, sql: str, params: dict[str, Any]) -> list[Any]: ...

    async def keep_chain_version(
        self, chain: ChainSnapshot, source: ChainSource, label: str | None, now: datetime
    ) -> ChainVersion:
        """See ``KeepsChainVersions.keep_chain_version``: one write transaction."""

        def work(conn: sqlite3.Connection) -> ChainVersion:
            kept = _decoded(fetch_all(conn, SQ["chain_versions"], {"name": chain.name}))
            found = found_version(kept, chain.content_hash())
            if found is not None:
                return found
            version = next_version(chain, source, label, now, after=kept[-1].ordinal if kept else 0)
            conn.execute(
                SQ["insert_chain_version"],
                {
                    "name": version.name,
                    "ordinal": version.ordinal,
                    "chain_hash": version.chain_hash,
                    "body": encode_version(version),
                },
            )
            return version

        return await self._write(work)

    async def chain_versions(self, name: str) -> list[ChainVersion]:
        """See ``KeepsChainVersions.chain_versions``."""
        return _decoded(await self._read(SQ["chain_versions"], {"name": name}))

    async def forget_chain_versions(self, keep: Sequence[str]) -> int:
        """See ``KeepsChainVersions.forget_chain_versions``: one write transaction."""

        def work(conn: sqlite3.Connection) -> int:
            held = {str(row[0]) for row in fetch_all(conn, SQ["held_chain_hashes"], {})}
            every = _decoded(fetch_all(conn, SQ["every_chain_version"], {}))
            gone = forgettable(every, held, keep)
            for version in gone:
                conn.execute(SQ["delete_chain_version"], {"name": version.name, "ordinal": version.ordinal})
            return len(gone)

        return await self._write(work)


class PostgresChainVersions:
    """``KeepsChainVersions`` of the PostgreSQL store (see above)."""

    if TYPE_CHECKING:

        def _connection(self) -> AbstractAsyncContextManager[Any]: ...

        def _transaction(self) -> AbstractAsyncContextManager[Any]: ...

    async def keep_chain_version(
        self, chain: ChainSnapshot, source: ChainSource, label: str | None, now: datetime
    ) -> ChainVersion:
        """See ``KeepsChainVersions.keep_chain_version``: one transaction holding the name's lock."""
        async with self._transaction() as conn:
            await conn.execute(PQ["lock_chain_name"], chain.name)
            kept = _decoded(await conn.fetch(PQ["chain_versions"], chain.name))
            found = found_version(kept, chain.content_hash())
            if found is not None:
                return found
            version = next_version(chain, source, label, now, after=kept[-1].ordinal if kept else 0)
            await conn.execute(
                PQ["insert_chain_version"],
                version.name,
                version.ordinal,
                version.chain_hash,
                encode_version(version),
            )
            return version

    async def chain_versions(self, name: str) -> list[ChainVersion]:
        """See ``KeepsChainVersions.chain_versions``."""
        async with self._connection() as conn:
            return _decoded(await conn.fetch(PQ["chain_versions"], name))

    async def forget_chain_versions(self, keep: Sequence[str]) -> int:
        """See ``KeepsChainVersions.forget_chain_versions``: one transaction. A run created on a
        version while it is removed keeps its own snapshot; that version is kept anew when next
        seen."""
        async with self._transaction() as conn:
            every = _decoded(await conn.fetch(PQ["every_chain_version"]))
            held = {str(row[0]) for row in await conn.fetch(PQ["held_chain_hashes"]) if row[0]}
            gone = forgettable(every, held, keep)
            for version in gone:
                await conn.execute(PQ["delete_chain_version"], version.name, version.ordinal)
            return len(gone)


__all__ = ["PostgresChainVersions", "SqliteChainVersions"]

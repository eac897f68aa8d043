"""Retention for the SQLite store (a mixin of :class:`stores.sqlite.SqliteStore`): importing a whole
run, deleting a run behind a tombstone, and what a deleted run's id answers. Both are one
``BEGIN IMMEDIATE`` transaction, so no append or claim comes in between; ``read_facts`` checks the
run still exists after reading, so it returns the whole log or the tombstone's error.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from orchestration.core import Fact, RunHead, validate_run_id
from orchestration.errors import Conflict, RunNotFound
from orchestration.store import Tombstone
from stores._retention import check_delete, check_import, decode_tombstone, deleted_already, encode_tombstone
from stores._sql import decode_head, queries
from stores._sqlite_rows import fact_row, run_row
from stores._sqlite_thread import fetch_all

Q = queries("sqlite")
T = TypeVar("T")


def _gone_from(run_id: str, rows: list[Any], *, by_key: bool = False) -> RunNotFound:
    if not rows:
        return RunNotFound(run_id)
    return decode_tombstone(run_id, str(rows[0][0])).error(by_key=by_key)


def missing(conn: sqlite3.Connection, run_id: str) -> RunNotFound:
    """The error for a run id with no run row, read in the caller's transaction (on the
    connection's thread): the tombstone's, else not found."""
    return _gone_from(run_id, fetch_all(conn, Q["tombstone_by_run"], {"run_id": run_id}))


def check_key_free(conn: sqlite3.Connection, key: str | None) -> None:
    """Refuse a create whose idempotency key is a deleted run's: that run's tombstone error."""
    if key is None:
        return
    rows = fetch_all(conn, Q["tombstone_by_key"], {"idempotency_key": key})
    if rows:
        raise _gone_from(str(rows[0][0]), [rows[0][1:]], by_key=True)


class SqliteRetention:
    """``import_run``, ``delete_run`` and ``tombstone`` of the SQLite store (see above)."""

    if TYPE_CHECKING:

        async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _read(self, sql: str, params: dict[str, Any]) -> list[Any]: ...

    async def _gone(self, run_id: str) -> RunNotFound:
        """The error for a run id with no run row (read outside a transaction)."""
        return _gone_from(run_id, await self._read(Q["tombstone_by_run"], {"run_id": run_id}))

    async def import_run(self, head: RunHead, facts: Sequence[Fact]) -> RunHead:
        """See ``RunStore.import_run``: one transaction."""
        validate_run_id(head.run_id)
        check_import(head, facts)
        run_id = head.run_id

        new_run = run_row(head)
        fact_rows = [fact_row(run_id, f) for f in facts]

        def work(conn: sqlite3.Connection) -> RunHead:
            if fetch_all(conn, Q["run_version"], {"run_id": run_id}):
                raise Conflict(f"this store already has run {run_id}")
            key = head.idempotency_key
            if key is not None:
                for query in ("head_by_idempotency_key", "tombstone_by_key"):
                    rows = fetch_all(conn, Q[query], {"idempotency_key": key})
                    if rows and rows[0][0] != run_id:
                        raise Conflict(f"the idempotency key of run {run_id} is run {rows[0][0]}'s here")
            conn.execute(Q["delete_tombstone"], {"run_id": run_id})
            conn.execute(Q["insert_run"], new_run)
            conn.executemany(Q["insert_fact"], fact_rows)
            return head

        return await self._write(work)

    async def delete_run(self, tombstone: Tombstone) -> None:
        """See ``RunStore.delete_run``: one ``BEGIN IMMEDIATE`` transaction."""
        run_id = validate_run_id(tombstone.run_id)

        row = {
            "run_id": run_id,
            "idempotency_key": tombstone.idempotency_key,
            "body": encode_tombstone(tombstone),
        }

        def work(conn: sqlite3.Connection) -> None:
            rows = fetch_all(conn, Q["load_head"], {"run_id": run_id})
            if not rows:
                stored = fetch_all(conn, Q["tombstone_by_run"], {"run_id": run_id})
                if not stored:
                    raise RunNotFound(run_id)
                deleted_already(decode_tombstone(run_id, str(stored[0][0])), tombstone)
                return
            check_delete(decode_head(run_id, rows[0][0]), tombstone)
            for query in ("delete_run_leases", "delete_run_facts", "delete_run"):
                conn.execute(Q[query], {"run_id": run_id})
            conn.execute(Q["insert_tombstone"], row)

        await self._write(work)

    async def tombstone(self, run_id: str) -> Tombstone | None:
        validate_run_id(run_id)
        rows = await self._read(Q["tombstone_by_run"], {"run_id": run_id})
        return decode_tombstone(run_id, str(rows[0][0])) if rows else None

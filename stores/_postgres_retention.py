"""Retention for the PostgreSQL store (a mixin of :class:`stores.postgres.PostgresStore`): importing
a whole run, deleting a run behind a tombstone, and what a deleted run's id answers.

A deletion is one transaction holding the run row's lock, so an append or a claim that races it
finds the tombstone; ``read_facts`` checks the run still exists after reading, so it never returns
part of a run. A create checks the tombstones for its key after inserting its row, in a VOLATILE
function with a snapshot of its own, so a prune that commits meanwhile is seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from orchestration.core import Fact, RunHead, validate_run_id
from orchestration.errors import Conflict, RunNotFound
from orchestration.store import Tombstone
from stores._jsonb import from_jsonb_text
from stores._postgres_rows import fact_values, run_values
from stores._retention import check_delete, check_import, decode_tombstone, deleted_already, encode_tombstone
from stores._sql import decode_head, queries

Q = queries("postgres")


def _gone_from(run_id: str, body: str | None, *, by_key: bool = False) -> RunNotFound:
    if body is None:
        return RunNotFound(run_id)
    return decode_tombstone(run_id, body).error(by_key=by_key)


async def missing(conn: Any, run_id: str) -> RunNotFound:
    """The error for a run id with no run row: its tombstone's, else not found."""
    return _gone_from(run_id, await conn.fetchval(Q["tombstone_by_run"], run_id))


def gone_by_key(run_id: str, body: str) -> RunNotFound:
    """The error of a start whose idempotency key is deleted run ``run_id``'s (its tombstone's
    ``body``)."""
    return _gone_from(run_id, body, by_key=True)


#: The SQLSTATE construct_key_free raises (migration 0012): the create's key is a deleted run's.
KEY_OF_A_DELETED_RUN = "CX001"


def refused_by_tombstone(exc: BaseException) -> RunNotFound | None:
    """The error of a create that ``construct_key_free`` refused (``exc``, the driver's error:
    the deleted run's id in its detail, the tombstone in its hint), else None."""
    if getattr(exc, "sqlstate", None) != KEY_OF_A_DELETED_RUN:
        return None
    return gone_by_key(str(getattr(exc, "detail", "")), str(getattr(exc, "hint", "")))


class PostgresRetention:
    """``import_run``, ``delete_run`` and ``tombstone`` of the PostgreSQL store (see above)."""

    if TYPE_CHECKING:

        def _connection(self) -> AbstractAsyncContextManager[Any]: ...

        def _transaction(self) -> AbstractAsyncContextManager[Any]: ...

        async def _notify_if_runnable(self, conn: Any, head: RunHead) -> None: ...

    async def _gone(self, run_id: str) -> RunNotFound:
        async with self._connection() as conn:
            return await missing(conn, run_id)

    async def import_run(self, head: RunHead, facts: Sequence[Fact]) -> RunHead:
        """See ``RunStore.import_run``: one transaction (a ``queued`` run is announced on commit)."""
        validate_run_id(head.run_id)
        check_import(head, facts)
        run_id = head.run_id
        async with self._transaction() as conn:
            key = head.idempotency_key
            if key is not None:
                owner = await conn.fetchval(Q["tombstone_by_key"], key)
                if owner is not None and owner != run_id:
                    raise Conflict(f"the idempotency key of run {run_id} is run {owner}'s here")
            await conn.execute(Q["delete_tombstone"], run_id)
            if await conn.fetchval(Q["insert_run"], *run_values(head)) is None:
                if await conn.fetchval(Q["run_version"], run_id) is not None:
                    raise Conflict(f"this store already has run {run_id}")
                raise Conflict(f"the idempotency key of run {run_id} is another run's here")
            await conn.execute(Q["insert_facts"], *fact_values(run_id, facts))
            await self._notify_if_runnable(conn, head)
        return head

    async def delete_run(self, tombstone: Tombstone) -> None:
        """See ``RunStore.delete_run``: one transaction, the run row locked first."""
        run_id = validate_run_id(tombstone.run_id)
        async with self._transaction() as conn:
            raw = await conn.fetchval(Q["lock_head"], run_id)
            if raw is None:
                body = await conn.fetchval(Q["tombstone_by_run"], run_id)
                if body is None:
                    raise RunNotFound(run_id)
                deleted_already(decode_tombstone(run_id, body), tombstone)
                return
            check_delete(decode_head(run_id, from_jsonb_text(raw)), tombstone)
            for query in ("delete_run_leases", "delete_run_facts", "delete_run"):
                await conn.execute(Q[query], run_id)
            await conn.execute(
                Q["insert_tombstone"], run_id, tombstone.idempotency_key, encode_tombstone(tombstone)
            )

    async def tombstone(self, run_id: str) -> Tombstone | None:
        validate_run_id(run_id)
        async with self._connection() as conn:
            body = await conn.fetchval(Q["tombstone_by_run"], run_id)
        return decode_tombstone(run_id, body) if body is not None else None


__all__ = ["KEY_OF_A_DELETED_RUN", "PostgresRetention", "gone_by_key", "missing", "refused_by_tombstone"]

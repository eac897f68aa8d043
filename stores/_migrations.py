"""The migration runner of the SQL stores: :func:`run_migrations` applies the pending numbered,
forward-only migrations in order, each in one transaction with its ``schema_migrations`` row, under
a lock that makes concurrent migrators apply each once; :func:`check_schema`, run at open, refuses
a schema behind (:class:`SchemaOutOfDate`) or ahead of (:class:`SchemaTooNew`) this code.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from orchestration.errors import StoreUnavailable
from stores._sql import Dialect, Migration
from stores._sql import migrations as packaged_migrations

__all__ = [
    "MigrationReport",
    "MigrationTarget",
    "SchemaOutOfDate",
    "SchemaTooNew",
    "check_schema",
    "run_migrations",
]

log = logging.getLogger(__name__)


class SchemaOutOfDate(StoreUnavailable):
    """The store's schema is older than this code: ``construct-mcp migrate`` brings it up to date."""

    code = "schema_out_of_date"

    def __init__(self, where: str, current: int, head: int) -> None:
        super().__init__(
            f"{where}: schema is at version {current}, head is {head}, run `construct-mcp migrate` "
            "(with --store pointing at this store) to upgrade it"
        )
        self.current = current
        self.head = head


class SchemaTooNew(StoreUnavailable):
    """The store was migrated by a newer construct-mcp than this one."""

    code = "schema_too_new"

    def __init__(self, where: str, current: int, head: int) -> None:
        super().__init__(
            f"{where}: schema is at version {current}, but this construct-mcp only knows up to version "
            f"{head}; upgrade construct-mcp"
        )
        self.current = current
        self.head = head


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What :func:`run_migrations` (and so ``construct-mcp migrate``) found and did. ``store`` is
    the store's URL with any password redacted."""

    store: str
    backend: str
    from_version: int
    to_version: int
    head_version: int
    applied: tuple[str, ...] = field(default=())

    @property
    def up_to_date(self) -> bool:
        return self.to_version == self.head_version

    def summary(self) -> str:
        """One line for the CLI."""
        if self.head_version == 0:
            return f"{self.backend} store {self.store} has no schema to migrate"
        if not self.applied:
            return f"{self.backend} store {self.store} is at version {self.to_version} (head): nothing to do"
        return (
            f"{self.backend} store {self.store}: migrated from version {self.from_version} to "
            f"{self.to_version} ({', '.join(self.applied)})"
        )


class MigrationTarget(Protocol):
    """One open connection to a SQL store, as the migration runner needs it."""

    dialect: Dialect

    async def current_version(self) -> int:
        """The highest applied version; 0 when there is no ``schema_migrations`` table. Creates
        nothing."""
        ...

    async def apply(self, migration: Migration) -> bool:
        """In one transaction, under the migration lock: if the schema is at
        ``migration.version - 1``, run the migration and record it, and return True; if it is
        already at or past ``migration.version`` (another migrator won), return False."""
        ...


async def check_schema(target: MigrationTarget, where: str, head: int | None = None) -> int:
    """The schema's version, if it is exactly ``head`` (default: the packaged head); otherwise raise
    :class:`SchemaOutOfDate` or :class:`SchemaTooNew`, whose message says what to do."""
    if head is None:
        found = packaged_migrations(target.dialect)
        head = found[-1].version if found else 0
    current = await target.current_version()
    if current < head:
        raise SchemaOutOfDate(where, current, head)
    if current > head:
        raise SchemaTooNew(where, current, head)
    return current


async def run_migrations(
    target: MigrationTarget,
    *,
    store: str,
    backend: str,
    check_only: bool = False,
    migrations: Sequence[Migration] | None = None,
) -> MigrationReport:
    """Apply ``migrations`` (default: the packaged ones) that ``target`` does not have yet, in
    order. With ``check_only``, apply nothing and raise :class:`SchemaOutOfDate` if any is pending."""
    todo = tuple(migrations) if migrations is not None else packaged_migrations(target.dialect)
    head = todo[-1].version if todo else 0
    current = await target.current_version()
    if check_only:
        await check_schema(target, f"the {backend} store {store}", head)
        return MigrationReport(store, backend, current, current, head)
    if current > head:
        raise SchemaTooNew(f"the {backend} store {store}", current, head)
    start = current
    applied: list[str] = []
    for migration in todo:
        if migration.version <= current:
            continue
        # False means a concurrent migrator applied it first: not ours to report, but done.
        if await target.apply(migration):
            applied.append(migration.name)
            log.info(
                "migration applied",
                extra={"action": "store.migration_applied", "store": store, "migration": migration.name},
            )
        current = migration.version
    return MigrationReport(store, backend, start, current, head, tuple(applied))

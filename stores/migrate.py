"""Schema migrations for the SQL stores: the ``construct-mcp migrate [--check] [--store URL]``
command (:func:`migrate`).

Migrations are the numbered, forward-only ``.sql`` files under ``stores/sql/<dialect>/migrations``;
a ``schema_migrations`` table records the ones applied. :func:`migrate` applies the pending ones in
order, each in its own transaction together with its ``schema_migrations`` row, under a lock that
makes concurrent migrators apply each migration once (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: a
transaction-scoped advisory lock). Applying twice is a no-op. The runner itself lives in
``stores._migrations``, which the adapters use; its report and its errors are re-exported here.

Adapters check the schema version when they open and refuse a schema that is behind
(:class:`SchemaOutOfDate`) or ahead of this code (:class:`SchemaTooNew`); the sqlite adapter migrates
its own file at open by default (see :class:`stores.sqlite.SqliteStore`), postgres never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stores import parse_store_spec
from stores._migrations import MigrationReport, SchemaOutOfDate, SchemaTooNew
from stores._sql import Migration

__all__ = ["MigrationReport", "SchemaOutOfDate", "SchemaTooNew", "migrate"]


async def migrate(
    store_url: str,
    check_only: bool = False,
    *,
    home: Path | None = None,
    migrations: Sequence[Migration] | None = None,
) -> MigrationReport:
    """Bring the schema of the store at ``store_url`` to the head version (``construct-mcp
    migrate``), or with ``check_only`` (``--check``) only verify that it is there.

    ``store_url`` is anything :func:`stores.open_store` accepts (``sqlite:///file.db``,
    ``postgresql://user@host/db?schema=name``, the names ``sqlite`` / ``postgres``, ...); ``home``
    resolves the default sqlite file and relative paths. Stores without a schema (memory,
    filesystem) report head version 0 and nothing applied.

    Each pending migration runs in its own transaction with its ``schema_migrations`` row; running
    ``migrate`` again, or from two processes at once, applies nothing twice. ``migrations`` replaces
    the packaged list (tests use it to build an older schema).

    Raises :class:`SchemaOutOfDate` (``check_only`` and a migration is pending: the message says
    ``schema is at version X, head is Y, run `construct-mcp migrate```), :class:`SchemaTooNew`,
    ``StoreUnavailable`` (cannot connect; the message never contains a password), ``StoreError``
    (a migration failed; its transaction was rolled back), ``ConfigError`` (unreadable URL).
    """
    spec = parse_store_spec(store_url, home=home or Path.home() / ".construct")
    if spec.backend == "sqlite":
        from stores.sqlite import migrate_sqlite

        assert spec.path is not None
        return await migrate_sqlite(spec.path, check_only=check_only, migrations=migrations)
    if spec.backend == "postgres":
        from stores.postgres import migrate_postgres

        assert spec.dsn is not None
        return await migrate_postgres(
            spec.dsn, schema=spec.schema, check_only=check_only, migrations=migrations
        )
    return MigrationReport(spec.display, spec.backend, 0, 0, 0)

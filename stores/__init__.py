"""``RunStore`` adapters, and how a store spec is parsed and opened.

The specs are listed in docs/stores.md; which one applies is the settings' concern
(:func:`server.settings.storage.store_inputs`), so this package reads no environment. Drivers are
imported only when their adapter is opened, and every URL shown goes through :func:`redact_url`,
so no warning or error carries a password.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from orchestration.errors import ConfigError, StoreUnavailable
from orchestration.store import RunStore
from stores._migrations import MigrationReport, SchemaOutOfDate, SchemaTooNew
from stores._sql import SCHEMA_NAME, Migration
from stores._urls import redact_url, scrub
from stores.faults import CrashAfterWrites

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_POOL_SIZE",
    "CrashAfterWrites",
    "MigrationReport",
    "OpenedStore",
    "SchemaOutOfDate",
    "SchemaTooNew",
    "StoreSpec",
    "migrate",
    "open_configured_store",
    "open_store",
    "parse_store_spec",
    "redact_url",
    "scrub",
]

log = logging.getLogger(__name__)

Backend = Literal["memory", "filesystem", "sqlite", "postgres"]

#: Seconds to wait for a database connection before the store counts as unreachable.
DEFAULT_CONNECT_TIMEOUT = 5.0
#: The postgres store's connections at most (``store_pool_size``; the listener is one more).
DEFAULT_POOL_SIZE = 10


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """A parsed store spec. ``display`` is safe to show; ``dsn`` may hold a password (kept out of
    ``repr``)."""

    backend: Backend
    display: str
    path: Path | None = None
    dsn: str | None = field(default=None, repr=False)
    schema: str = "public"


@dataclass(frozen=True, slots=True)
class OpenedStore:
    """The store the server will use; what was asked for (redacted) and where that came from
    (``--store``, ``config``, ``CONSTRUCT_ORCHESTRATION_STORE``, ``CONSTRUCT_DEPLOYMENT_MODE``,
    ``default``); whether the filesystem fallback replaced it; and the warnings to show in
    ``run_status`` and the logs."""

    store: RunStore
    requested: str
    source: str
    warnings: list[str] = field(default_factory=list)
    fell_back: bool = False
    #: the store did not exist before this open: an empty one was made (a directory or file that
    #: was not there, an empty Postgres schema initialized). ``construct-mcp`` says so, since a
    #: mistyped home or URL otherwise looks like a store with no runs.
    created: bool = False


def _backend_of(spec: str) -> str:
    scheme = spec.split("://", 1)[0].lower() if "://" in spec else spec.lower()
    return {"file": "filesystem", "postgresql": "postgres"}.get(scheme, scheme)


def parse_store_spec(
    spec: str, *, home: Path, database_url: str | None = None, source: str = "store"
) -> StoreSpec:
    """Parse a store spec (the forms: docs/stores.md). ``database_url`` is the database of the
    bare name ``postgres``. Raises ``ConfigError`` naming ``source`` for a spec that is not one;
    ``StoreUnavailable`` for ``postgres`` without a database URL."""
    text = spec.strip()
    lowered = text.lower()
    if lowered == "memory":
        return StoreSpec("memory", "memory")
    if lowered in ("filesystem", "file"):
        return StoreSpec("filesystem", f"file://{home}", path=home)
    if lowered == "sqlite":
        path = home / "construct.db"
        return StoreSpec("sqlite", f"sqlite:///{path}", path=path)
    if lowered in ("postgres", "postgresql"):
        url = (database_url or "").strip() or None
        if url is None:
            raise StoreUnavailable(
                "the postgres store needs a database URL: set CONSTRUCT_DATABASE_URL (or DATABASE_URL), "
                "or give a postgresql:// URL as the store"
            )
        return _postgres_spec(url, source)
    if "://" not in text:
        raise _bad_spec(source, text, "unknown store")
    scheme = lowered.split("://", 1)[0]
    if scheme in ("postgres", "postgresql"):
        return _postgres_spec(text, source)
    if scheme == "file":
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise _bad_spec(source, text, "a file:// URL cannot name a remote host")
        path = _resolve(home, unquote(parts.path))
        return StoreSpec("filesystem", f"file://{path}", path=path)
    if scheme == "sqlite":
        # Not urlsplit: sqlite:////abs keeps its leading slashes only if we cut by hand.
        rest = text.split("://", 1)[1]
        if not rest.startswith("/"):
            raise _bad_spec(source, text, "write sqlite:///relative.db or sqlite:////absolute/path.db")
        raw = unquote(rest[1:].split("?", 1)[0])
        if raw in ("", ":memory:"):
            raise _bad_spec(source, text, "name a database file (for a throwaway store use memory)")
        path = _resolve(home, raw)
        return StoreSpec("sqlite", f"sqlite:///{path}", path=path)
    raise _bad_spec(source, text, f"unknown URL scheme {scheme!r}")


def _resolve(home: Path, raw: str) -> Path:
    path = Path(raw).expanduser()
    return path if path.is_absolute() else home / path


def _postgres_spec(url: str, source: str) -> StoreSpec:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _bad_spec(source, url, f"not a URL ({exc})") from exc
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    schema = "public"
    kept: list[tuple[str, str]] = []
    for key, value in pairs:
        if key == "schema":
            schema = value
        else:
            kept.append((key, value))
    if not SCHEMA_NAME.fullmatch(schema):
        raise _bad_spec(source, url, f"schema {schema[:70]!r} must be a lowercase SQL identifier")
    # asyncpg would pass an unknown query parameter on as a server setting: schema is ours.
    dsn = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(kept), parts.fragment))
    return StoreSpec("postgres", redact_url(url), dsn=dsn, schema=schema)


def _bad_spec(source: str, spec: str, problem: str) -> ConfigError:
    return ConfigError(
        source,
        "store",
        f"{redact_url(spec)!r}: {problem}; use memory, filesystem, sqlite, postgres, file:///dir, "
        "sqlite:///file.db or postgresql://user@host/db",
    )


async def open_store(
    spec: str,
    *,
    home: Path,
    database_url: str | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    pool_size: int = DEFAULT_POOL_SIZE,
) -> RunStore:
    """Open the store ``spec`` names , importing only its driver.

    Raises ``ConfigError`` (not a store spec), ``StoreUnavailable`` (driver missing, backend
    unreachable within ``connect_timeout`` seconds, schema behind: the message says what to do and
    never contains a password). ``pool_size``: the postgres store's connections at most."""
    parsed = parse_store_spec(spec, home=home, database_url=database_url)
    return await _open_parsed(parsed, connect_timeout, pool_size)


async def _open_new(
    spec: StoreSpec, connect_timeout: float, pool_size: int = DEFAULT_POOL_SIZE
) -> tuple[RunStore, bool]:
    """The store ``spec`` names, and whether it was created by this open (see
    :attr:`OpenedStore.created`)."""
    existed = spec.path is not None and (
        (spec.path / "runs").is_dir() if spec.backend == "filesystem" else spec.path.exists()
    )
    store = await _open_parsed(spec, connect_timeout, pool_size)
    if spec.backend == "postgres":
        from stores.postgres import PostgresStore  # imported by _open_parsed already

        return store, isinstance(store, PostgresStore) and store.created
    return store, spec.backend != "memory" and not existed


async def _open_parsed(
    spec: StoreSpec, connect_timeout: float, pool_size: int = DEFAULT_POOL_SIZE
) -> RunStore:
    if spec.backend == "memory":
        from stores.memory import MemoryStore

        return MemoryStore()
    if spec.backend == "filesystem":
        from stores.filesystem import FilesystemStore

        assert spec.path is not None
        return FilesystemStore(spec.path)
    if spec.backend == "sqlite":
        try:
            from stores.sqlite import SqliteStore
        except ImportError as exc:
            raise StoreUnavailable(f"the sqlite store needs the aiosqlite package ({exc})") from exc
        assert spec.path is not None
        return await SqliteStore.open(spec.path)
    try:
        from stores.postgres import PostgresStore
    except ImportError as exc:
        raise StoreUnavailable(f"the postgres store needs the asyncpg package ({exc})") from exc
    assert spec.dsn is not None
    return await PostgresStore.open(
        spec.dsn, schema=spec.schema, connect_timeout=connect_timeout, max_size=pool_size
    )


async def open_configured_store(
    *,
    home: Path,
    spec: str = "filesystem",
    source: str = "default",
    database_url: str | None = None,
    fallback: bool = True,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    pool_size: int = DEFAULT_POOL_SIZE,
) -> OpenedStore:
    """Open the store ``spec`` names; ``source`` says where the spec came from (``--store``,
    ``config``, a variable's name, ``default``) and ``database_url`` is the bare ``postgres``'s.

    When the chosen backend cannot be opened (``StoreUnavailable``: driver missing, unreachable,
    schema behind, postgres without a URL) and ``fallback`` is true, the filesystem store at
    ``home`` is opened instead and the returned ``warnings`` say why (the server shows them in
    ``run_status`` and logs them). With ``fallback=False`` that ``StoreUnavailable`` is raised,
    naming the store (redacted), where its spec came from and the cause. A spec that is not one
    (``ConfigError``) is raised either way: a typo is not an outage.
    """
    spec = spec.strip()
    shown = redact_url(spec)
    # The bare name "postgres" takes its URL (and password) from database_url: scrub that one.
    secret_source = spec
    try:
        parsed = parse_store_spec(spec, home=home, database_url=database_url, source=source)
        shown = parsed.display
        secret_source = parsed.dsn or spec
        store, created = await _open_new(parsed, connect_timeout, pool_size)
        return OpenedStore(store, shown, source, created=created)
    except StoreUnavailable as exc:
        cause = scrub(str(exc), secret_source)
        if not fallback or _backend_of(spec) == "filesystem":
            raise StoreUnavailable(f"cannot open the store {shown} (from {source}): {cause}") from exc
        warning = (
            f"store {shown} (from {source}) could not be opened: {cause}; using the filesystem store at "
            f"{home} instead, so runs started now are not in {shown}"
        )
        log.warning(warning, extra={"action": "store.fallback", "requested": shown, "source": source})
        fs, created = await _open_new(parse_store_spec("filesystem", home=home), connect_timeout)
        return OpenedStore(fs, shown, source, [warning], fell_back=True, created=created)


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

"""SQL for the sqlite and postgres adapters: named queries (``-- name: <query_name>`` blocks of
``queries.sql``) and numbered forward-only migrations, read from ``stores/sql/<dialect>/`` with
``importlib.resources``; and the small helpers both adapters share. SQL is never assembled from
fragments in Python.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Literal

from pydantic import ValidationError

from orchestration.core import Fact, RunHead
from orchestration.errors import CorruptRecord, InvalidArgument
from stores._common import decode_stored_fact, decode_stored_head, encode_cursor_key

Dialect = Literal["sqlite", "postgres"]

#: A PostgreSQL schema name the stores accept: a lowercase identifier short enough that the NOTIFY
#: channel ``construct_runs_<schema>`` stays within PostgreSQL's 63-byte limit.
SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")

_NAME_LINE = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One forward-only migration: ``version`` is the file's number, ``name`` its file name."""

    version: int
    name: str
    sql: str


def _sql_dir(dialect: Dialect) -> resources.abc.Traversable:
    return resources.files("stores").joinpath("sql", dialect)


def parse_queries(text: str) -> dict[str, str]:
    """Split a ``queries.sql`` text into ``{name: sql}``. A duplicated name is a packaging bug."""
    queries: dict[str, str] = {}
    matches = list(_NAME_LINE.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        name = match.group(1)
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        body = text[match.end() : end].strip()
        queries[name] = body
    return queries


@functools.cache
def queries(dialect: Dialect) -> dict[str, str]:
    """The named queries of ``dialect`` (cached: the files are part of the installed package)."""
    return parse_queries(_sql_dir(dialect).joinpath("queries.sql").read_text(encoding="utf-8"))


@functools.cache
def migrations(dialect: Dialect) -> tuple[Migration, ...]:
    """The packaged migrations of ``dialect`` in version order. Versions must be 1, 2, 3, ...:
    a gap would mean a file went missing from the package."""
    found: list[Migration] = []
    for entry in _sql_dir(dialect).joinpath("migrations").iterdir():
        match = _MIGRATION_FILE.fullmatch(entry.name)
        if match is None:
            continue
        found.append(Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise ValueError(f"{dialect} migrations are not numbered 1..n: {migration.name}")
    return tuple(found)


def head_version(dialect: Dialect) -> int:
    """The schema version the packaged migrations lead to."""
    found = migrations(dialect)
    return found[-1].version if found else 0


def split_sqlite_script(script: str) -> list[str]:
    """Split a SQLite script into statements, using SQLite's own notion of a complete statement (so
    a ``;`` inside a string, a comment or a trigger body does not split). The migrator runs the
    statements one by one inside its own transaction, because ``executescript`` would commit first."""
    statements: list[str] = []
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            statement = buffer.strip()
            if _has_code(statement):
                statements.append(statement)
            buffer = ""
    return statements


def _has_code(statement: str) -> bool:
    lines = [line for line in statement.splitlines() if not line.strip().startswith("--")]
    return "".join(lines).strip().strip(";").strip() != ""


# --------------------------------------------------------------------------------------------
# Row decoding shared by the SQL adapters


def decode_head(run_id: str, raw: str | bytes) -> RunHead:
    """A row's head (``RecordTooNew`` from a newer format, ``CorruptRecord`` if unreadable)."""
    return decode_stored_head(run_id, "head", raw, _first_error)


def decode_fact(run_id: str, seq: int, raw: str | bytes) -> Fact:
    """A row's fact (``RecordTooNew`` from a newer format, ``CorruptRecord`` if unreadable)."""
    fact = decode_stored_fact(run_id, f"fact {seq}", raw, _first_error)
    if fact.seq != seq:
        raise CorruptRecord(run_id, f"fact {seq}", f"it says it is fact {fact.seq}")
    return fact


def _first_error(exc: Exception) -> str:
    if not isinstance(exc, ValidationError):
        return f"{type(exc).__name__}: {exc}"
    errors = exc.errors()
    if not errors:
        return "invalid JSON"
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    return f"{where or 'record'}: {first.get('msg', 'invalid')}"


# --------------------------------------------------------------------------------------------
# List cursors for rows
#
# The cursor format is stores._common.encode_cursor_key's (one encoder for every adapter); the SQL adapters
# build it from a row's (created_at, run_id) so that a row that cannot be decoded still advances
# the page.


def cursor_for_key(created_key: str, run_id: str) -> str:
    return encode_cursor_key((created_key, run_id))


_SORTABLE_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
#: Sorts after every real ``created_at`` key, so "no cursor" is the same query as "after the end".
CURSOR_START_KEY = "9999-12-31T23:59:59.999999Z"


def parse_sortable_time(key: str, cursor: str) -> datetime:
    """The instant a cursor's ``created_at`` key stands for (postgres compares timestamps)."""
    try:
        return datetime.strptime(key, _SORTABLE_FORMAT).replace(tzinfo=UTC)
    except ValueError as exc:
        raise InvalidArgument(
            f"cursor {cursor[:60]!r} is not a cursor this server gave out; "
            "omit it to start from the newest run"
        ) from exc

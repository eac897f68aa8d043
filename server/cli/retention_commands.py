"""``runs export``, ``runs import`` and ``runs prune``: move runs between stores and delete ended
ones.

::

    construct-mcp runs export RUN_ID [--out FILE]
    construct-mcp runs import FILE [--move --from SOURCE] [--json]
    construct-mcp runs prune --older-than 30d [--status completed,failed,...] [--dry-run]
                             [--export-dir DIR] [--json]

``export`` writes the run (header, head, every fact: :mod:`orchestration.ops.export`) as JSON Lines to
``FILE`` (written whole, fsync'd and renamed into place) or to stdout. ``import`` reads such a file
(``-``: stdin), verifies its hashes and that its facts make its head, and stores the run in the
configured store (``--store``): the same run, same id, same facts. It refuses a run id the store
has, and a run that has not ended (as its facts say) unless it is moved: ``--move --from SOURCE``
first deletes the run from the store it was exported from behind a ``moved`` tombstone (only if it
did not change since the export), so that store never drives it again, then imports it
(:mod:`orchestration.ops.retention`). Moving a filesystem run to PostgreSQL::

    construct-mcp runs export RUN_ID --store filesystem --out run.jsonl
    construct-mcp runs import run.jsonl --store postgresql://... --move --from filesystem

``prune`` deletes the runs of the given ended statuses (default: every ended status) that ended more
than ``--older-than`` ago (``30d``, ``12h``, ``90m``, ``2w``, ``3600s``), each behind a ``pruned``
tombstone that keeps its idempotency key reserved; ``--export-dir`` writes each run's export there
first, ``--dry-run`` only lists them. Live runs are never touched.

These commands never fall back to another store: a store that cannot be opened is an error, so a
run is never imported into, or pruned from, a store other than the one named.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TextIO

import anyio

from orchestration.chains import Catalog
from orchestration.core import SystemClock
from orchestration.errors import ExportCorrupt, InvalidArgument
from orchestration.ops import (
    PRUNABLE,
    RunExport,
    export_lines,
    import_export,
    parse_statuses,
    prune,
    read_export,
    snapshot,
)
from orchestration.store import RunStore
from server.cli.subcommands import Subcommands
from server.cli.usage import UsageError
from server.settings.config import Settings
from server.settings.storage import store_inputs
from stores import open_configured_store, open_store, parse_store_spec

#: The ``runs`` actions this module serves.
RETENTION_COMMANDS = frozenset({"export", "import", "prune"})

AddOptions = Callable[[argparse.ArgumentParser], None]

_AGE = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_age(text: str) -> timedelta:
    """``30d`` as a ``timedelta`` (units s, m, h, d, w); ``InvalidArgument`` otherwise."""
    match = _AGE.fullmatch(text.strip())
    if match is None:
        raise InvalidArgument(f"{text[:40]!r} is not an age like 30d, 12h, 90m, 2w or 3600s")
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


def _flag_value(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse ``type`` that refuses what ``check`` refuses as a usage error (exit 2, the
    command's usage, the flag named), and keeps the text as given."""

    def checked(text: str) -> str:
        try:
            check(text)
        except InvalidArgument as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return checked


def add_retention_parsers(
    runs_sub: Subcommands,
    common: AddOptions,
    json_flag: AddOptions,
) -> None:
    """Add ``export``, ``import`` and ``prune`` to the ``runs`` sub-commands."""
    export = runs_sub.add_parser("export", help="write a run (head and every fact) as JSON Lines")
    export.add_argument("run_id")
    export.add_argument("--out", type=Path, help="file to write (default: stdout)")
    common(export)
    imported = runs_sub.add_parser("import", help="restore an exported run into this store")
    imported.add_argument("file", help="a runs export file, or - for stdin")
    imported.add_argument(
        "--move", action="store_true", help="move the run out of --from (needed for a run not ended)"
    )
    imported.add_argument("--from", dest="source", help="with --move: the store the run was exported from")
    common(imported)
    json_flag(imported)
    pruning = runs_sub.add_parser("prune", help="delete ended runs older than an age (live runs never)")
    pruning.add_argument(
        "--status",
        default=",".join(sorted(s.value for s in PRUNABLE)),
        type=_flag_value(parse_statuses),
        help="comma-separated ended statuses (default: all of them)",
    )
    pruning.add_argument(
        "--older-than",
        required=True,
        type=_flag_value(parse_age),
        help="ended more than this long ago: 30d, 12h, 2w",
    )
    pruning.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    pruning.add_argument("--export-dir", type=Path, help="write each run's export here before deleting it")
    common(pruning)
    json_flag(pruning)


def write_file(path: Path, lines: Sequence[str]) -> None:
    """Write ``lines`` to ``path`` whole or not at all: a temp file, fsync'd, renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.writelines(line + "\n" for line in lines)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _write(path: Path, lines: Sequence[str]) -> None:
    try:
        await anyio.to_thread.run_sync(write_file, path, lines)
    except OSError as exc:
        raise InvalidArgument(f"cannot write {path}: {exc.strerror or exc}") from exc


async def run_retention(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    """``runs export``, ``runs import`` or ``runs prune`` on the configured store; the exit status."""
    if args.runs_command == "import" and args.move != (args.source is not None):
        raise UsageError(
            error=InvalidArgument(
                "--move and --from go together: --move --from SOURCE names the store it leaves"
            )
        )
    opened = await open_configured_store(home=settings.home, fallback=False, **store_inputs(settings))
    try:
        if args.runs_command == "export":
            return await _export(opened.store, args, out)
        if args.runs_command == "import":
            return await _import(opened.store, opened.requested, args, settings, out)
        return await _prune(opened.store, args, out, _current_versions(settings))
    finally:
        with anyio.CancelScope(shield=True):
            await opened.store.close()


async def _export(store: RunStore, args: argparse.Namespace, out: TextIO) -> int:
    run = await snapshot(store, args.run_id)
    lines = export_lines(run, source=store.name, at=SystemClock().now())
    if args.out is None:
        out.writelines(line + "\n" for line in lines)
        return 0
    await _write(args.out, lines)
    out.write(f"exported run {run.run_id} ({run.head.status.value}, {len(run.facts)} facts) to {args.out}\n")
    return 0


async def _import(
    store: RunStore, target: str, args: argparse.Namespace, settings: Settings, out: TextIO
) -> int:
    where = "stdin" if args.file == "-" else args.file
    try:
        text = (
            sys.stdin.read() if args.file == "-" else await anyio.Path(args.file).read_text(encoding="utf-8")
        )
    except OSError as exc:
        raise InvalidArgument(f"cannot read {where}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # not UTF-8
        raise ExportCorrupt(f"{where}: not a runs export (not UTF-8 text); nothing was imported") from exc
    run = read_export(text.splitlines(), where)
    source: RunStore | None = None
    if args.move:
        source = await open_store(args.source, home=settings.home, database_url=settings.database_url)
    try:
        stored = await import_export(
            store, run, now=SystemClock().now(), move_from=source, target_name=target, where=where
        )
    finally:
        if source is not None:
            with anyio.CancelScope(shield=True):
                await source.close()
    moved_from = (
        parse_store_spec(args.source, home=settings.home, database_url=settings.database_url).display
        if args.move
        else None
    )
    if args.json:
        answer = {
            "run_id": stored.run_id,
            "status": stored.head.status.value,
            "facts": len(stored.facts),
            "store": target,
            "moved_from": moved_from,
        }
        out.write(json.dumps(answer, indent=2) + "\n")
    else:
        moved = f", moved out of {moved_from}" if moved_from else ""
        out.write(
            f"imported run {stored.run_id} ({stored.head.status.value}, {len(stored.facts)} facts) "
            f"into {target}{moved}\n"
        )
    return 0


def _current_versions(settings: Settings) -> list[str]:
    """The hashes of the configuration's chains as they are now (a prune keeps their versions)."""
    catalog = Catalog.load(settings.config_file)
    return [catalog.resolve(name).content_hash() for name in sorted(catalog.chains)]


async def _prune(store: RunStore, args: argparse.Namespace, out: TextIO, current: Sequence[str]) -> int:
    statuses = parse_statuses(args.status)
    age = parse_age(args.older_than)
    export_dir: Path | None = args.export_dir
    if export_dir is not None and not args.dry_run:
        try:
            await anyio.Path(export_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidArgument(f"cannot create --export-dir {export_dir}: {exc.strerror or exc}") from exc

    async def archive(run: RunExport) -> str:
        assert export_dir is not None
        path = export_dir / f"{run.run_id}.jsonl"
        lines = export_lines(run, source=store.name, at=SystemClock().now())
        await _write(path, lines)
        return str(path.resolve())

    result = await prune(
        store,
        statuses,
        age,
        now=SystemClock().now(),
        dry_run=args.dry_run,
        archive=archive if export_dir is not None else None,
        current=current,
    )
    if args.json:
        answer = {
            "dry_run": result.dry_run,
            "pruned": list(result.pruned),
            "archives": result.archives,
            "skipped": result.skipped,
            "versions_removed": result.versions_removed,
        }
        out.write(json.dumps(answer, indent=2) + "\n")
        return 0
    verb = "would prune" if result.dry_run else "pruned"
    for run_id in result.pruned:
        archived = f" (export: {result.archives[run_id]})" if run_id in result.archives else ""
        out.write(f"{verb} {run_id}{archived}\n")
    for run_id, why in result.skipped.items():
        out.write(f"left {run_id}: {why}\n")
    out.write(f"{verb} {len(result.pruned)} run(s) that ended more than {args.older_than} ago\n")
    if result.versions_removed:
        out.write(f"removed {result.versions_removed} chain version(s) that no run holds\n")
    return 0

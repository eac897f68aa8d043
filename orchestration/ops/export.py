"""The run export format: a run's head and every fact as JSON Lines behind a hashed header
(``runs export``), and how an export is read back and verified (``runs import``).

The hashes detect accidents, not authors, so an import stores what the facts say, not what the
head claims (:func:`derive`): the facts are folded by the engine's own fold and must give the head
in the file; a file that fails any check is refused before anything is written. An export is one
consistent snapshot: the facts up to the ``last_seq`` of the head read first. The format and its
checks, as operators see them: docs/operations.md (Export, import and retention).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from orchestration.core.facts import (
    FACT_TYPES,
    Fact,
    RunCreated,
    TaskCompleted,
    dump_fact,
    parse_fact,
    parse_head,
)
from orchestration.core.fold import fold
from orchestration.core.ids import validate_run_id
from orchestration.core.models import RECORD_FORMAT, RunHead, evolve, text_hash
from orchestration.engine.reading import read_log
from orchestration.errors import ExportCorrupt, IllegalTransition, InvalidArgument, RecordTooNew
from orchestration.store import RunStore

EXPORT_FORMAT = "construct-mcp.run-export"
EXPORT_VERSION = 1
_R = TypeVar("_R", RunHead, Fact)


@dataclass(frozen=True, slots=True)
class RunExport:
    """A run as exported: its head and its complete log (seq 1 .. ``head.last_seq``)."""

    head: RunHead
    facts: tuple[Fact, ...]

    @property
    def run_id(self) -> str:
        return self.head.run_id


async def snapshot(store: RunStore, run_id: str) -> RunExport:
    """The run as one consistent snapshot: its head and the facts up to the head's ``last_seq``
    (facts are never rewritten, so those are the head's whatever is appended meanwhile). Raises
    what ``load`` raises (``RunNotFound``, ``RunPruned``...), also when the run is deleted between
    the two reads: never part of a run (:func:`~orchestration.engine.reading.read_log`)."""
    return RunExport(*await read_log(store, run_id))


def _sha256(lines: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode())
        digest.update(b"\n")
    return digest.hexdigest()


def export_lines(run: RunExport, *, source: str, at: datetime) -> list[str]:
    """The export of ``run`` as lines (without newlines): the header, the head, the facts."""
    head_line = run.head.model_dump_json()
    fact_lines = [dump_fact(fact) for fact in run.facts]
    header: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "run_id": run.head.run_id,
        "status": run.head.status.value,
        "head_version": run.head.version,
        "last_seq": run.head.last_seq,
        "record_format": run.head.format,
        "chain_hash": run.head.chain_hash,
        "request_hash": run.head.request_hash,
        "exported_at": at.isoformat(),
        "source": source,
        "head_sha256": _sha256([head_line]),
        "facts_sha256": _sha256(fact_lines),
    }
    return [json.dumps(header, separators=(",", ":")), head_line, *fact_lines]


def _corrupt(where: str, problem: str) -> ExportCorrupt:
    return ExportCorrupt(f"{where}: {problem}; nothing was imported (export the run again)")


def read_export(lines: Sequence[str], where: str = "the export") -> RunExport:
    """Read and verify an export's lines (newlines stripped or not). Raises ``ExportCorrupt`` for
    a file that is not an export, or whose hashes, count or numbering do not match its lines;
    ``RecordTooNew`` for records of a format newer than this code reads."""
    rows = [line.rstrip("\r\n") for line in lines]
    while rows and not rows[-1]:
        rows.pop()
    if len(rows) < 3:
        raise _corrupt(where, "a run export has a header, a head and at least one fact")
    try:
        header = json.loads(rows[0])
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != EXPORT_FORMAT:
        raise _corrupt(where, f"the first line is not a {EXPORT_FORMAT} header")
    version = header.get("version")
    if not isinstance(version, int) or version > EXPORT_VERSION:
        raise _corrupt(where, f"export version {version!r} is newer than this construct-mcp reads")
    run_id = str(header.get("run_id"))
    head_line, fact_lines = rows[1], rows[2:]
    if _sha256([head_line]) != header.get("head_sha256"):
        raise _corrupt(where, f"run {run_id}: the head does not match the header's head_sha256")
    if _sha256(fact_lines) != header.get("facts_sha256"):
        raise _corrupt(
            where, f"run {run_id}: the {len(fact_lines)} facts do not match the header's facts_sha256"
        )
    head = _record(run_id, "head", head_line, parse_head)
    facts = tuple(_record(run_id, f"line {n + 3}", line, parse_fact) for n, line in enumerate(fact_lines))
    if head.run_id != run_id or head.last_seq != len(facts) or head.version != header.get("head_version"):
        raise _corrupt(where, f"run {run_id}: the head does not match the header (id, last_seq, version)")
    for n, fact in enumerate(facts, start=1):
        if fact.seq != n:
            raise _corrupt(where, f"run {run_id}: fact {n} says it is fact {fact.seq}")
    return RunExport(head, facts)


def _record(run_id: str, where: str, line: str, parse: Callable[[str], _R]) -> _R:
    """One record read back by the rules of stored records: ``RecordTooNew`` for a newer format or
    an unknown fact type, ``ExportCorrupt`` for a line that is not a record."""
    try:
        record = parse(line)
    except ValueError as exc:
        raise _too_new(run_id, where, line) or _corrupt(
            where, f"run {run_id}: not a readable record"
        ) from exc
    if record.format > RECORD_FORMAT:
        raise RecordTooNew(run_id, where, record.format, RECORD_FORMAT)
    return record


def _too_new(run_id: str, where: str, line: str) -> RecordTooNew | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    stated = record.get("format", 1)
    if isinstance(stated, int) and stated > RECORD_FORMAT:
        return RecordTooNew(run_id, where, stated, RECORD_FORMAT)
    kind = record.get("type")
    if where != "head" and isinstance(kind, str) and kind not in FACT_TYPES:
        return RecordTooNew(run_id, where, stated if isinstance(stated, int) else 1, RECORD_FORMAT, kind)
    return None


def derive(run: RunExport, where: str = "the export") -> RunExport:
    """``run`` as its facts make it: their fold (the engine's), at the head's ``version`` (writes,
    which facts do not count: between 1 and ``last_seq``). Raises ``ExportCorrupt`` when the run id
    is not one a store takes, when the facts do not fold into a run (the first is not the run's
    ``run_created`` at seq 1, one does not follow the last, one comes after the run ended...), when
    a task's output is not the one its ``output_sha256`` names, or when the fold is not the head
    ``run`` states: the message names the first field that differs.

    A field the stated head leaves empty (null, false) where the fold has a value is not a
    difference: a head last written by a server older than the field holds that, and the head
    returned is the fold's in any case."""
    head = run.head
    try:
        validate_run_id(head.run_id)
    except InvalidArgument as exc:
        raise _corrupt(where, exc.message) from None
    first = run.facts[0] if run.facts else None
    if not isinstance(first, RunCreated) or first.seq != 1 or first.run_id != head.run_id:
        raise _corrupt(where, f"run {head.run_id}: its log does not start with its run_created fact, seq 1")
    for fact in run.facts:
        if isinstance(fact, TaskCompleted) and text_hash(fact.output) != fact.output_sha256:
            raise _corrupt(
                where, f"run {head.run_id}: fact {fact.seq}'s output does not match its output_sha256"
            )
    try:
        folded = fold(run.facts)
    except (IllegalTransition, ValueError) as exc:
        why = str(exc) if len(str(exc)) <= 200 else f"{str(exc)[:197]}..."
        raise _corrupt(where, f"run {head.run_id}: its facts do not make a run ({why})") from None
    if not 1 <= head.version <= folded.last_seq:
        writes = f"a run of {folded.last_seq} facts was written 1 to {folded.last_seq} times"
        raise _corrupt(where, f"run {head.run_id}: head version {head.version} is impossible: {writes}")
    stated = head.model_dump(mode="json", exclude={"version"})
    made = folded.model_dump(mode="json", exclude={"version"})
    differs = None if stated == made else _difference(stated, made, "")
    if differs is not None:
        raise _corrupt(where, f"run {head.run_id}: the head does not match its facts: {differs}")
    return RunExport(evolve(folded, {"version": head.version}), run.facts)


def _difference(stated: object, made: object, path: str) -> str | None:
    """Where the stated head's JSON and the fold's first differ (a dotted path), and how; None
    when they agree (a value ``stated`` leaves empty agrees: see :func:`derive`)."""
    if stated == made or stated is None or stated is False:
        return None
    if isinstance(stated, dict) and isinstance(made, dict):
        for key in [*made, *(k for k in stated if k not in made)]:
            found = _difference(stated.get(key), made.get(key), f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
        return None
    if isinstance(stated, list) and isinstance(made, list) and len(stated) == len(made):
        for index, (one, other) in enumerate(zip(stated, made, strict=True)):
            found = _difference(one, other, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    return f"{path or 'the head'} is {_shown(stated)} in the head, {_shown(made)} by its facts"


def _shown(value: object) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= 60 else f"{text[:57]}..."

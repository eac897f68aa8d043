"""The filesystem store's fact index (``facts.idx``: the byte offsets of each fact's line), derived
from the log and rebuilt from it. It is not fsync'd per append: a killed process loses none of it,
and after an OS crash every use checks the records it reads and rebuilds them from the log when
they do not hold, so no fact ever comes from an unchecked record. Blocking: called from a worker
thread.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from orchestration.errors import CorruptRecord
from stores._fs_files import INDEX_RECORD, write_all

logger = logging.getLogger("construct.stores")

FACTS_FILE = "facts.jsonl"
INDEX_FILE = "facts.idx"

Record = tuple[int, int]

_SEQ_AT_START = re.compile(rb'\{"seq":(\d+)[,}]')


def line_seq(line: bytes) -> int | None:
    """The ``seq`` of a fact line (its leading key as this store writes it, else decoded), or None."""
    match = _SEQ_AT_START.match(line)
    if match is not None:
        return int(match[1])
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    seq = record.get("seq") if isinstance(record, dict) else None
    return seq if type(seq) is int else None


def chained(records: list[Record], start: int) -> bool:
    """Whether ``records`` follow one another from byte ``start``, each a non-empty line."""
    for s, e in records:
        if s != start or e <= s:
            return False
        start = e
    return True


def unpack(raw: bytes) -> list[Record]:
    whole = len(raw) - len(raw) % INDEX_RECORD.size
    return [(int(s), int(e)) for s, e in INDEX_RECORD.iter_unpack(raw[:whole])]


def committed_end(facts_fd: int, index_fd: int, last_seq: int) -> int | None:
    """The byte where committed fact ``last_seq`` ends in the log, from its index record, or None
    when that record (read with the one before it) does not check out: missing, not continuing its
    predecessor, or not the end of fact ``last_seq``'s line."""
    first = max(last_seq - 1, 1)
    raw = os.pread(index_fd, (last_seq - first + 1) * INDEX_RECORD.size, (first - 1) * INDEX_RECORD.size)
    records = unpack(raw)
    if len(records) != last_seq - first + 1:
        return None
    if not chained(records, records[0][0] if last_seq > 1 else 0):
        return None
    start, end = records[-1]
    if os.pread(facts_fd, 1, end - 1) != b"\n":
        return None
    line = os.pread(facts_fd, min(end - start, 40), start)
    if _SEQ_AT_START.match(line) is None:  # not as this store writes it (planted): read it all
        line = os.pread(facts_fd, end - start, start)
    return end if line_seq(line) == last_seq else None


def rebuild(run_id: str, run_dir: Path, last_seq: int) -> list[Record]:
    """The index records of facts ``1..last_seq``: the index's records as long as they chain, then
    the lines of the log that follow them. ``CorruptRecord`` if the log does not hold those facts."""
    with open(run_dir / INDEX_FILE, "rb") as index:
        stored = unpack(index.read(last_seq * INDEX_RECORD.size))
    records: list[Record] = []
    position = 0
    for s, e in stored:
        if s != position or e <= s:
            break
        records.append((s, e))
        position = e
    path = run_dir / FACTS_FILE
    with open(path, "rb") as log:
        log.seek(position)
        data = log.read()
    offset = 0
    while len(records) < last_seq:
        newline = data.find(b"\n", offset)
        seq = len(records) + 1
        if newline < 0 or line_seq(data[offset : newline + 1]) != seq:
            raise CorruptRecord(run_id, str(path), f"it has no line for committed fact {seq}")
        records.append((position + offset, position + newline + 1))
        offset = newline + 1
    return records


def repair(run_id: str, run_dir: Path, index_fd: int, last_seq: int) -> int:
    """Rewrite the index's records of facts ``1..last_seq`` from the log (under the run lock, the
    index open for appending), durably; the end of the committed log."""
    records = rebuild(run_id, run_dir, last_seq)
    logger.warning(
        "run %s: the fact index was behind the committed head (an OS crash or power loss); rebuilt "
        "from the fact log",
        run_id,
        extra={"action": "store.index_rebuilt", "run_id": run_id},
    )
    os.ftruncate(index_fd, 0)
    write_all(index_fd, b"".join(INDEX_RECORD.pack(s, e) for s, e in records))
    os.fsync(index_fd)
    return records[-1][1] if records else 0

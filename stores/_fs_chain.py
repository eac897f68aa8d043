"""The filesystem store's chain snapshot, written once in ``chain.json`` by the create, so an append
rewrites a head of a few KB instead of the whole snapshot. Whether a head holds its chain is read
from the head itself, never from the layout: runs written before ``chain.json`` keep theirs in
``head.json``, and a run directory's layout never changes, so no crash leaves a half-converted run.
Blocking: called from a worker thread.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from orchestration.core import RunHead
from orchestration.errors import CorruptRecord
from stores._common import encode_chain, encode_head

CHAIN_FILE = "chain.json"

#: The keys a stored head starts with, in RunHead's declared order, up to what follows the request:
#: ``"chain":`` (the head holds its chain) or ``"chain_hash":`` (it does not). The request is a JSON
#: string (the unrolled pattern below matches any, escapes included); no string can hold an
#: unescaped quote, so the match cannot end inside one.
_CHAIN_AT = re.compile(
    rb'\{"run_id":"[^"\\]*","version":\d+,"last_seq":\d+,"status":"[^"\\]*",'
    rb'"request":"[^"\\]*(?:\\.[^"\\]*)*","chain(_hash)?":'
)


def encode_stored_head(head: RunHead, *, chain_apart: bool) -> bytes:
    """``head.json``'s bytes: without the chain for a run that keeps it in ``chain.json``."""
    return encode_head(head, with_chain=not chain_apart).encode()


def encode_stored_chain(head: RunHead) -> bytes:
    """``chain.json``'s bytes (written once, by the create)."""
    return encode_chain(head.chain).encode()


def holds_chain(data: bytes) -> bool:
    """Whether a stored head holds its chain snapshot. A head in another key order (not written
    by this store) is decoded to find out; one that is not a JSON object is read as it is (it then
    fails as the damaged head it is)."""
    match = _CHAIN_AT.match(data)
    if match is not None:
        return match[1] is None
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return True
    return not isinstance(record, dict) or "chain" in record


def with_chain(run_id: str, head_path: Path, data: bytes) -> bytes:
    """The head as stored, with its chain snapshot: ``data`` itself when it holds it, else ``data``
    with ``chain.json`` (next to ``head_path``) put back as its last key. Raises
    ``FileNotFoundError`` when ``chain.json`` is missing and so is the run directory (deleted
    meanwhile), ``CorruptRecord`` when only ``chain.json`` is missing."""
    if holds_chain(data):
        return data
    chain_path = head_path.with_name(CHAIN_FILE)
    try:
        chain = chain_path.read_bytes()
    except FileNotFoundError:
        if not head_path.parent.is_dir():
            raise
        raise CorruptRecord(
            run_id, str(head_path), f"it holds no chain snapshot and {CHAIN_FILE} is missing"
        ) from None
    body = data.rstrip()
    if not body.endswith(b"}") or len(body) < 2:
        return data  # not an object: read as it is, and reported as damaged
    return b'%s,"chain":%s}' % (body[:-1], chain.strip())

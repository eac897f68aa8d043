"""What every adapter of ``KeepsChainVersions`` shares: a version's stored form (JSON, read back
leniently like heads), the next version of a name, and which versions a clean-up may remove."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from datetime import UTC, datetime

from orchestration.core import ChainSnapshot
from orchestration.errors import CorruptRecord
from orchestration.store import ChainSource, ChainVersion

__all__ = ["decode_version", "encode_version", "forgettable", "found_version", "next_version"]


def encode_version(version: ChainVersion) -> str:
    """A version as stored: one JSON object (its chain as :func:`~stores._common.encode_chain`
    writes a run's)."""
    return json.dumps(
        {
            "name": version.name,
            "ordinal": version.ordinal,
            "chain_hash": version.chain_hash,
            "first_seen": version.first_seen.astimezone(UTC).isoformat(),
            "source": version.source,
            "label": version.label,
            "chain": json.loads(version.chain.model_dump_json(exclude_defaults=True)),
        },
        separators=(",", ":"),
    )


def decode_version(where: str, data: str | bytes) -> ChainVersion:
    """A stored version read back (``CorruptRecord`` when it cannot be)."""
    try:
        raw = json.loads(data)
        source: ChainSource = "call" if raw["source"] == "call" else "config"
        return ChainVersion(
            name=str(raw["name"]),
            ordinal=int(raw["ordinal"]),
            chain_hash=str(raw["chain_hash"]),
            first_seen=datetime.fromisoformat(raw["first_seen"]),
            source=source,
            label=None if raw.get("label") is None else str(raw["label"]),
            chain=ChainSnapshot.model_validate(raw["chain"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecord("chain versions", where, f"it cannot be read back ({exc})") from None


def found_version(versions: Iterable[ChainVersion], chain_hash: str) -> ChainVersion | None:
    """The version of ``versions`` with that hash, if any."""
    return next((v for v in versions if v.chain_hash == chain_hash), None)


def next_version(
    chain: ChainSnapshot, source: ChainSource, label: str | None, now: datetime, after: int
) -> ChainVersion:
    """A new version of ``chain``, numbered after ordinal ``after`` (0: the name's first)."""
    return ChainVersion(
        name=chain.name,
        ordinal=after + 1,
        chain_hash=chain.content_hash(),
        first_seen=now,
        source=source,
        label=label,
        chain=chain,
    )


def forgettable(
    versions: Sequence[ChainVersion], referenced: Collection[str], keep: Collection[str]
) -> list[ChainVersion]:
    """The versions a clean-up removes: no run references their hash, it is not one to ``keep``,
    and each is not its name's newest (so an ordinal is never given twice)."""
    newest: dict[str, int] = {}
    for version in versions:
        newest[version.name] = max(newest.get(version.name, 0), version.ordinal)
    return [
        v
        for v in versions
        if v.chain_hash not in referenced and v.chain_hash not in keep and v.ordinal < newest[v.name]
    ]

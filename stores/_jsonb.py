"""Texts in PostgreSQL's JSONB, which cannot hold the character U+0000: the JSON the postgres
store writes carries it as U+E000 ``0`` and a U+E000 of the data as U+E000 twice, undone on every
read, so every text reads back exactly as written (see :mod:`stores.postgres`)."""

from __future__ import annotations

import re

_ESC = "\ue000"
#: In JSON text: an escaped backslash (kept, so that the ``\u0000`` after it is not taken for an
#: escape), the escape of U+0000, or the escape character itself.
_TO_JSONB = re.compile(r"\\\\|\\u0000|\ue000")
_FROM_JSONB = re.compile("\ue000(.)", re.DOTALL)


def _to_jsonb(match: re.Match[str]) -> str:
    token = match[0]
    if token == "\\u0000":
        return _ESC + "0"
    return _ESC + _ESC if token == _ESC else token


def to_jsonb_text(text: str) -> str:
    """JSON text that PostgreSQL's JSONB accepts: the escape of U+0000 (backslash, ``u0000``) becomes
    U+E000 ``0``, and U+E000 becomes U+E000 U+E000. Other text is returned as it is."""
    if "\\u0000" not in text and _ESC not in text:
        return text
    return _TO_JSONB.sub(_to_jsonb, text)


def from_jsonb_text(text: str) -> str:
    """The JSON text :func:`to_jsonb_text` was given, from what PostgreSQL hands back."""
    if _ESC not in text:
        return text
    return _FROM_JSONB.sub(lambda m: "\\u0000" if m[1] == "0" else m[1], text)

"""Keeping API keys out of messages: a :class:`Redactor` removes the exact keys it was given, then
anything shaped like a key or a bearer credential, then caps the length, so that a provider's error
text (which may echo a key) can be kept in a record.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[redacted]"

#: Long enough for a useful provider message, short enough for a log line and a stored record.
MAX_MESSAGE_CHARS = 500

# Shapes of credentials seen in provider messages: OpenAI / Anthropic / OpenRouter style keys
# (``sk-...``, ``sk-ant-...``, ``sk-or-v1-...``, masked with ``*``), bearer tokens, and an
# ``x-api-key: ...`` header echoed back.
_KEY_SHAPES = (
    re.compile(r"\bsk-[A-Za-z0-9_\-*]{4,}"),
    re.compile(
        r"(?i)\b(x-api-key|api[_-]?key|authorization)([\"']?\s*[:=]\s*[\"']?)(?:bearer\s+)?[^\s\"',;]+"
    ),
    re.compile(r"(?i)\bbearer\s+[^\s\"',;]+"),
)


def check_api_key(api_key: str, *, what: str = "api_key") -> None:
    """Reject a key that cannot be sent as a header value, without ever echoing it.

    A key with whitespace or control characters would make the HTTP layer raise an error whose
    message quotes the header value; refusing it here keeps the key out of every traceback.
    """
    if not isinstance(api_key, str) or not api_key:
        raise ValueError(f"{what} must be a non-empty string")
    if not all(33 <= ord(ch) <= 126 for ch in api_key):
        raise ValueError(
            f"{what} contains whitespace, control or non-ASCII characters "
            "(the value is not shown); check how it was copied"
        )


class Redactor:
    """Scrubs known secrets and key-shaped strings out of free text."""

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # Longest first, so that a key containing another secret is removed whole.
        self._secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))

    def __repr__(self) -> str:
        return f"Redactor(<{len(self._secrets)} secret(s)>)"

    def __call__(self, text: str, *, limit: int = MAX_MESSAGE_CHARS) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        text = _KEY_SHAPES[0].sub(REDACTED, text)
        # A header echoed whole first ("Authorization: Bearer x"), so its value goes in one piece.
        text = _KEY_SHAPES[1].sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
        text = _KEY_SHAPES[2].sub(f"Bearer {REDACTED}", text)
        text = " ".join(text.split())  # one line: newlines in a message would split a log record
        if len(text) > limit:
            # Truncate after scrubbing, so a cut can never leave a partial key behind.
            text = text[: limit - 1] + "…"
        return text

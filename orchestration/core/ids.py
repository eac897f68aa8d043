"""Run ids: generation and validation.

A run id is validated before it touches a path or a query (stores call :func:`validate_run_id`).
Generated ids look like ``run-0193a5f2c4d1-7f3a9b2c8e1d4f60``: a millisecond timestamp (so ids sort
by creation time) and 64 random bits. Stores accept any id matching :data:`RUN_ID_PATTERN`, which
admits no path separator, no ``..`` and nothing a shell or SQL would interpret.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable

from orchestration.errors import InvalidArgument

RUN_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{2,79}$")

IdGenerator = Callable[[], str]


def new_run_id() -> str:

    return f"run-{int(time.time() * 1000):012x}-{secrets.token_hex(8)}"


def validate_run_id(run_id: object) -> str:
    """Return ``run_id`` if it is a well-formed run id, else raise :class:`InvalidArgument`."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id):
        shown = repr(run_id)[:100]
        raise InvalidArgument(
            f"run_id {shown} is not a valid run id: ids are 3-80 characters of lowercase letters, "
            "digits, '-' and '_' (for example run-0193a5f2c4d1-7f3a9b2c8e1d4f60)"
        )
    return run_id

"""Recording what the reliability tests tried and what held, for ``bench/reliability_report.py``.

A test wraps each thing it tries (one kill, one race, one shutdown, ...) in :func:`trial`::

    with trial("kill_after_write", store="sqlite", position=4) as t:
        ...                      # the test's own actions and assertions
        t.note(provider_calls=3)

When ``CONSTRUCT_RELIABILITY_OUT`` names a directory, every trial writes one JSON file there: its
category, its parameters, what was noted, how long it took, and whether it *held* — the block ended
without an exception. A failed assertion is recorded as ``held: false`` with the first line of the
error, and then raised as usual, so the report counts failures too instead of only the survivors.
Without the variable nothing is written: the tests behave exactly as plain tests.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT_ENV = "CONSTRUCT_RELIABILITY_OUT"


@dataclass
class Trial:
    """One attempt at breaking a promise; :meth:`note` adds what the report should show."""

    category: str
    params: dict[str, Any]
    notes: dict[str, Any] = field(default_factory=dict)

    def note(self, **values: Any) -> None:
        self.notes.update(values)


def out_dir() -> Path | None:
    value = os.environ.get(OUT_ENV, "").strip()
    return Path(value) if value else None


@contextmanager
def trial(category: str, **params: Any) -> Iterator[Trial]:
    """Run the block as one recorded trial (see the module docstring)."""
    current = Trial(category, dict(params))
    started = time.monotonic()
    error: BaseException | None = None
    try:
        yield current
    except BaseException as exc:
        error = exc
        raise
    finally:
        # pytest.skip is not a failure: a skipped trial tried nothing and is not recorded.
        if not _is_skip(error):
            _write(current, time.monotonic() - started, error)


def _is_skip(error: BaseException | None) -> bool:
    return error is not None and type(error).__name__ == "Skipped"


def _write(current: Trial, seconds: float, error: BaseException | None) -> None:
    directory = out_dir()
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "category": current.category,
        "params": current.params,
        "notes": current.notes,
        "held": error is None,
        "error": None if error is None else _first_line(error),
        "seconds": round(seconds, 3),
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
    }
    name = f"{current.category}-{int(time.time() * 1000)}-{secrets.token_hex(4)}.json"
    # Written whole and renamed, so a reader never sees half a record.
    tmp = directory / f".{name}.tmp"
    tmp.write_text(json.dumps(record, default=str, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(directory / name)


def _first_line(error: BaseException) -> str:
    # A task group wraps what failed: the report needs the failure itself.
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def load_records(directory: Path) -> list[dict[str, Any]]:
    """Every record in ``directory``, by category, then in the order they were written."""
    records = []
    for path in sorted(directory.glob("*.json")):
        records.append(json.loads(path.read_text(encoding="utf-8")))
    return records

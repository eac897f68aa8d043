"""A run's record too long for one answer is handed out in parts, as a long prompt is
(:mod:`server.views.parts`).

``run_status`` with ``detail="full"`` (the whole record) or a ``task_id`` (the compact answer with
that task's whole output) answers with the record whole when its text fits in
``max_answer_chars``. When it does not, the answer is a :class:`RecordPart`: characters ``offset``
to ``end`` of that text (``chars`` long), its ``next_action`` first. While parts remain,
``next_action`` is ``read_more``: the ``run_status`` call for the next part, its arguments naming
the ``offset`` to read from and the ``version`` of the run the parts come from; the last part's
``next_action`` is the run's own (the call that continues the run, or ``none`` for a run that has
ended). Every part's ``text``, joined in order, is the record's answer text, byte for byte.

**One version.** A run's version is one committed state, and a record's text is a function of it
(but for what the view shows of other runs: its children). So the parts of one read come from one
version: the read's first part names it, and a part asked for at another version than the run's
now is refused with ``record_changed``, telling the caller to read again from offset 0 (folding
the run's log again up to an older version would cost what the whole log costs, on every part).
Within a process, the text of each record handed out in parts is kept (:class:`RecordTexts`), so
the parts of one version agree even while a child run moves on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field

from orchestration.core import RunStatus
from orchestration.errors import ConstructError, InvalidArgument
from server.views.compact import answer_data
from server.views.outline import Outlined
from server.views.parts import MIN_PART_CHARS, fit_prompts, fitting_end
from server.views.run_view import RunView

#: the tool whose answers hand out a record in parts
RECORD_TOOL = "run_status"

#: how many records' texts :class:`RecordTexts` keeps (the oldest goes first)
RECORDS_KEPT = 16


class RecordChanged(ConstructError):
    """A part of a record asked for at a version of the run that is not its version now."""

    code = "record_changed"

    def __init__(self, run_id: str, version: int, now: int, call: dict[str, Any]) -> None:
        super().__init__(
            f"run {run_id} moved on from version {version}, which the parts read so far come from, to "
            f"version {now}; read the record again from its start: call run_status with "
            f"{json.dumps(call)} (offset 0, no version)"
        )


class StatusAnswer(Outlined):
    """What ``run_status`` answers, as its ``outputSchema`` publishes it: a run view, or a part of
    its record (:class:`RecordPart`), which has no ``tasks``."""

    published = ("run_id", "status", "status_kind", "next_action", "tasks")
    bare = True

    next_action: dict[str, Any]
    run_id: str
    status: RunStatus
    status_kind: Literal["active", "paused", "terminal"]
    tasks: list[dict[str, Any]] = Field(default_factory=list)


class RecordPart(Outlined):
    """Characters ``offset`` to ``end`` of a record's answer text (``chars`` long, of the run at
    ``version``); ``next_action`` names the call for the next part, or, with the last one, the
    run's own next action."""

    published = (
        "next_action",
        "run_id",
        "status",
        "status_kind",
        "version",
        "offset",
        "end",
        "chars",
        "text",
    )
    bare = True

    next_action: dict[str, Any]
    run_id: str
    status: RunStatus
    status_kind: Literal["active", "paused", "terminal"]
    version: int
    offset: int
    end: int
    chars: int = Field(description="The record's answer text's length in characters.")
    text: str = Field(description="The record's answer text's characters offset to end.")


def is_record(view: RunView) -> bool:
    """Whether ``view`` carries whole outputs (``detail="full"``, or a task's whole output): its
    answer is handed out in parts when too long, never shrunk."""
    return view.detail == "full" or any(task.output is not None for task in view.tasks)


def record_call(run_id: str, detail: str, task_id: str | None) -> dict[str, Any]:
    """The arguments of the ``run_status`` call that reads a record (from its start)."""
    call: dict[str, Any] = {"run_id": run_id}
    if detail == "full":
        call["detail"] = "full"
    if task_id is not None:
        call["task_id"] = task_id
    return call


def check_record_arguments(detail: str, task_id: str | None, offset: int, version: int | None) -> None:
    """``offset`` and ``version`` read a record (``detail="full"`` or ``task_id``); an offset past 0
    needs the version its parts come from: ``invalid_argument`` otherwise."""
    if (offset > 0 or version is not None) and detail != "full" and task_id is None:
        raise InvalidArgument(
            "offset and version read a record in parts: pass them with detail 'full' or a task_id, as "
            "next_action read_more names them"
        )
    if offset > 0 and version is None:
        raise InvalidArgument(
            f"offset {offset} needs the version the parts come from: pass next_action's arguments as "
            "they are, or read from offset 0"
        )


class RecordTexts:
    """The answer texts (and their run's final action) of the records handed out in parts lately,
    by run, version, what was asked and whether the content was withheld; the oldest goes first
    beyond :data:`RECORDS_KEPT`."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, int, str, str | None, bool], tuple[str, dict[str, Any]]] = {}

    def get(self, key: tuple[str, int, str, str | None, bool]) -> tuple[str, dict[str, Any]] | None:
        return self._kept.get(key)

    def put(self, key: tuple[str, int, str, str | None, bool], text: str, action: dict[str, Any]) -> None:
        self._kept.pop(key, None)
        while len(self._kept) >= RECORDS_KEPT:
            del self._kept[next(iter(self._kept))]
        self._kept[key] = (text, action)


def record_answer(
    view: RunView,
    task_id: str | None,
    offset: int,
    version: int | None,
    bound: int,
    kept: RecordTexts,
    fit: Callable[[RunView], tuple[str, dict[str, Any]]] | None = None,
) -> RunView | RecordPart:
    """The answer to ``run_status`` reading ``view``'s record (``detail="full"`` or ``task_id``):
    ``view`` itself when its text fits in ``bound`` characters and no part is asked for, else the
    part from ``offset`` (see the module docstring). ``record_changed`` when ``version`` is not the
    run's version now; ``invalid_argument`` for an offset past the text's end, or past 0 in a
    record that comes whole. ``fit``: how the server makes the answer text of a view (default:
    :func:`~server.views.parts.fit_prompts` of its data), which the record's text is."""
    call = record_call(view.run_id, view.detail, task_id)
    if version is not None and version != view.version:
        raise RecordChanged(view.run_id, version, view.version, call)
    key = (view.run_id, view.version, view.detail, task_id, view.withheld)
    found = kept.get(key)
    if found is None:
        text, data = fit(view) if fit is not None else fit_prompts(answer_data(view), bound)
        if len(text) <= bound:
            if offset > 0:
                raise InvalidArgument(
                    f"offset {offset}: this record fits in one answer ({len(text)} characters), which "
                    "comes whole; read it from offset 0"
                )
            return view
        found = (text, data["next_action"])
        kept.put(key, *found)
    text, last = found
    if offset >= len(text):
        raise InvalidArgument(
            f"offset {offset} is past the record's end ({len(text)} characters); read from offset 0"
        )
    return record_part(view, call, text, last, offset, bound)


def read_more(call: dict[str, Any], version: int, offset: int, chars: int, first: bool) -> dict[str, Any]:
    """The action that reads a record's next part, from ``offset`` (of ``chars``); ``first``: it
    follows the first part (its instruction says how the parts go)."""
    return {
        "kind": "read_more",
        "tool": RECORD_TOOL,
        "arguments": call | {"offset": offset, "version": version},
        "instruction": (
            f"This answer ({chars:,} characters of JSON) is longer than one answer holds: text is its "
            "characters offset to end. Call tool with arguments for the next part; join every part's "
            "text in order for the whole. The last part's next_action is the run's own."
            if first
            else f"Call tool with arguments for the next part (characters from {offset:,} of {chars:,})."
        ),
    }


def record_part(
    view: RunView, call: dict[str, Any], text: str, last: dict[str, Any], offset: int, bound: int
) -> RecordPart:
    """The part of ``text`` from ``offset`` that fits in an answer of at most ``bound`` characters
    (but for a final action that leaves less than :data:`MIN_PART_CHARS` of room); ``last`` is the
    next action of the last part."""

    def answer(end: int, part: str) -> RecordPart:
        more = end < len(text)
        return RecordPart(
            next_action=read_more(call, view.version, end, len(text), offset == 0) if more else last,
            run_id=view.run_id,
            status=view.status,
            status_kind=view.status_kind,
            version=view.version,
            offset=offset,
            end=end,
            chars=len(text),
            text=part,
        )

    # The longer of the two answers this part can be, with no text yet; digits for the offsets.
    frame = max(len(answer(end, "").model_dump_json()) for end in (len(text) - 1, len(text)))
    room = max(MIN_PART_CHARS, bound - frame - 16)
    end = fitting_end(text, offset, room)
    return answer(end, text[offset:end])


__all__ = [
    "RECORD_TOOL",
    "RecordChanged",
    "RecordPart",
    "RecordTexts",
    "StatusAnswer",
    "check_record_arguments",
    "is_record",
    "read_more",
    "record_answer",
    "record_call",
    "record_part",
]

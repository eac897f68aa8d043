"""Pages that fit what hosts show: ``runs_list`` and ``run_events`` answers within
``max_answer_chars``.

A page holds whole items only. When the items asked for (``limit``) would make an answer longer
than the bound, the page holds as many as fit, and its cursor (``next_cursor``, ``next_after_seq``)
and its ``next_action`` (``read_more``: the call for the rest, first in the text) start where it
stops; no item is cut in half. An item is small by design (a run's summary names at most a few
waiting tasks; an event carries previews, not outputs), but for an ``output_delta`` event, whose
text can be longer than a small bound: that one keeps the newest characters of its text that fit,
the ones left out counted in its ``missed`` (as the characters a late reader no longer gets are),
and its summary points to the whole output, ``run://<run_id>/tasks/<task_id>/output``, once the
task's output is recorded. A recorded event too long on its own (a summary full of characters
JSON escapes) keeps its output's URI and length without its preview.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from orchestration.core import RunHead
from orchestration.store import RunPage
from server.views.events import Event, EventsPage
from server.views.listing import RunsPage, runs_page
from server.views.parts import fitting_end
from server.views.run_view import output_uri

#: how many times a runs page is read again to fit (runs started meanwhile may push it along)
RUNS_TRIES = 3

#: the least room an output_delta's text gets, else it carries none (all of it counted missed)
MIN_DELTA_CHARS = 200


def _more_runs(arguments: dict[str, Any], limit: int, cursor: str) -> dict[str, Any]:
    return {
        "kind": "read_more",
        "tool": "runs_list",
        "arguments": arguments | {"limit": limit, "cursor": cursor},
        "instruction": "More runs follow: call tool with arguments for the next page.",
    }


def _more_events(page: EventsPage, limit: int, output_after: int) -> dict[str, Any]:
    arguments: dict[str, Any] = {"run_id": page.run_id, "after_seq": page.next_after_seq, "limit": limit}
    if output_after:
        arguments["output_after"] = output_after
    return {
        "kind": "read_more",
        "tool": "run_events",
        "arguments": arguments,
        "instruction": "More events are recorded: call tool with arguments for the next page.",
    }


async def fitted_runs(
    read: Callable[[int], Awaitable[RunPage]],
    visible: Callable[[RunHead], bool],
    limit: int,
    bound: int,
    arguments: dict[str, Any],
) -> RunsPage:
    """The page of at most ``limit`` runs (``read(n)``: the store's page of ``n`` runs from the
    cursor asked for), of those ``visible`` to the caller, that fits in ``bound`` characters:
    when ``limit`` runs would not, the page is read again with as many as fit, so that its
    ``next_cursor`` starts right after them. ``next_action`` names the next page's call
    (``arguments``: the caller's filters) when one follows."""
    page = await read(limit)
    answer = _runs_answer(page, visible, limit, arguments)
    for _ in range(RUNS_TRIES):
        if len(answer.model_dump_json()) <= bound or len(page.runs) <= 1:
            break
        # The next page's call asks for limit runs again: it is fitted in turn.
        page = await read(_runs_that_fit(page, visible, bound, arguments))
        answer = _runs_answer(page, visible, limit, arguments)
    return answer


def _runs_answer(
    page: RunPage, visible: Callable[[RunHead], bool], limit: int, arguments: dict[str, Any]
) -> RunsPage:
    shown = runs_page([h for h in page.runs if visible(h)], page.next_cursor)
    if page.next_cursor is None:
        return shown
    return shown.model_copy(update={"next_action": _more_runs(arguments, limit, page.next_cursor)})


def _runs_that_fit(
    page: RunPage, visible: Callable[[RunHead], bool], bound: int, arguments: dict[str, Any]
) -> int:
    """How many of ``page``'s runs (visible or not: the store's count) an answer holds within
    ``bound`` characters, with its cursor and next call (at least one)."""
    cursor = page.next_cursor or ""
    empty = runs_page([], cursor).model_copy(update={"next_action": _more_runs(arguments, 500, cursor)})
    room = bound - len(empty.model_dump_json()) - 16
    fits = 0
    for index, head in enumerate(page.runs):
        if visible(head):
            room -= len(runs_page([head]).runs[0].model_dump_json()) + 1
            if room < 0:
                break
        fits = index + 1
    return max(1, fits)


def fitted_events(page: EventsPage, bound: int, limit: int, output_after: int) -> EventsPage:
    """``page`` (as :func:`~server.views.events.read_events` read it, from ``output_after``) within
    ``bound`` characters, with ``next_action`` when more events are recorded: its events from the
    first, as many as fit (the page then says ``more``, and ``next_after_seq`` is the last one
    shown); output written here (``output_delta`` events) only once every recorded event of the
    page is shown, each keeping the newest text that fits (see the module docstring)."""
    answer = _events_answer(page, page.events, limit, output_after)
    if len(answer.model_dump_json()) <= bound:
        return answer
    frame = _events_answer(page, [], limit, output_after).model_copy(
        update={"more": True, "next_after_seq": page.next_after_seq, "next_output_after": output_after}
    )
    room = bound - len(_with_more(frame, limit, output_after).model_dump_json()) - 16
    recorded = [e for e in page.events if e.type != "output_delta"]
    shown: list[Event] = []
    for event in recorded:
        small = _recorded_within(event, room)
        size = len(small.model_dump_json()) + 1
        if size > room and shown:
            # The rest of the recorded events are for the next page; no output written follows.
            cut = page.model_copy(
                update={
                    "events": shown,
                    "next_after_seq": shown[-1].seq,
                    "more": True,
                    "next_output_after": output_after,
                }
            )
            return _with_more(cut, limit, output_after)
        shown.append(small)
        room -= size
    for event in page.events[len(recorded) :]:
        delta = _delta_within(page.run_id, event, room)
        shown.append(delta)
        room -= len(delta.model_dump_json()) + 1
    return _events_answer(page, shown, limit, output_after)


def _events_answer(page: EventsPage, events: list[Event], limit: int, output_after: int) -> EventsPage:
    return _with_more(page.model_copy(update={"events": events}), limit, output_after)


def _with_more(page: EventsPage, limit: int, output_after: int) -> EventsPage:
    """``page`` with the call for the next one when more events are recorded."""
    if not page.more:
        return page
    return page.model_copy(
        update={"next_action": _more_events(page, limit, page.next_output_after or output_after)}
    )


def _recorded_within(event: Event, room: int) -> Event:
    """A recorded event within ``room`` characters where it can be: without its output's preview
    (its length, sha256 and URI stay), its summary cut short."""
    if len(event.model_dump_json()) <= room:
        return event
    output = None if event.output is None else event.output.model_copy(update={"preview": ""})
    summary = event.summary[: fitting_end(event.summary, 0, max(40, room // 4))]
    return event.model_copy(update={"output": output, "summary": summary})


def _delta_within(run_id: str, event: Event, room: int) -> Event:
    """An ``output_delta`` event within ``room`` characters: the newest characters of its text
    that fit, the others counted in ``missed``, its summary naming where the whole output is."""
    if len(event.model_dump_json()) <= room:
        return event
    text = event.text or ""
    uri = output_uri(run_id, event.task_id or "")
    bare = event.model_copy(
        update={
            "text": "",
            "summary": f"{event.summary}; the first characters of this text are left out to fit one answer "
            f"(missed), the whole output is at {uri} once it is recorded",
        }
    )
    space = room - len(bare.model_dump_json()) - 8
    if space < MIN_DELTA_CHARS:
        kept = 0
    else:
        # The newest characters: the longest end of the text whose JSON fits in space.
        reversed_text = text[::-1]
        kept = fitting_end(reversed_text, 0, space)
    left_out = len(text) - kept
    return bare.model_copy(
        update={
            "text": text[left_out:],
            "offset": (event.offset or 0) + left_out,
            "missed": (event.missed or 0) + left_out,
        }
    )


__all__ = ["fitted_events", "fitted_runs"]

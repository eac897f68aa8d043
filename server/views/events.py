"""A run's facts as a feed of small, typed events, readable from an offset (issue 14, live events).

Every fact a run records is one event: its ``seq`` (1, 2, 3, ... in the run's log), when it was
recorded (``at``), its ``type`` (the fact's: ``run_created``, ``host_task_prepared``,
``task_completed``, ``approval_requested``, ``run_finished``, ...), the ``task_id`` or ``gate_id`` it
concerns, and a one-line ``summary`` (the ``runs timeline`` wording, :func:`describe_fact`). An
event is small whatever the run holds: a recorded output appears as a preview — its first
:data:`EVENT_PREVIEW_CHARS` characters, its length, its sha256 and the URI of the whole output,
``run://<run_id>/tasks/<task_id>/output`` — and prompts appear only as their hash (in the summary).

:func:`read_events` answers one page: the events after ``after_seq`` (at most ``limit``), waiting up
to ``wait_seconds`` for one when there is none yet (a long poll: woken at once by this process's
writes, polling the store for other processes'). The page says where to continue
(``next_after_seq``), whether more events are already recorded (``more``) and whether the run has
ended (``terminal``): a follower is done when ``terminal`` is true and ``more`` false. Reading a page
costs what the page holds (the store's ``read_facts(run_id, after_seq, limit)``), not the run.

**Output as it is written** (issue 25). A page that reaches the last recorded event also carries,
after it, an ``output_delta`` event per task whose call is in flight in *this* process and wrote
since the reader's ``output_after``: the text (at most :data:`OUTPUT_EVENT_CHARS` characters),
where it starts in the attempt's output (``offset``) and how many characters written since the
reader's position are no longer held (``missed``; a reader that joins late misses what the
buffer dropped). These events come from memory only (:class:`orchestration.engine.OutputDeltas`):
they have no sequence number of their own (``seq`` is the recorded event they follow), are never
stored, are gone after a restart, and a server that does not run the call has none; ``after_seq``
and ``next_after_seq`` count recorded events only. Pass ``next_output_after`` back as
``output_after`` to read on; a long poll also wakes for new output.

Used by the ``run_events`` tool, the ``run://{run_id}/events`` resource (the newest page) and the
``runs tail`` command.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import anyio
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from orchestration.core import Fact, RunHead, RunStatus, TaskCompleted
from orchestration.engine import OutputPiece, Runtime
from orchestration.errors import InvalidArgument
from server.views.outline import Outlined, View
from server.views.run_view import output_uri
from server.views.timeline import describe_fact

#: An event shows this many characters of a recorded output.
EVENT_PREVIEW_CHARS = 200
#: An event's summary is cut to this many characters.
SUMMARY_CHARS = 300
#: The most events one page holds (the tool's ``limit`` bound).
MAX_EVENTS_LIMIT = 500
#: How many events the ``run://{run_id}/events`` resource shows: the newest ones.
RESOURCE_EVENTS = 50
#: An ``output_delta`` event carries at most this many characters (the newest).
OUTPUT_EVENT_CHARS = 4000


class OutputPreview(View):
    """A recorded output, previewed: its start, its length, its sha256 and where the whole is."""

    preview: str
    chars: int
    sha256: str
    uri: str


class Event(View):
    """One recorded fact, small. Fields that do not apply to the fact are left out (not null)."""

    seq: int
    at: datetime
    type: str
    task_id: str | None = None
    gate_id: str | None = None
    summary: str
    output: OutputPreview | None = None
    #: output_delta only (see the module docstring)
    attempt: int | None = None
    offset: int | None = None
    missed: int | None = None
    text: str | None = None

    @model_serializer(mode="wrap")
    def _without_nulls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if value is not None}


class EventsPage(Outlined):
    """A page of a run's event feed."""

    bare = True

    #: set by the run_events tool when more events are recorded (server.views.fitted_pages): the
    #: call that reads them
    next_action: dict[str, Any] = Field(default_factory=dict, exclude_if=lambda v: not v)
    run_id: str
    status: RunStatus
    terminal: bool = Field(description="The run has ended: no event follows the last one recorded.")
    events: list[Event] = Field(
        description="In order: seq, at, type, task_id/gate_id, summary, output preview."
    )
    next_after_seq: int = Field(description="Pass as after_seq to read on.")
    more: bool = Field(description="More events are recorded after next_after_seq.")
    next_output_after: int = 0


def event(run_id: str, fact: Fact) -> Event:
    """The event that ``fact`` (of run ``run_id``) is."""
    summary = describe_fact(fact)
    if len(summary) > SUMMARY_CHARS:
        summary = summary[: SUMMARY_CHARS - 1] + "…"
    preview: OutputPreview | None = None
    if isinstance(fact, TaskCompleted):
        preview = OutputPreview(
            preview=fact.output[:EVENT_PREVIEW_CHARS],
            chars=len(fact.output),
            sha256=fact.output_sha256,
            uri=output_uri(run_id, fact.task_id),
        )
    task_id = getattr(fact, "task_id", None)
    gate_id = getattr(fact, "gate_id", None)
    return Event(
        seq=fact.seq,
        at=fact.at,
        type=fact.type,
        task_id=task_id if isinstance(task_id, str) else None,
        gate_id=gate_id if isinstance(gate_id, str) else None,
        summary=summary,
        output=preview,
    )


def check_page(after_seq: int, limit: int) -> None:
    """Refuse a page the feed cannot give (``invalid_argument``)."""
    if after_seq < 0:
        raise InvalidArgument(f"after_seq must be 0 or more, not {after_seq}; 0 reads from the start")
    if not 1 <= limit <= MAX_EVENTS_LIMIT:
        raise InvalidArgument(f"limit must be between 1 and {MAX_EVENTS_LIMIT}, not {limit}")


async def read_events(
    runtime: Runtime,
    run_id: str,
    after_seq: int = 0,
    limit: int = 50,
    wait_seconds: float = 0.0,
    head: RunHead | None = None,
    output_after: int = 0,
) -> EventsPage:
    """The run's events after ``after_seq`` (at most ``limit``), then its output written after
    ``output_after`` (see the module docstring). With neither yet and the run not ended, waits up
    to ``wait_seconds`` for one. ``head``: the run as the caller already read it (saves a read
    when there is no need to wait).

    Raises ``RunNotFound``, and ``InvalidArgument`` for a negative ``after_seq``, a ``limit`` out of
    1..500, or an ``after_seq`` past the run's last event (a sequence number the run never gave)."""
    check_page(after_seq, limit)
    if head is None:
        head = await runtime.status(run_id)
    if after_seq > head.last_seq:  # refused before any wait: no event will ever have that seq
        raise InvalidArgument(
            f"after_seq {after_seq} is past the last event of run {head.run_id}, {head.last_seq}; "
            "pass a next_after_seq this feed gave, or 0 to read from the start"
        )
    idle = head.last_seq == after_seq and not runtime.deltas.after(head.run_id, output_after)
    if idle and wait_seconds > 0 and not head.status.is_terminal:
        head = await _wait(runtime, head, after_seq, output_after, wait_seconds)
    facts = await runtime.read_facts(head.run_id, after_seq, limit) if head.last_seq > after_seq else []
    if facts and facts[-1].seq > head.last_seq:
        head = await runtime.status(head.run_id)  # written since: the page says so
    return page_of(head, facts, after_seq, runtime, output_after)


async def _wait(
    runtime: Runtime, head: RunHead, after_seq: int, output_after: int, seconds: float
) -> RunHead:
    """Wait up to ``seconds`` for the run's next recorded event or its next output written here."""
    deltas, woken = runtime.deltas, head

    async def recorded() -> None:
        nonlocal woken
        woken = await runtime.wait_for_facts(head.run_id, after_seq, seconds)
        group.cancel_scope.cancel()

    async def written() -> None:
        while not deltas.after(head.run_id, output_after):
            await deltas.changed(head.run_id).wait()
        group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(recorded)
        group.start_soon(written)
    return woken


async def newest_events(runtime: Runtime, head: RunHead, limit: int = RESOURCE_EVENTS) -> EventsPage:
    """The run's newest ``limit`` events (what the ``run://{run_id}/events`` resource shows), then
    the output of its calls in flight here."""
    after_seq = max(0, head.last_seq - limit)
    facts = await runtime.read_facts(head.run_id, after_seq, limit)
    if facts and facts[-1].seq > head.last_seq:
        head = await runtime.status(head.run_id)
    return page_of(head, facts, after_seq, runtime)


def page_of(
    head: RunHead, facts: list[Fact], after_seq: int, runtime: Runtime | None = None, output_after: int = 0
) -> EventsPage:
    """The page of ``facts``; with ``runtime``, and when the page reaches the last recorded event,
    the output written after ``output_after`` follows (``output_delta`` events)."""
    next_after_seq = facts[-1].seq if facts else after_seq
    more = next_after_seq < head.last_seq
    events = [event(head.run_id, f) for f in facts]
    next_output_after = output_after
    if runtime is not None and not more:
        pieces = runtime.deltas.after(head.run_id, output_after, OUTPUT_EVENT_CHARS)
        at = runtime.clock.now()
        events += [output_event(next_after_seq, at, piece) for piece in pieces]
        next_output_after = max([output_after, runtime.deltas.position])
    return EventsPage(
        run_id=head.run_id,
        status=head.status,
        terminal=head.status.is_terminal,
        events=events,
        next_after_seq=next_after_seq,
        more=more,
        next_output_after=next_output_after,
    )


def output_event(seq: int, at: datetime, piece: OutputPiece) -> Event:
    """The ``output_delta`` event of ``piece``, after the recorded event ``seq``."""
    missed = f" ({piece.missed} characters before it are no longer held)" if piece.missed else ""
    return Event(
        seq=seq,
        at=at,
        type="output_delta",
        task_id=piece.task_id,
        summary=f"{piece.task_id} wrote {len(piece.text)} characters (attempt {piece.attempt}){missed}",
        attempt=piece.attempt,
        offset=piece.offset,
        missed=piece.missed,
        text=piece.text,
    )

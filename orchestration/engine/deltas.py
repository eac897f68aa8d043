"""Output as it is written (issue 25): a per-process, bounded buffer of the text of the calls in
flight, for the readers that show it growing (progress notifications, the ``output_delta`` events,
the page).

**Never a fact.** Nothing here is recorded or decided on: the task's output is recorded once, whole,
when its call ends (:mod:`orchestration.engine.drive`). A process that dies loses what it held; a
server that did not make the call (another one sharing the store) holds nothing of it, and its
readers see the stored events only.

**The seam.** :meth:`Runtime.drive <orchestration.engine.runtime.Runtime.drive>` runs each drive
inside :meth:`OutputDeltas.driving`, which puts a :class:`~orchestration.workers.port.DeltaSink`
for that run in :data:`~orchestration.workers.port.DELTA_SINK`; a worker whose call streams writes
there (the provider worker does). The tasks a drive starts inherit the context, fan-out included.

**Bounds.** Per task, the text of its latest attempt only, at most ``max_task_chars`` characters:
past that the oldest text is dropped, and :attr:`TaskText.start` says how many characters of the
attempt's output are no longer held (a reader that comes late learns how much it missed). At most
``max_tasks`` tasks are held per process; past that the oldest one whose call ended goes first,
then the oldest at all.

Text is measured in characters (``str`` indices) and a reader's cursor is ``(attempt, offset)``:
the text after ``offset`` of that attempt is ``text[offset - start:]`` (:meth:`TaskText.since`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import anyio

from orchestration.workers.port import DELTA_SINK

__all__ = ["OutputDeltas", "TaskText"]

#: characters held per task (the newest ones)
DEFAULT_TASK_CHARS = 16_000
#: tasks held per process
DEFAULT_TASKS = 256


@dataclass(frozen=True, slots=True)
class TaskText:
    """What is held of one task's latest attempt: the characters ``start`` .. :attr:`end` of its
    output (``text``), and whether its call ended (``ended``: no more text comes)."""

    run_id: str
    task_id: str
    attempt: int
    start: int
    text: str
    ended: bool

    @property
    def end(self) -> int:
        """How many characters the attempt has written."""
        return self.start + len(self.text)

    def since(self, attempt: int, offset: int) -> tuple[str, int]:
        """The text after a reader's cursor ``(attempt, offset)`` and how many characters of it
        are no longer held (missed). A cursor on another attempt reads this one from its start."""
        if attempt != self.attempt:
            offset = 0
        missed = max(0, self.start - offset)
        return self.text[max(0, offset - self.start) :], missed


class _Held:
    __slots__ = ("attempt", "ended", "start", "text")

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self.start = 0
        self.text = ""
        self.ended = False


class _RunSink:
    """The :class:`~orchestration.workers.port.DeltaSink` of one run."""

    __slots__ = ("_deltas", "_run_id")

    def __init__(self, deltas: OutputDeltas, run_id: str) -> None:
        self._deltas = deltas
        self._run_id = run_id

    def writer(self, task_id: str, attempt: int) -> Callable[[str], None]:
        self._deltas.begin(self._run_id, task_id, attempt)

        def write(text: str) -> None:
            self._deltas.write(self._run_id, task_id, attempt, text)

        return write

    def ended(self, task_id: str, attempt: int) -> None:
        self._deltas.end(self._run_id, task_id, attempt)


class OutputDeltas:
    """The buffer (see the module docstring). One per :class:`~orchestration.engine.runtime.Runtime`;
    used from its event loop only."""

    def __init__(self, *, max_task_chars: int = DEFAULT_TASK_CHARS, max_tasks: int = DEFAULT_TASKS) -> None:
        if max_task_chars < 1 or max_tasks < 1:
            raise ValueError("OutputDeltas bounds must be positive")
        self.max_task_chars = max_task_chars
        self.max_tasks = max_tasks
        self._held: OrderedDict[tuple[str, str], _Held] = OrderedDict()
        self._changed: dict[str, anyio.Event] = {}

    @contextmanager
    def driving(self, run_id: str) -> Iterator[None]:
        """Within: the output the run's calls write comes here (:data:`DELTA_SINK`)."""
        token = DELTA_SINK.set(_RunSink(self, run_id))
        try:
            yield
        finally:
            DELTA_SINK.reset(token)

    def begin(self, run_id: str, task_id: str, attempt: int) -> None:
        """A call of the task starts: its earlier attempt's text is dropped."""
        key = (run_id, task_id)
        self._held.pop(key, None)
        self._held[key] = _Held(attempt)
        self._evict()
        self._notify(run_id)

    def write(self, run_id: str, task_id: str, attempt: int, text: str) -> None:
        """``text`` follows what the attempt wrote so far (ignored for any other attempt)."""
        held = self._held.get((run_id, task_id))
        if held is None or held.attempt != attempt or held.ended or not text:
            return
        held.text += text
        over = len(held.text) - self.max_task_chars
        if over > 0:
            held.text = held.text[over:]
            held.start += over
        self._notify(run_id)

    def end(self, run_id: str, task_id: str, attempt: int) -> None:
        held = self._held.get((run_id, task_id))
        if held is not None and held.attempt == attempt and not held.ended:
            held.ended = True
            self._notify(run_id)

    def held(self, run_id: str) -> list[TaskText]:
        """What is held of the run's tasks, oldest call first."""
        return [
            TaskText(r, task_id, h.attempt, h.start, h.text, h.ended)
            for (r, task_id), h in self._held.items()
            if r == run_id
        ]

    def changed(self, run_id: str) -> anyio.Event:
        """An event set at the run's next change here (a call begins, writes or ends)."""
        event = self._changed.get(run_id)
        if event is None:
            event = self._changed[run_id] = anyio.Event()
        return event

    def _notify(self, run_id: str) -> None:
        event = self._changed.pop(run_id, None)
        if event is not None:
            event.set()

    def _evict(self) -> None:
        while len(self._held) > self.max_tasks:
            key = next((k for k, h in self._held.items() if h.ended), None)
            if key is None:
                key = next(iter(self._held))
            del self._held[key]

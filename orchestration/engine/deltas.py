"""Output as it is written: a per-process, bounded buffer of the text of the calls in flight, for the
readers that show it growing (progress notifications, ``output_delta`` events, the page; what they
show: docs/operations.md, Streamed output).

Never a fact: nothing here is recorded or decided on (the output is recorded once, whole, when its
call ends); a process that dies loses what it held, and another server sharing the store holds none.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from orchestration.workers.port import DeltaSink

__all__ = ["OutputDeltas", "OutputPiece", "TaskText"]

#: characters held per task (the newest ones)
DEFAULT_TASK_CHARS = 16_000
#: tasks held per process
DEFAULT_TASKS = 256
#: per task, how many dropped chunks are remembered (to tell a reader how much it missed)
_DROPPED_MARKS = 1024


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


@dataclass(frozen=True, slots=True)
class OutputPiece:
    """The text a task's call in flight wrote after a reader's position (:meth:`OutputDeltas.after`):
    it starts at character ``offset`` of the attempt's output; ``missed`` characters written after
    the reader's position came before it and are no longer held; ``position`` is the newest
    position of the text (pass the largest as the next reader position)."""

    task_id: str
    attempt: int
    offset: int
    text: str
    missed: int
    position: int


class _Chunk:
    __slots__ = ("offset", "position", "text")

    def __init__(self, position: int, offset: int, text: str) -> None:
        self.position = position
        self.offset = offset
        self.text = text

    @property
    def end(self) -> int:
        return self.offset + len(self.text)


class _Held:
    __slots__ = ("attempt", "chars", "chunks", "dropped", "ended", "written")

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self.chunks: deque[_Chunk] = deque()
        #: (position, end offset) of chunks no longer held, newest last
        self.dropped: deque[tuple[int, int]] = deque(maxlen=_DROPPED_MARKS)
        self.chars = 0
        self.written = 0
        self.ended = False

    def trim(self, cap: int) -> None:
        while self.chars > cap:
            first = self.chunks[0]
            over = self.chars - cap
            if over >= len(first.text):
                self.chunks.popleft()
                self.dropped.append((first.position, first.end))
                self.chars -= len(first.text)
            else:
                first.text = first.text[over:]
                first.offset += over
                self.chars -= over

    def seen_up_to(self, position: int) -> int:
        """Where a reader at ``position`` stopped reading this attempt's output (0: nothing)."""
        for chunk in reversed(self.chunks):
            if chunk.position <= position:
                return chunk.end
        for mark, end in reversed(self.dropped):
            if mark <= position:
                return end
        return 0


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
    """The buffer. Per task, the text of its latest attempt only, at most ``max_task_chars``
    characters: past that the oldest text is dropped, and :attr:`TaskText.start` tells a late
    reader how much it missed. At most ``max_tasks`` tasks: past that the one whose call ended
    first goes first, then the oldest at all. One per :class:`~orchestration.engine.runtime.Runtime`;
    used from its event loop only."""

    def __init__(
        self,
        *,
        max_task_chars: int = DEFAULT_TASK_CHARS,
        max_tasks: int = DEFAULT_TASKS,
        now_us: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        if max_task_chars < 1 or max_tasks < 1:
            raise ValueError("OutputDeltas bounds must be positive")
        self.max_task_chars = max_task_chars
        self.max_tasks = max_tasks
        self._now_us = now_us
        self._position = 0
        self._held: OrderedDict[tuple[str, str], _Held] = OrderedDict()
        # Beside it, so that a call's begin costs the same with 1 or 1,000 calls in flight (it was
        # a scan of every held task): the held tasks whose call ended, in the order they ended,
        # and the held tasks of each run, in the order their calls began.
        self._ended: dict[tuple[str, str], None] = {}
        self._by_run: dict[str, dict[str, None]] = {}
        self._changed: dict[str, anyio.Event] = {}

    @property
    def position(self) -> int:
        """The newest position given. Each piece written gets one, larger than any given before in
        this process and, being at least the wall clock's microseconds, than any given by a process
        that ran before it on this machine (an opaque, growing number; :meth:`after` reads on from
        one)."""
        return self._position

    def sink(self, run_id: str) -> DeltaSink:
        """Where the run's calls hand their output as it is written, to come here (a drive gives
        it to the worker with each call)."""
        return _RunSink(self, run_id)

    def begin(self, run_id: str, task_id: str, attempt: int) -> None:
        """A call of the task starts: its earlier attempt's text is dropped."""
        key = (run_id, task_id)
        self._drop(key)
        self._held[key] = _Held(attempt)
        self._by_run.setdefault(run_id, {})[task_id] = None
        self._evict()
        self._notify(run_id)

    def write(self, run_id: str, task_id: str, attempt: int, text: str) -> None:
        """``text`` follows what the attempt wrote so far (ignored for any other attempt)."""
        held = self._held.get((run_id, task_id))
        if held is None or held.attempt != attempt or held.ended or not text:
            return
        self._position = max(self._position + 1, self._now_us())
        held.chunks.append(_Chunk(self._position, held.written, text))
        held.written += len(text)
        held.chars += len(text)
        held.trim(self.max_task_chars)
        self._notify(run_id)

    def end(self, run_id: str, task_id: str, attempt: int) -> None:
        held = self._held.get((run_id, task_id))
        if held is not None and held.attempt == attempt and not held.ended:
            held.ended = True
            self._ended[(run_id, task_id)] = None
            self._notify(run_id)

    def held(self, run_id: str) -> list[TaskText]:
        """What is held of the run's tasks, oldest call first."""
        return [
            TaskText(
                run_id,
                task_id,
                h.attempt,
                h.chunks[0].offset if h.chunks else h.written,
                "".join(c.text for c in h.chunks),
                h.ended,
            )
            for task_id, h in self._of(run_id)
        ]

    def after(self, run_id: str, position: int, limit_chars: int | None = None) -> list[OutputPiece]:
        """For each of the run's calls in flight that wrote after ``position``: that text (its
        newest ``limit_chars`` characters when given, the rest counted as missed)."""
        pieces: list[OutputPiece] = []
        for task_id, held in self._of(run_id):
            if held.ended:
                continue
            new = [c for c in held.chunks if c.position > position]
            if not new:
                continue
            text = "".join(c.text for c in new)
            offset = new[0].offset
            if limit_chars is not None and len(text) > limit_chars:
                offset += len(text) - limit_chars
                text = text[-limit_chars:]
            missed = max(0, offset - held.seen_up_to(position))
            pieces.append(OutputPiece(task_id, held.attempt, offset, text, missed, new[-1].position))
        return pieces

    def changed(self, run_id: str) -> anyio.Event:
        """An event set at the run's next change here (a call begins, writes or ends), or earlier
        (a waiter must look again after it, not assume a change)."""
        event = self._changed.get(run_id)
        if event is None:
            if len(self._changed) >= 4 * self.max_tasks:
                # Runs read but never written here (an inline run's long poll) would pile up: wake
                # every waiter instead (a waiter looks again and asks anew), and start afresh.
                for waiting in self._changed.values():
                    waiting.set()
                self._changed.clear()
            event = self._changed[run_id] = anyio.Event()
        return event

    def _notify(self, run_id: str) -> None:
        event = self._changed.pop(run_id, None)
        if event is not None:
            event.set()

    def _of(self, run_id: str) -> list[tuple[str, _Held]]:
        """The run's held tasks (task id, what is held), oldest call first."""
        return [(t, self._held[run_id, t]) for t in self._by_run.get(run_id, ())]

    def _drop(self, key: tuple[str, str]) -> bool:
        """Forget ``key``'s task; whether it was the last one of its run held here."""
        if self._held.pop(key, None) is None:
            return False
        self._ended.pop(key, None)
        run_id, task_id = key
        tasks = self._by_run[run_id]
        del tasks[task_id]
        if tasks:
            return False
        del self._by_run[run_id]
        return True

    def _evict(self) -> None:
        while len(self._held) > self.max_tasks:
            key = next(iter(self._ended), None) or next(iter(self._held))
            if self._drop(key):
                self._notify(key[0])  # its waiters look again, and nothing of the run stays here

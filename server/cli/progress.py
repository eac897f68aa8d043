"""What ``runs start|resume|approve|fork`` print while this process drives the run.

A command that advances a run drives it here until it settles (a host task, a gate, the end): with
a provider backend that is minutes of calls. Meanwhile the command prints, as they happen, the
run's id first (before any call: Ctrl-C from then on is said with it), then one line per task as it
starts and as it ends, with the time it took (from the recorded facts: the attempt's start to the
task's end), and the text the provider streams, as ``runs tail`` prints it (``  task> text``).
The run view follows, its ``next:`` line last. ``--quiet`` (and ``--json``) print none of this.

The lines come from the run's event feed (:func:`server.views.events.read_events`), read in this
process while it drives: the recorded events and the output held in memory of the calls in flight.
"""

from __future__ import annotations

from datetime import datetime
from typing import TextIO

import anyio

from orchestration.core import RunHead
from orchestration.engine import Runtime
from server.cli.live import write_delta
from server.views.events import Event, read_events

#: How long one read of the feed waits for the next event before it asks again.
_WAIT_SECONDS = 30.0
#: Event types said by the task lines (the others are said by the view that follows).
_STARTED, _DONE, _FAILED = "attempt_started", "task_completed", "task_failed"


def elapsed(seconds: float) -> str:
    """A duration as a person reads it: ``0.4s``, ``12.3s``, ``2m05s``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


class Progress:
    """The progress lines of one run driven here, printed to ``out`` (see the module docstring)."""

    def __init__(self, runtime: Runtime, out: TextIO) -> None:
        self.runtime = runtime
        self.out = out
        self._after = 0
        self._output_after = 0
        self._writing: str | None = None  # the task whose streamed text the last line is
        self._started: dict[str, datetime] = {}
        self._shown: dict[str, int] = {}  # per task: where the streamed text printed ends
        self._run_id = ""

    def begin(self, head: RunHead, verb: str) -> None:
        """The first line: the run's id, before anything is driven; events after ``head`` follow."""
        self._after, self._run_id = head.last_seq, head.run_id
        steps = " -> ".join(s.name for s in head.chain.steps)
        self.out.write(f"run {head.run_id} {verb}: {steps} (Ctrl-C stops this command; the run stays)\n")
        self.out.flush()

    async def follow(self, run_id: str) -> None:
        """Print the run's events as they come, until cancelled or the run ends."""
        while True:
            if await self._page(run_id, _WAIT_SECONDS):
                return

    async def catch_up(self, run_id: str) -> None:
        """Print what is recorded and not printed yet (after the drive settled), and end an open
        line of streamed text."""
        with anyio.CancelScope(shield=True):
            while not await self._page(run_id, 0.0, until_read=True):
                pass
        self._close_line()
        self.out.flush()

    async def _page(self, run_id: str, wait: float, until_read: bool = False) -> bool:
        """Print one page; True when there is nothing more to follow (the run ended and every
        event is out; ``until_read``: every recorded event is out)."""
        page = await read_events(
            self.runtime, run_id, self._after, 100, wait, output_after=self._output_after
        )
        for event in page.events:
            self._print(event)
        self.out.flush()
        self._after, self._output_after = page.next_after_seq, page.next_output_after
        return not page.more and (page.terminal or until_read)

    def _print(self, event: Event) -> None:
        if event.type == "output_delta":
            self._writing = write_delta(self.out, event, self._writing)
            self._shown[event.task_id or ""] = (event.offset or 0) + len(event.text or "")
            return
        if event.type in (_DONE, _FAILED, "attempt_failed"):
            self._rest_of_text(event)
        line = self._line(event)
        if line is not None:
            self._close_line()
            self.out.write(line + "\n")

    def _rest_of_text(self, event: Event) -> None:
        """The text a call wrote after the last piece printed (a call that ended is no longer in
        the feed: its last piece is read from what this process holds of it)."""
        task = event.task_id or ""
        shown = self._shown.pop(task, None)
        held = next((t for t in self.runtime.deltas.held(self._run_id) if t.task_id == task), None)
        if shown is None or held is None or held.start + len(held.text) <= shown:
            return
        rest = held.text[max(0, shown - held.start) :].rstrip("\n")
        piece = Event(seq=event.seq, at=event.at, type="output_delta", task_id=task, summary="", text=rest)
        self._writing = write_delta(self.out, piece, self._writing)

    def _close_line(self) -> None:
        if self._writing is not None:
            self.out.write("\n")
            self._writing = None

    def _line(self, event: Event) -> str | None:
        task = event.task_id or ""
        if event.type == _STARTED:
            self._started[task] = event.at
            return f"  {task}: started ({event.summary.split(': ', 1)[-1]})"
        if event.type in (_DONE, _FAILED):
            began = self._started.pop(task, None)
            took = f" in {elapsed((event.at - began).total_seconds())}" if began is not None else ""
            size = f" ({event.output.chars} chars)" if event.output is not None else ""
            said = "done" if event.type == _DONE else "failed: " + event.summary.split(": ", 1)[-1]
            return f"  {task}: {said}{took}{size}"
        if event.type == "attempt_failed":
            return f"  {task}: {event.summary.split(': ', 1)[-1]}"
        return None

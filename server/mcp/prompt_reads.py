"""How much of each long host task prompt this process handed out in parts (``task_prompt``), recorded
with the host's output, so that a host that skipped parts is visible in the run. Counted in the
process that served them: a record may say less was read than was, never more.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestration.core import PromptRead

#: how many tasks' counts are kept (the oldest goes first: a run abandoned mid-prompt)
TASKS_KEPT = 4096


@dataclass(slots=True)
class _Count:
    chars: int
    parted: bool = False
    #: served stretches of the user prompt, as sorted, disjoint [start, end) pairs
    spans: list[tuple[int, int]] = field(default_factory=list)

    def add(self, start: int, end: int) -> None:
        merged: list[tuple[int, int]] = []
        for s, e in sorted((*self.spans, (start, end))):
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            else:
                merged.append((s, e))
        self.spans = merged

    def read(self) -> PromptRead:
        return PromptRead(chars=self.chars, read=min(self.chars, sum(e - s for s, e in self.spans)))


class PromptReads:
    """Per ``(run_id, task_id)``: the prompt's length, whether it was handed out in parts, and
    which of its characters were served."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: OrderedDict[tuple[str, str], _Count] = OrderedDict()

    def _count(self, run_id: str, task_id: str, chars: int) -> _Count:
        key = (run_id, task_id)
        count = self._counts.get(key)
        if count is None or count.chars != chars:  # a new attempt's prompt starts over
            count = self._counts[key] = _Count(chars)
            while len(self._counts) > TASKS_KEPT:
                self._counts.popitem(last=False)
        self._counts.move_to_end(key)
        return count

    def shown(self, actions: Iterable[dict[str, Any]]) -> None:
        """Note what an answer's actions hand out: a host task's prompt whole (all of it served),
        or a ``read_prompt`` (the prompt is in parts)."""
        for action in actions:
            kind = action.get("kind")
            if kind == "run_host_task" and "user_prompt" in action:
                chars = len(action["user_prompt"])
                self._count(action["arguments"]["run_id"], action["task_id"], chars).add(0, chars)
            elif kind == "read_prompt":
                self._count(action["arguments"]["run_id"], action["task_id"], action["chars"]).parted = True

    def served(self, run_id: str, task_id: str, chars: int, start: int, end: int) -> None:
        """Characters ``start`` to ``end`` of the task's ``chars``-long user prompt were served."""
        count = self._count(run_id, task_id, chars)
        count.parted = True
        count.add(start, end)

    def of(self, run_id: str, task_id: str) -> PromptRead | None:
        """What to record with the task's output: how much was read, if the prompt was handed out
        in parts by this process; else None."""
        count = self._counts.get((run_id, task_id))
        return count.read() if count is not None and count.parted else None

    def forget(self, run_id: str, task_id: str) -> None:
        """The output is recorded: the count is done with."""
        self._counts.pop((run_id, task_id), None)


def actions_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The actions an answer's structured content carries: its ``next_action`` and
    ``more_actions``."""
    first = data.get("next_action")
    more = [a for a in data.get("more_actions", ()) if isinstance(a, dict)]
    return ([first] if isinstance(first, dict) else []) + more


__all__ = ["TASKS_KEPT", "PromptReads", "actions_of"]

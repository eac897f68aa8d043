"""The effectful engine: the :class:`Runtime` use cases (start, resume, approve, cancel, status,
list, drive), the drive that runs decide → act → record under a lease (the leased run it reads and
writes through), fan-out, delegation to agents, child runs, the dispatcher, the change notification
and the read side. Imports the layers below it, never :mod:`orchestration.ops`."""

from __future__ import annotations

from orchestration.engine.changes import is_settled
from orchestration.engine.children import live_children
from orchestration.engine.deltas import OutputDeltas, OutputPiece, TaskText
from orchestration.engine.dispatcher import Dispatcher
from orchestration.engine.host_answers import Answered, Meanwhile, Seen
from orchestration.engine.reading import RunSnapshot
from orchestration.engine.runtime import Runtime
from orchestration.engine.start_window import repeated

__all__ = [
    "Answered",
    "Dispatcher",
    "Meanwhile",
    "OutputDeltas",
    "OutputPiece",
    "RunSnapshot",
    "Runtime",
    "Seen",
    "TaskText",
    "is_settled",
    "live_children",
    "repeated",
]

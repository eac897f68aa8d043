"""The worker port: what the runtime needs from a backend that executes a task itself.

A :class:`TaskWorker` makes one call per attempt and returns its outcome as data
(:class:`AttemptSucceeded` or :class:`AttemptFailedOutcome`), never an exception the runtime has to
guess about. It never retries or sleeps: whether another attempt follows is decided from the
record by the pure ``decide``. Streamed text handed to the ``sink`` is never recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from orchestration.chains.prompts import TaskPrompt
from orchestration.core.models import ChainStep, ExecutionContract, TypedError
from orchestration.core.outcomes import AttemptOutcome


class TaskWorker(Protocol):
    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        """Make one attempt at the task. Must not raise for provider failures (return an
        :class:`AttemptFailedOutcome`); must be cancellable (an anyio cancel scope aborts it).
        ``sink``: where a call that streams hands its output as it is written (None: nowhere)."""
        ...


class DeltaSink(Protocol):
    """Where the output of one run's calls goes while it is written (in memory only)."""

    def writer(self, task_id: str, attempt: int) -> Callable[[str], None]:
        """What receives the pieces of output text of ``task_id``'s attempt ``attempt``, in order.
        Called when the call starts; it must not block."""
        ...

    def ended(self, task_id: str, attempt: int) -> None:
        """The call of the attempt ended (whatever its outcome): no more pieces come."""
        ...

"""The worker port: what the runtime needs from a backend that executes a task itself.

The ``inline`` backend executes nothing (the host's own model does the work; see
:mod:`orchestration.workers.host`). The ``provider`` backend implements :class:`TaskWorker`: one
call per attempt, whose outcome is data (:class:`AttemptSucceeded` or :class:`AttemptFailedOutcome`),
never an exception the runtime has to guess about. Retries are not the worker's business: the
durable step in the runtime records each attempt and decides (purely) whether to make another.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from orchestration.models import ChainStep, ExecutionContract, Telemetry, TypedError
from orchestration.prompts import TaskPrompt


@dataclass(frozen=True, slots=True)
class AttemptSucceeded:
    output: str
    telemetry: Telemetry


@dataclass(frozen=True, slots=True)
class AttemptFailedOutcome:
    error: TypedError
    telemetry: Telemetry
    #: when the next attempt may start at the earliest (backoff / retry-after); None: at once
    not_before: datetime | None = None


AttemptOutcome = AttemptSucceeded | AttemptFailedOutcome


class TaskWorker(Protocol):
    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
    ) -> AttemptOutcome:
        """Make one attempt at the task. Must not raise for provider failures (return an
        :class:`AttemptFailedOutcome`); must be cancellable (an anyio cancel scope aborts it)."""
        ...

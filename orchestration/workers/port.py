"""The worker port: what the runtime needs from a backend that executes a task itself.

The ``inline`` backend executes nothing (the host's own model does the work; see
:mod:`orchestration.workers.host`). The ``provider`` backend implements :class:`TaskWorker`: one
call per attempt, whose outcome is data (:class:`AttemptSucceeded` or :class:`AttemptFailedOutcome`),
never an exception the runtime has to guess about.

Who retries. A worker never retries and never sleeps: :meth:`TaskWorker.execute` makes one call.
Whether another attempt follows is settled from recorded data, in two places:

* the worker may fold a retry policy's verdict into a failed outcome. The provider worker does:
  it asks :class:`~orchestration.workers.retry.RetryPolicy` with the errors of the earlier
  attempts (read from the record by the runtime, ``previous_errors``) plus this one, clears
  ``retryable`` on the error when the policy refuses another attempt, and sets ``not_before``
  (now + backoff or retry-after) when it allows one;
* the runtime records the outcome as an ``attempt_failed`` fact (error and ``not_before``), and the
  pure ``decide`` step reads the record: a non-retryable error fails the task, the attempt budget
  (``ExecutionContract.max_attempts``, counting every recorded attempt) ends it, and ``not_before``
  is a durable wait before the next attempt. An attempt whose worker died (no outcome recorded) is
  retried by ``decide`` alone, within the same budget, marked as a possible duplicate call.

Output as it is written. A worker whose call streams hands each piece of output text to the
``sink`` :meth:`TaskWorker.execute` is given (the run's, from
:class:`orchestration.engine.deltas.OutputDeltas`), under the task id and attempt number. Nothing
handed there is recorded: the outcome carries the whole output, as without streaming.
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

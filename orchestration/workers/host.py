"""The ``inline`` worker: the host's own model does the work.

Preparing a host task materializes its prompts from the persisted record and records a
``host_task_prepared`` fact (with the prompt's hash, not the prompt: the prompt is re-materialized
from the record whenever it is shown, so a write never grows with earlier outputs). The run then
pauses ``awaiting_host`` until ``orchestrate_resume`` brings the output.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestration.facts import HostOutputSubmitted, HostTaskPrepared, TaskCompleted
from orchestration.models import RunHead, Telemetry, text_hash
from orchestration.prompts import TaskPrompt

HOST_EXECUTOR = "inline:host"


def host_task_prepared(head: RunHead, prompt: TaskPrompt, attempt: int, at: datetime) -> HostTaskPrepared:
    return HostTaskPrepared(
        seq=head.last_seq + 1,
        at=at,
        task_id=prompt.task_id,
        attempt=attempt,
        executor=HOST_EXECUTOR,
        prompt_sha256=prompt.sha256,
    )


def host_output_facts(
    head: RunHead,
    task_id: str,
    attempt: int,
    output: str,
    at: datetime,
    value: dict[str, Any] | None = None,
) -> list[HostOutputSubmitted | TaskCompleted]:
    """The facts of one host answer, written together: the submission and the task's completion.
    ``value``: the answer's validated value when the step has an output schema."""
    digest = text_hash(output)
    return [
        HostOutputSubmitted(
            seq=head.last_seq + 1,
            at=at,
            task_id=task_id,
            attempt=attempt,
            output_sha256=digest,
            output_chars=len(output),
        ),
        TaskCompleted(
            seq=head.last_seq + 2,
            at=at,
            task_id=task_id,
            attempt=attempt,
            executor=HOST_EXECUTOR,
            output=output,
            output_sha256=digest,
            telemetry=Telemetry(),
            value=value,
        ),
    ]

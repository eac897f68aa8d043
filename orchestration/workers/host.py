"""The ``inline`` worker: the host's own model does the work.

Preparing a host task materializes its prompts from the persisted record and records a
``host_task_prepared`` fact (with the prompt's hash, not the prompt: the prompt is re-materialized
from the record whenever it is shown, so a write never grows with earlier outputs). The run then
pauses ``awaiting_host`` until ``orchestrate_resume`` brings the output.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestration.chains.prompts import TaskPrompt
from orchestration.core.costs import HostUsage
from orchestration.core.facts import HostOutputSubmitted, HostTaskPrepared, TaskCompleted
from orchestration.core.models import DecisionChannel, PromptRead, RunHead, Telemetry, text_hash

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
    usage: HostUsage | None = None,
    prompt_read: PromptRead | None = None,
    *,
    by: str | None = None,
    channel: DecisionChannel | None = None,
    verified: bool = False,
) -> list[HostOutputSubmitted | TaskCompleted]:
    """The facts of one host answer, written together: the submission and the task's completion.
    ``value``: the answer's validated value when the step has an output schema. ``usage``: what
    the host reported it spent, on both facts (the completion's telemetry says
    ``reported_by_host``; that is what the run's totals and budget count). ``prompt_read``: how
    much of a prompt handed out in parts the host fetched, on the submission. ``by``, ``channel``
    and ``verified``: who handed the output in, on the submission (as a decision records its
    approver)."""
    digest = text_hash(output)
    telemetry = Telemetry()
    if usage is not None:
        telemetry = Telemetry(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost_usd=usage.cost_usd,
            reported_by_host=True,
        )
    return [
        HostOutputSubmitted(
            seq=head.last_seq + 1,
            at=at,
            task_id=task_id,
            attempt=attempt,
            output_sha256=digest,
            output_chars=len(output),
            usage=usage,
            prompt_read=prompt_read,
            by=by,
            channel=channel,
            verified=verified,
        ),
        TaskCompleted(
            seq=head.last_seq + 2,
            at=at,
            task_id=task_id,
            attempt=attempt,
            executor=HOST_EXECUTOR,
            output=output,
            output_sha256=digest,
            telemetry=telemetry,
            value=value,
        ),
    ]

"""Builders for store tests: real chain snapshots, real facts, heads produced by the real fold.

Every write a builder returns is what the runtime would hand a store: the facts of one atomic write
and the head :func:`orchestration.core.fold.apply_write` folds them into, so the conformance suite
exercises stores with legal records only (an illegal one would raise here, not in the store).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestration.core.facts import (
    ApprovalRequested,
    AttemptFailed,
    AttemptStarted,
    Fact,
    RunCancelled,
    RunCreated,
    TaskCompleted,
)
from orchestration.core.fold import apply_write, head_from_creation
from orchestration.core.models import (
    ChainSnapshot,
    ChainStep,
    ExecutionContract,
    RunHead,
    SpecialistSnapshot,
    TypedError,
    gate_id_for,
    text_hash,
)

BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)
INVALID_RUN_IDS = ("../../etc", "", "A/B")


@dataclass(frozen=True)
class Write:
    """One atomic write: append ``facts`` to a run whose head is at ``expected_version``."""

    expected_version: int
    facts: list[Fact]
    head: RunHead


def chain_snapshot(reviewer_schema: dict[str, Any] | None = None) -> ChainSnapshot:
    names = ("architect", "engineer", "reviewer")
    return ChainSnapshot(
        name="build",
        steps=(
            ChainStep(name="architect", specialist="architect"),
            ChainStep(name="engineer", specialist="engineer"),
            ChainStep(
                name="reviewer", specialist="reviewer", approve_before=True, output_schema=reviewer_schema
            ),
        ),
        specialists=tuple(
            SpecialistSnapshot(name=n, description=f"the {n}", persona=f"You are the {n}.") for n in names
        ),
    )


def run_id(n: int) -> str:
    return f"run-test-{n:06d}"


def new_run(
    rid: str,
    *,
    at: datetime = BASE_TIME,
    key: str | None = None,
    request: str = "build a to-do app",
    contract: ExecutionContract | None = None,
    deadline_at: datetime | None = None,
    reviewer_schema: dict[str, Any] | None = None,
) -> tuple[RunHead, list[Fact]]:
    """The head and facts of a run's first write (``create``)."""
    chain = chain_snapshot(reviewer_schema)
    created = RunCreated(
        seq=1,
        at=at,
        run_id=rid,
        request=request,
        chain=chain,
        chain_hash=chain.content_hash(),
        contract=contract or ExecutionContract(worker_backend="provider", provider="fake", model="m"),
        idempotency_key=key,
        request_hash=text_hash(request),
        deadline_at=deadline_at,
    )
    return head_from_creation(created), [created]


def _later(head: RunHead) -> datetime:
    return head.updated_at + timedelta(seconds=1)


def _write(head: RunHead, facts: list[Fact]) -> Write:
    return Write(head.version, facts, apply_write(head, facts))


def start_attempt(head: RunHead, task_id: str = "architect", *, executor: str = "provider:fake:m") -> Write:
    """``attempt_started`` for the next attempt of ``task_id`` (repeatable: each is a new attempt)."""
    attempt = len(head.task(task_id).attempts) + 1
    fact = AttemptStarted(
        seq=head.last_seq + 1, at=_later(head), task_id=task_id, attempt=attempt, executor=executor
    )
    return _write(head, [fact])


def complete_task(
    head: RunHead, task_id: str = "architect", output: str = "the output", value: dict[str, Any] | None = None
) -> Write:
    """Two facts in one write: an attempt starts and the task completes with ``output``."""
    attempt = len(head.task(task_id).attempts) + 1
    at = _later(head)
    facts: list[Fact] = [
        AttemptStarted(
            seq=head.last_seq + 1, at=at, task_id=task_id, attempt=attempt, executor="provider:fake:m"
        ),
        TaskCompleted(
            seq=head.last_seq + 2,
            at=at,
            task_id=task_id,
            attempt=attempt,
            executor="provider:fake:m",
            output=output,
            output_sha256=text_hash(output),
            value=value,
        ),
    ]
    return _write(head, facts)


def fail_attempt(head: RunHead, not_before: datetime | None, task_id: str = "architect") -> Write:
    """An attempt starts and fails retryably; the run goes back to ``queued`` until ``not_before``."""
    attempt = len(head.task(task_id).attempts) + 1
    at = _later(head)
    facts: list[Fact] = [
        AttemptStarted(
            seq=head.last_seq + 1, at=at, task_id=task_id, attempt=attempt, executor="provider:fake:m"
        ),
        AttemptFailed(
            seq=head.last_seq + 2,
            at=at,
            task_id=task_id,
            attempt=attempt,
            error=TypedError(code="rate_limited", message="slow down", retryable=True),
            not_before=not_before,
        ),
    ]
    return _write(head, facts)


def request_approval(head: RunHead, task_id: str = "reviewer") -> Write:
    fact = ApprovalRequested(seq=head.last_seq + 1, at=_later(head), gate_id=gate_id_for("before", task_id))
    return _write(head, [fact])


def cancel(head: RunHead) -> Write:
    fact = RunCancelled(seq=head.last_seq + 1, at=_later(head), reason="test")
    return _write(head, [fact])

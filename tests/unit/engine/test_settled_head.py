"""The head a store keeps does not grow as tasks finish; views fold the history back from the log.

A terminal task is *settled* in the head (id, specialist, status, output fact, error): its attempts,
executor, hashes and times live in the fact log only. :func:`with_history` restores them for views,
and :func:`encode_head` stores a head without its default-valued fields.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestration.core import StartRequest
from orchestration.core.facts import (
    AttemptFailed,
    AttemptStarted,
    Fact,
    RunCreated,
    TaskCompleted,
    TaskFailed,
)
from orchestration.core.fold import apply_write, fold, head_from_creation, with_history
from orchestration.core.models import (
    ChainSnapshot,
    ChainStep,
    ExecutionContract,
    RunHead,
    SpecialistSnapshot,
    Telemetry,
    TypedError,
    text_hash,
)
from orchestration.core.vocabulary import TaskStatus
from orchestration.errors import CorruptRecord
from stores._common import encode_head
from stores.memory import MemoryStore
from tests.unit.helpers import make_runtime, play

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EXECUTOR = "provider:p:m"


def created(steps: int) -> RunCreated:
    chain = ChainSnapshot(
        name="long",
        steps=tuple(
            ChainStep(name=f"t{i}", specialist="engineer", on_failure="continue") for i in range(steps)
        ),
        specialists=(SpecialistSnapshot(name="engineer", description="e", persona="You build."),),
    )
    return RunCreated(
        seq=1,
        at=T0,
        run_id="run-settled",
        request="r",
        chain=chain,
        chain_hash=chain.content_hash(),
        contract=ExecutionContract(worker_backend="provider", provider="p", model="m"),
        request_hash=text_hash("r"),
    )


class Log:
    """A run advanced write by write, keeping every fact and the head the runtime would store."""

    def __init__(self, steps: int) -> None:
        first = created(steps)
        self.facts: list[Fact] = [first]
        self.head = head_from_creation(first)

    def write(self, *facts: Fact) -> RunHead:
        self.head = apply_write(self.head, facts)
        self.facts.extend(facts)
        return self.head

    def at(self) -> datetime:
        return T0 + timedelta(seconds=self.head.last_seq)

    def seq(self, offset: int = 1) -> int:
        return self.head.last_seq + offset

    def finish(self, task_id: str, *, retried: bool = False) -> None:
        attempt = 1
        if retried:
            self.write(
                AttemptStarted(seq=self.seq(), at=self.at(), task_id=task_id, attempt=1, executor=EXECUTOR)
            )
            self.write(
                AttemptFailed(
                    seq=self.seq(),
                    at=self.at(),
                    task_id=task_id,
                    attempt=1,
                    error=TypedError(code="rate_limited", message="slow down", retryable=True),
                    telemetry=Telemetry(http_status=429),
                )
            )
            attempt = 2
        self.write(
            AttemptStarted(seq=self.seq(), at=self.at(), task_id=task_id, attempt=attempt, executor=EXECUTOR),
            TaskCompleted(
                seq=self.seq(2),
                at=self.at(),
                task_id=task_id,
                attempt=attempt,
                executor=EXECUTOR,
                output=f"output of {task_id}",
                output_sha256=text_hash(f"output of {task_id}"),
                telemetry=Telemetry(input_tokens=10, output_tokens=20),
            ),
        )


def test_a_finished_task_is_settled_in_the_head_and_its_history_is_in_the_log() -> None:
    log = Log(3)
    log.finish("t0", retried=True)
    settled = log.head.task("t0")
    assert settled.status == TaskStatus.DONE
    assert settled.output_seq == log.head.last_seq
    assert settled.attempts == () and settled.executor is None and settled.output_sha256 is None
    assert settled.started_at is None and settled.finished_at is None

    history = with_history(log.head, log.facts).task("t0")
    assert [a.outcome for a in history.attempts] == ["failed", "succeeded"]
    assert history.attempts[0].error is not None and history.attempts[0].error.code == "rate_limited"
    assert history.attempts[1].telemetry.output_tokens == 20
    assert history.executor == EXECUTOR
    assert history.output_sha256 == text_hash("output of t0")
    assert history.output_chars == len("output of t0")
    assert history.started_at is not None and history.finished_at is not None
    assert history.settled() == settled


def test_the_task_in_progress_keeps_its_attempts_in_the_head() -> None:
    log = Log(2)
    log.write(AttemptStarted(seq=log.seq(), at=log.at(), task_id="t0", attempt=1, executor=EXECUTOR))
    running = log.head.task("t0")
    assert running.status == TaskStatus.RUNNING
    assert len(running.attempts) == 1 and running.executor == EXECUTOR and running.started_at is not None


def test_a_failed_task_keeps_its_error_in_the_head() -> None:
    log = Log(2)
    error = TypedError(code="auth", message="bad key")
    log.write(AttemptStarted(seq=log.seq(), at=log.at(), task_id="t0", attempt=1, executor=EXECUTOR))
    log.write(TaskFailed(seq=log.seq(), at=log.at(), task_id="t0", error=error))
    failed = log.head.task("t0")
    assert failed.status == TaskStatus.FAILED and failed.error == error and failed.attempts == ()
    assert with_history(log.head, log.facts).task("t0").attempts[0].outcome == "failed"


def test_with_history_equals_the_full_fold_apart_from_the_write_count() -> None:
    log = Log(4)
    for i in range(3):
        log.finish(f"t{i}", retried=i == 1)
    history = with_history(log.head, log.facts)
    full = fold(log.facts, keep_history=True)
    assert history.tasks == full.tasks
    assert history.model_copy(update={"version": full.version}) == full
    assert fold(log.facts) == log.head.model_copy(update={"version": full.version})


def test_with_history_ignores_facts_written_after_the_head_and_refuses_a_short_log() -> None:
    log = Log(3)
    log.finish("t0")
    head = log.head
    log.finish("t1")
    assert with_history(head, log.facts).task("t1").status == TaskStatus.PENDING
    with pytest.raises(ValueError, match="ends at fact"):
        with_history(head, log.facts[: head.last_seq - 1])


def test_the_stored_head_grows_by_a_few_bytes_per_finished_task() -> None:
    """The head is rewritten at every append: finishing a task may add only its status and output
    reference to it, never its attempts, hashes or times."""
    log = Log(60)
    before = len(encode_head(log.head))
    for i in range(50):
        log.finish(f"t{i}", retried=i % 10 == 0)
    grown = len(encode_head(log.head)) - before
    assert grown <= 50 * 40, f"the head grew {grown} bytes for 50 finished tasks"


def test_the_stored_form_reads_back_equal_and_leaves_defaults_out() -> None:
    log = Log(3)
    log.finish("t0")
    log.write(AttemptStarted(seq=log.seq(), at=log.at(), task_id="t1", attempt=1, executor=EXECUTOR))
    stored = encode_head(log.head)
    assert RunHead.model_validate_json(stored) == log.head
    assert '{"task_id":"t2","specialist":"engineer"}' in stored, "a pending task is its id and specialist"
    assert stored.startswith('{"run_id":"run-settled","version":'), "stores read this prefix"


class _LosesTheLastFact(MemoryStore):
    lose = False

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        facts = await super().read_facts(run_id, after_seq, limit)
        return facts[:-1] if self.lose else facts


async def test_a_snapshot_shows_history_and_a_log_that_does_not_reach_the_head_is_corrupt() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("Make a game"))
    await play(runtime, head.run_id)
    snapshot = await runtime.snapshot(head.run_id)
    assert all(len(t.attempts) == 1 and t.executor == "inline:host" for t in snapshot.head.tasks)
    assert all(t.prompt_sha256 is not None for t in snapshot.head.tasks)
    assert set(snapshot.outputs) == {t.task_id for t in snapshot.head.tasks}

    broken = _LosesTheLastFact()
    runtime = make_runtime(store=broken)
    head, _ = await runtime.start(StartRequest("Make a game"))
    await play(runtime, head.run_id)
    broken.lose = True
    with pytest.raises(CorruptRecord, match=f"run {head.run_id}: its fact log"):
        await runtime.snapshot(head.run_id)

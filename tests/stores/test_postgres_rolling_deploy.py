"""Servers of two versions on one database, as during a rolling deploy (PostgreSQL): an older server
claims only the runs whose record format it reads and leaves the others to a newer server, instead
of claiming them, failing to load them and claiming them again. It says at open, in one warning, how
many live runs it leaves so; it still lists them.

An older server is simulated by a store opened with ``reads_format=RECORD_FORMAT - 1``; the runs of
the current format are genuine ones: a step's remote A2A task asked a question, which was answered
and sent (``agent_question_asked`` and the answer's facts, those that need the current format),
then the attempt failed and the run is queued again, by the store's own appends."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from orchestration.core.facts import (
    AgentAnswerSending,
    AgentAnswerSent,
    AgentQuestionAsked,
    ApprovalDecided,
    AttemptFailed,
    AttemptStarted,
    Fact,
)
from orchestration.core.fold import apply_write
from orchestration.core.models import RECORD_FORMAT, RunHead, TypedError
from orchestration.errors import InvalidArgument
from orchestration.store import Lease
from stores.postgres import PostgresStore
from tests.stores.builders import BASE_TIME, cancel, new_run, run_id
from tests.stores.sql_adapters import (
    PostgresDatabase,
    migrated_postgres,
)

pytestmark = pytest.mark.postgres

OLDER = RECORD_FORMAT - 1
WARNING = "store.runs_need_newer"


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[PostgresDatabase]:
    async with migrated_postgres(tmp_path) as database:
        yield database


@pytest.fixture
async def current(db: PostgresDatabase) -> AsyncIterator[PostgresStore]:
    opened = await db.open()
    try:
        yield opened
    finally:
        await opened.close()


async def create(store: PostgresStore, n: int, *, record_format: int = 1) -> RunHead:
    """Run ``n``, queued: of format 1 as created, of ``RECORD_FORMAT`` once a remote agent's
    question was answered, or of another format as the facts of a server that writes it state it."""
    head, facts = new_run(run_id(n), at=BASE_TIME + timedelta(seconds=n))
    if record_format not in (1, RECORD_FORMAT):
        facts = [fact.model_copy(update={"format": record_format}) for fact in facts]
        head = head.model_copy(update={"format": record_format})
    assert (await store.create(head, facts)).created
    if record_format == RECORD_FORMAT:
        for unnumbered in asked_and_answered(head):
            fact = unnumbered.model_copy(update={"seq": head.last_seq + 1})
            head = await store.append(head.run_id, head.version, [fact], apply_write(head, [fact]))
    assert head.format == record_format and head.status.value == "queued"
    return head


def asked_and_answered(head: RunHead) -> list[Fact]:
    """The facts of an attempt whose remote A2A task asked a question that was answered, the
    answer sent, then the attempt failed (the run queued again): record format 8."""
    at = head.updated_at + timedelta(milliseconds=1)
    gate, remote = "question:architect:1", "remote-task-1"
    task, attempt = "architect", 1
    return [
        AttemptStarted(
            seq=0,
            at=at,
            executor="agent:peer:message/send",
            remote_run_id=remote,
            waits=True,
            format=6,
            task_id=task,
            attempt=attempt,
        ),
        AgentQuestionAsked(
            seq=0,
            at=at,
            agent="peer",
            remote_run_id=remote,
            gate_id=gate,
            number=1,
            question="Which branch?",
            task_id=task,
            attempt=attempt,
        ),
        ApprovalDecided(seq=0, at=at, gate_id=gate, decision="approve", comment="main", approver="ann"),
        AgentAnswerSending(seq=0, at=at, gate_id=gate, message_id="m-1", task_id=task, attempt=attempt),
        AgentAnswerSent(seq=0, at=at, gate_id=gate, message_id="m-1", task_id=task, attempt=attempt),
        AttemptFailed(
            seq=0,
            at=at,
            error=TypedError(code="agent_unreachable", message="gone"),
            task_id=task,
            attempt=attempt,
        ),
    ]


async def stored_head_tail(db: PostgresDatabase, rid: str) -> str:
    conn = await asyncpg.connect(db.dsn, server_settings={"search_path": db.schema})
    try:
        return str(await conn.fetchval("SELECT right(head, 40) FROM runs WHERE run_id = $1", rid))
    finally:
        await conn.close()


def claimed(leases: list[Lease]) -> list[str]:
    return [lease.run_id for lease in leases]


async def test_the_stored_head_ends_with_its_format(current: PostgresStore, db: PostgresDatabase) -> None:
    """What the queries read: the head as the adapter stores it ends with ``"format":<n>}``."""
    await create(current, 1)
    await create(current, 2, record_format=RECORD_FORMAT)
    assert (await stored_head_tail(db, run_id(1))).endswith('"format":1}')
    assert (await stored_head_tail(db, run_id(2))).endswith(f'"format":{RECORD_FORMAT}}}')


async def test_an_older_server_leaves_the_runs_of_a_newer_format_to_a_newer_one(
    current: PostgresStore, db: PostgresDatabase
) -> None:
    await create(current, 1, record_format=RECORD_FORMAT)
    await create(current, 2, record_format=OLDER)
    await create(current, 3)
    older = await db.open(reads_format=OLDER)
    try:
        assert await older.runnable(BASE_TIME) == [run_id(2), run_id(3)]
        assert claimed(await older.claim_runnable("older", 30, BASE_TIME, limit=10)) == [run_id(2), run_id(3)]
        # Nothing else for the older server, even with room to spare; the current one takes run 1.
        assert await older.claim_runnable("older", 30, BASE_TIME, limit=10) == []
        assert await current.runnable(BASE_TIME) == [run_id(1), run_id(2), run_id(3)]
        assert claimed(await current.claim_runnable("current", 3600, BASE_TIME, limit=10)) == [run_id(1)]
        # Once the older server's leases expire, the current one takes its runs too.
        later = BASE_TIME + timedelta(seconds=60)
        assert claimed(await current.claim_runnable("current", 30, later, limit=10)) == [run_id(2), run_id(3)]
    finally:
        await older.close()


async def test_the_older_formats_are_claimed_by_both(current: PostgresStore, db: PostgresDatabase) -> None:
    await create(current, 1, record_format=OLDER)
    await create(current, 2, record_format=OLDER)
    older = await db.open(reads_format=OLDER)
    try:
        assert claimed(await older.claim_runnable("older", 30, BASE_TIME, limit=1)) == [run_id(1)]
        assert claimed(await current.claim_runnable("current", 30, BASE_TIME, limit=1)) == [run_id(2)]
    finally:
        await older.close()


async def test_an_expired_lease_on_a_newer_run_is_not_taken_over_by_an_older_server(
    current: PostgresStore, db: PostgresDatabase
) -> None:
    """A newer server that died leaves its lease to expire: the claim reads such runs from the
    leases' side (another part of the query), and leaves them as well."""
    await create(current, 1, record_format=RECORD_FORMAT)
    await create(current, 2)
    assert len(await current.claim_runnable("died", 1, BASE_TIME, limit=10)) == 2
    later = BASE_TIME + timedelta(seconds=10)
    older = await db.open(reads_format=OLDER)
    try:
        assert claimed(await older.claim_runnable("older", 30, later, limit=10)) == [run_id(2)]
        assert claimed(await current.claim_runnable("current", 30, later, limit=10)) == [run_id(1)]
    finally:
        await older.close()


async def test_the_older_server_warns_once_at_open_with_the_count_of_live_runs_it_leaves(
    current: PostgresStore, db: PostgresDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    for n in (1, 2, 3):
        await create(current, n, record_format=RECORD_FORMAT)
    await create(current, 4, record_format=OLDER)
    ended = await create(current, 5, record_format=RECORD_FORMAT)
    write = cancel(ended)
    await current.append(ended.run_id, write.expected_version, write.facts, write.head)
    with caplog.at_level(logging.INFO, logger="stores.postgres"):
        older = await db.open(reads_format=OLDER)
        await older.claim_runnable("older", 30, BASE_TIME, limit=10)
        await older.close()
        also_current = await db.open()  # reads every run: nothing to say
        await also_current.close()
    warned = [r for r in caplog.records if getattr(r, "action", None) == WARNING]
    assert len(warned) == 1, caplog.records
    record = warned[0]
    assert record.levelno == logging.WARNING
    assert (getattr(record, "count", None), getattr(record, "reads_format", None)) == (3, OLDER)
    message = record.getMessage()
    assert "newer server: 3" in message and f"newer than {OLDER}" in message, message


async def test_the_older_server_still_lists_the_runs_it_leaves(
    current: PostgresStore, db: PostgresDatabase
) -> None:
    """The filter is the claim's only: the run's status still shows on the older server."""
    left = await create(current, 1, record_format=RECORD_FORMAT)
    older = await db.open(reads_format=OLDER)
    try:
        assert await older.claim_runnable("older", 30, BASE_TIME, limit=10) == []
        page = await older.list_runs()
        assert [run.run_id for run in page.runs] == [run_id(1)]
        assert (await older.load(run_id(1))) == left
    finally:
        await older.close()


@pytest.mark.parametrize("reads_format", [0, RECORD_FORMAT + 1])
async def test_a_store_cannot_claim_formats_this_code_does_not_read(
    db: PostgresDatabase, reads_format: int
) -> None:
    with pytest.raises(InvalidArgument, match="reads_format"):
        await db.open(reads_format=reads_format)

"""The RunStore conformance suite: every promise of :class:`orchestration.store.RunStore`'s
docstrings, checked against every adapter (the ``store`` fixture in ``conftest.py``)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest

from orchestration.core.facts import AttemptStarted, RunCreated
from orchestration.core.models import RunHead
from orchestration.core.vocabulary import RunStatus
from orchestration.errors import (
    Conflict,
    FactNotFound,
    InvalidArgument,
    LeaseLost,
    RunNotFound,
    VersionConflict,
)
from orchestration.store import ClaimsRunnable, CreateResult, Lease, RunStore
from stores._common import list_order_key
from tests.stores.builders import (
    BASE_TIME,
    INVALID_RUN_IDS,
    Write,
    cancel,
    complete_task,
    fail_attempt,
    new_run,
    request_approval,
    run_id,
    start_attempt,
)


async def create(store: RunStore, rid: str, **kwargs: Any) -> RunHead:
    head, facts = new_run(rid, **kwargs)
    result = await store.create(head, facts)
    assert result.created
    return result.head


async def commit(store: RunStore, write: Write) -> RunHead:
    return await store.append(write.head.run_id, write.expected_version, write.facts, write.head)


async def seqs(store: RunStore, rid: str, after_seq: int = 0, limit: int | None = None) -> list[int]:
    return [f.seq for f in await store.read_facts(rid, after_seq, limit)]


def test_the_store_satisfies_the_protocol(store: RunStore) -> None:
    assert isinstance(store, RunStore)
    assert isinstance(store.name, str) and store.name


# ----------------------------------------------------------------------------------------- create


async def test_create_then_load_returns_the_same_head(store: RunStore) -> None:
    head, facts = new_run(run_id(1), key="key-1")
    result = await store.create(head, facts)
    assert result.created is True
    assert result.head == head
    loaded = await store.load(run_id(1))
    assert loaded == head
    assert loaded.version == 1
    assert await store.read_facts(run_id(1)) == facts


async def test_create_with_an_existing_idempotency_key_returns_the_existing_run(store: RunStore) -> None:
    first = await create(store, run_id(1), key="same-key", request="first")
    advanced = await commit(store, start_attempt(first))

    head, facts = new_run(run_id(2), key="same-key", request="second")
    result = await store.create(head, facts)

    assert result.created is False
    # The *current* head of the existing run: the caller compares request hashes with it.
    assert result.head == advanced
    assert result.head.request == "first"
    with pytest.raises(RunNotFound):
        await store.load(run_id(2))
    page = await store.list_runs()
    assert [h.run_id for h in page.runs] == [run_id(1)]
    assert await seqs(store, run_id(1)) == [1, 2]


async def test_retrying_the_same_keyed_create_returns_the_run(store: RunStore) -> None:
    head, facts = new_run(run_id(1), key="retry-key")
    assert (await store.create(head, facts)).created is True
    again = await store.create(head, facts)
    assert again == CreateResult(head, created=False)
    assert await seqs(store, run_id(1)) == [1]


async def test_different_idempotency_keys_create_different_runs(store: RunStore) -> None:
    await create(store, run_id(1), key="key-a")
    await create(store, run_id(2), key="key-b")
    await create(store, run_id(3))
    await create(store, run_id(4))
    assert len((await store.list_runs()).runs) == 4


async def test_find_by_idempotency_key_reads_the_current_head_of_the_keyed_run(store: RunStore) -> None:
    assert await store.find_by_idempotency_key("looked-up") is None
    first = await create(store, run_id(1), key="looked-up")
    await create(store, run_id(2), key="another")
    await create(store, run_id(3))
    assert await store.find_by_idempotency_key("looked-up") == first
    advanced = await commit(store, start_attempt(first))
    assert await store.find_by_idempotency_key("looked-up") == advanced
    assert (await store.find_by_idempotency_key("another")) == await store.load(run_id(2))
    # Keys are matched exactly: no prefix, no case folding.
    for near in ("looked-u", "looked-up-", "LOOKED-UP"):
        assert await store.find_by_idempotency_key(near) is None


async def test_create_with_an_existing_run_id_is_a_conflict(store: RunStore) -> None:
    original_head, original_facts = new_run(run_id(1), request="original")
    await store.create(original_head, original_facts)
    head, facts = new_run(run_id(1), request="impostor")
    with pytest.raises(Conflict):
        await store.create(head, facts)
    assert await store.load(run_id(1)) == original_head
    assert await store.read_facts(run_id(1)) == original_facts
    first = await store.read_fact(run_id(1), 1)
    assert isinstance(first, RunCreated)
    assert first.request == "original"


async def test_a_conflicting_create_does_not_record_its_idempotency_key(store: RunStore) -> None:
    await create(store, run_id(1))
    head, facts = new_run(run_id(1), key="fresh-key")
    with pytest.raises(Conflict):
        await store.create(head, facts)
    # The key was not taken by the failed create: a new run can use it.
    result = await store.create(*new_run(run_id(2), key="fresh-key"))
    assert result.created is True
    assert result.head.run_id == run_id(2)


async def test_concurrent_creates_with_one_key_make_one_run(store: RunStore) -> None:
    results: list[bool] = []

    async def attempt(n: int) -> None:
        result = await store.create(*new_run(run_id(n), key="contested"))
        results.append(result.created)
        assert result.head.idempotency_key == "contested"

    async with anyio.create_task_group() as tg:
        for n in range(1, 9):
            tg.start_soon(attempt, n)
    assert sorted(results) == [False] * 7 + [True]
    assert len((await store.list_runs()).runs) == 1


# ---------------------------------------------------------------------------- invalid run ids


def _calls_with_run_id(store: RunStore, bad: str) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
    head, facts = new_run(run_id(1))
    bad_head = head.model_copy(update={"run_id": bad})
    write = start_attempt(bad_head)
    return [
        ("create", lambda: store.create(bad_head, facts)),
        ("load", lambda: store.load(bad)),
        ("append", lambda: store.append(bad, write.expected_version, write.facts, write.head)),
        ("read_facts", lambda: store.read_facts(bad)),
        ("read_fact", lambda: store.read_fact(bad, 1)),
        ("claim_lease", lambda: store.claim_lease(bad, "worker", 30, BASE_TIME)),
    ]


@pytest.mark.parametrize("bad", INVALID_RUN_IDS, ids=repr)
async def test_every_method_rejects_a_malformed_run_id(store: RunStore, bad: str) -> None:
    await create(store, run_id(1))
    for name, call in _calls_with_run_id(store, bad):
        with pytest.raises(InvalidArgument):
            await call()
            pytest.fail(f"{name} accepted run id {bad!r}")
    assert [h.run_id for h in (await store.list_runs()).runs] == [run_id(1)]


# -------------------------------------------------------------------------------- load / missing


async def test_methods_on_a_missing_run_raise_run_not_found(store: RunStore) -> None:
    head, _ = new_run(run_id(9))
    write = start_attempt(head)
    with pytest.raises(RunNotFound) as info:
        await store.load(run_id(9))
    assert info.value.run_id == run_id(9)
    with pytest.raises(RunNotFound):
        await store.append(run_id(9), write.expected_version, write.facts, write.head)
    with pytest.raises(RunNotFound):
        await store.read_facts(run_id(9))
    with pytest.raises(RunNotFound):
        await store.read_fact(run_id(9), 1)
    with pytest.raises(RunNotFound):
        await store.claim_lease(run_id(9), "worker", 30, BASE_TIME)
    # Nothing was created by the failed calls.
    assert (await store.list_runs()).runs == []


# ------------------------------------------------------------------------------------- append


async def test_append_stores_facts_and_head(store: RunStore) -> None:
    head = await create(store, run_id(1))
    write = complete_task(head, output="x" * 10_000)
    stored = await commit(store, write)
    assert stored == write.head
    assert await store.load(run_id(1)) == write.head
    assert stored.version == 2
    assert stored.last_seq == 3
    assert await store.read_facts(run_id(1), after_seq=1) == write.facts


async def test_append_with_a_stale_version_conflicts_and_writes_nothing(store: RunStore) -> None:
    head = await create(store, run_id(1))
    current = await commit(store, start_attempt(head))
    stale = start_attempt(head, executor="provider:other:m")  # built on version 1
    with pytest.raises(VersionConflict) as info:
        await commit(store, stale)
    assert (info.value.expected, info.value.actual) == (1, 2)
    assert await store.load(run_id(1)) == current
    assert await seqs(store, run_id(1)) == [1, 2]

    ahead = Write(5, stale.facts, stale.head.model_copy(update={"version": 6}))
    with pytest.raises(VersionConflict):
        await commit(store, ahead)
    assert await store.load(run_id(1)) == current
    assert await seqs(store, run_id(1)) == [1, 2]


async def test_two_concurrent_writers_on_one_version_exactly_one_wins(store: RunStore) -> None:
    head = await create(store, run_id(1))
    for round_ in range(25):
        writes = {name: start_attempt(head, executor=f"provider:{name}:m") for name in ("alpha", "beta")}
        outcomes: dict[str, str] = {}

        async def write(name: str, w: Write, outcomes: dict[str, str]) -> None:
            try:
                await commit(store, w)
                outcomes[name] = "won"
            except VersionConflict:
                outcomes[name] = "lost"

        async with anyio.create_task_group() as tg:
            for name, w in writes.items():
                tg.start_soon(write, name, w, outcomes)

        assert sorted(outcomes.values()) == ["lost", "won"], f"round {round_}: {outcomes}"
        winner = next(name for name, outcome in outcomes.items() if outcome == "won")
        stored = await store.load(run_id(1))
        assert stored == writes[winner].head
        new = await store.read_facts(run_id(1), after_seq=head.last_seq)
        assert new == writes[winner].facts
        head = stored
    assert await seqs(store, run_id(1)) == list(range(1, 27))


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda w: Write(w.expected_version, [], w.head), id="no-facts"),
        pytest.param(
            lambda w: Write(w.expected_version, w.facts, w.head.model_copy(update={"version": 3})),
            id="version-skips",
        ),
        pytest.param(
            lambda w: Write(w.expected_version, w.facts, w.head.model_copy(update={"version": 1})),
            id="version-repeats",
        ),
        pytest.param(
            lambda w: Write(w.expected_version, w.facts, w.head.model_copy(update={"last_seq": 9})),
            id="last-seq-mismatch",
        ),
        pytest.param(
            lambda w: Write(w.expected_version, w.facts, w.head.model_copy(update={"run_id": run_id(2)})),
            id="head-of-another-run",
        ),
    ],
)
async def test_a_malformed_append_is_rejected_and_writes_nothing(
    store: RunStore, mangle: Callable[[Write], Write]
) -> None:
    head = await create(store, run_id(1))
    await create(store, run_id(2))
    bad = mangle(complete_task(head))
    with pytest.raises(InvalidArgument):
        await store.append(run_id(1), bad.expected_version, bad.facts, bad.head)
    assert await store.load(run_id(1)) == head
    assert await seqs(store, run_id(1)) == [1]
    assert await seqs(store, run_id(2)) == [1]


async def test_appended_facts_must_continue_the_log(store: RunStore) -> None:
    head = await create(store, run_id(1))
    write = start_attempt(head)
    skipped = write.facts[0].model_copy(update={"seq": 3})
    with pytest.raises(InvalidArgument, match=f"first fact appended to run {run_id(1)}"):
        await store.append(run_id(1), 1, [skipped], write.head.model_copy(update={"last_seq": 3}))
    repeated = write.facts[0].model_copy(update={"seq": 1})
    with pytest.raises(InvalidArgument, match=run_id(1)):
        await store.append(run_id(1), 1, [repeated], write.head.model_copy(update={"last_seq": 1}))

    two = complete_task(head)
    gap = [two.facts[0], two.facts[1].model_copy(update={"seq": 4})]
    with pytest.raises(InvalidArgument, match="consecutive"):
        await store.append(run_id(1), 1, gap, two.head.model_copy(update={"last_seq": 4}))
    assert await seqs(store, run_id(1)) == [1]
    assert await store.load(run_id(1)) == head
    assert await commit(store, write) == write.head, "a correct append still goes through"


async def test_create_checks_its_first_write(store: RunStore) -> None:
    head, facts = new_run(run_id(1))
    with pytest.raises(InvalidArgument, match="at least one fact"):
        await store.create(head, [])
    with pytest.raises(InvalidArgument, match="version 1"):
        await store.create(head.model_copy(update={"version": 2}), facts)
    with pytest.raises(InvalidArgument, match="seq 1"):
        await store.create(head.model_copy(update={"last_seq": 2}), [facts[0].model_copy(update={"seq": 2})])
    with pytest.raises(InvalidArgument, match="last_seq"):
        await store.create(head.model_copy(update={"last_seq": 2}), facts)
    assert (await store.list_runs()).runs == []
    with pytest.raises(RunNotFound):
        await store.load(run_id(1))


# -------------------------------------------------------------------------------- read facts


async def _run_with_history(store: RunStore) -> tuple[RunHead, list[int]]:
    head = await create(store, run_id(1))
    head = await commit(store, complete_task(head, "architect", "design"))  # seqs 2, 3
    head = await commit(store, start_attempt(head, "engineer"))  # 4
    head = await commit(store, complete_task(head, "engineer", "code"))  # 5, 6 (a new attempt)
    head = await commit(store, request_approval(head))  # 7
    return head, list(range(1, 8))


async def test_read_facts_after_seq_and_limit(store: RunStore) -> None:
    head, all_seqs = await _run_with_history(store)
    assert head.last_seq == 7
    assert await seqs(store, run_id(1)) == all_seqs
    assert await seqs(store, run_id(1), after_seq=3) == [4, 5, 6, 7]
    assert await seqs(store, run_id(1), after_seq=3, limit=2) == [4, 5]
    assert await seqs(store, run_id(1), limit=1) == [1]
    assert await seqs(store, run_id(1), after_seq=6, limit=10) == [7]
    assert await seqs(store, run_id(1), after_seq=7) == []
    assert await seqs(store, run_id(1), after_seq=100) == []
    assert await seqs(store, run_id(1), after_seq=0, limit=0) == []
    facts = await store.read_facts(run_id(1))
    assert [f.type for f in facts] == [
        "run_created",
        "attempt_started",
        "task_completed",
        "attempt_started",
        "attempt_started",
        "task_completed",
        "approval_requested",
    ]


async def test_read_fact_by_seq(store: RunStore) -> None:
    await _run_with_history(store)
    facts = await store.read_facts(run_id(1))
    for fact in facts:
        assert await store.read_fact(run_id(1), fact.seq) == fact
    completed = await store.read_fact(run_id(1), 6)
    assert completed.type == "task_completed"
    assert completed.output == "code"
    for missing in (0, -1, 8, 1000):
        with pytest.raises(FactNotFound):
            await store.read_fact(run_id(1), missing)


async def test_the_task_output_is_found_through_the_head(store: RunStore) -> None:
    head = await create(store, run_id(1))
    head = await commit(store, complete_task(head, "architect", "a design document"))
    loaded = await store.load(run_id(1))
    output_seq = loaded.task("architect").output_seq
    assert output_seq is not None
    fact = await store.read_fact(run_id(1), output_seq)
    assert fact.type == "task_completed"
    assert fact.output == "a design document"


@pytest.mark.parametrize(
    "text",
    [
        "a NUL \x00 in the middle",
        "\x00",
        "\ue000 a private-use character, \ue000\ue000 twice, \ue0000 before a zero",
        "a backslash and u0000: \\u0000, \\\x00, \\\\u0000",
        "control \x01\x1f and emoji \U0001f600",
    ],
    ids=["nul", "only-nul", "escape-char", "backslashes", "control"],
)
async def test_any_text_reads_back_exactly(store: RunStore, text: str) -> None:
    """Outputs and requests are recorded verbatim, whatever characters they hold (PostgreSQL's
    JSONB cannot hold U+0000: that adapter escapes it)."""
    head = await create(store, run_id(1), request=f"request: {text}")
    head = await commit(store, complete_task(head, "architect", text))
    loaded = await store.load(run_id(1))
    assert loaded == head and loaded.request == f"request: {text}"
    facts = await store.read_facts(run_id(1))
    assert facts[-1].type == "task_completed" and facts[-1].output == text
    assert (await store.read_fact(run_id(1), facts[-1].seq)) == facts[-1]
    page = await store.list_runs()
    assert [h.request for h in page.runs] == [f"request: {text}"]


async def test_a_typed_output_and_its_schema_read_back_exactly(store: RunStore) -> None:
    """A step's output schema (in the chain snapshot) and a typed task's validated value (in its
    ``task_completed`` fact) are plain JSON and come back as they were written."""
    schema = {
        "type": "object",
        "properties": {"verdict": {"enum": ["approve", "revise"]}, "notes": {"type": "string"}},
        "required": ["verdict"],
    }
    head = await create(store, run_id(1), reviewer_schema=schema)
    value = {"verdict": "revise", "notes": "a NUL \x00, \U0001f600", "score": 0.5, "tags": [None, True]}
    head = await commit(store, complete_task(head, "reviewer", '{"verdict": "revise"}', value))
    loaded = await store.load(run_id(1))
    assert loaded == head and loaded.chain.step("reviewer").output_schema == schema
    fact = await store.read_fact(run_id(1), loaded.task("reviewer").output_seq or 0)
    assert fact.type == "task_completed" and fact.value == value


# --------------------------------------------------------------------------------- list_runs


async def _runs_in_every_status(store: RunStore) -> dict[str, RunStatus]:
    """Eight runs; created_at ties on purpose (broken by run_id)."""
    statuses: dict[str, RunStatus] = {}
    for n in range(1, 9):
        at = BASE_TIME + timedelta(minutes=n // 2)
        head = await create(store, run_id(n), at=at)
        if n % 4 == 1:
            head = await commit(store, start_attempt(head))
        elif n % 4 == 2:
            head = await commit(store, request_approval(head))
        elif n % 4 == 3:
            head = await commit(store, cancel(head))
        statuses[head.run_id] = head.status
    return statuses


def _newest_first(heads: list[RunHead]) -> list[str]:
    return [h.run_id for h in sorted(heads, key=list_order_key, reverse=True)]


async def test_list_runs_newest_first(store: RunStore) -> None:
    await _runs_in_every_status(store)
    page = await store.list_runs()
    assert page.next_cursor is None
    expected = [run_id(n) for n in (8, 7, 6, 5, 4, 3, 2, 1)]
    assert [h.run_id for h in page.runs] == expected
    assert _newest_first(page.runs) == expected
    for head in page.runs:
        assert head == await store.load(head.run_id)


async def test_list_runs_filters_by_status(store: RunStore) -> None:
    statuses = await _runs_in_every_status(store)
    for wanted in (
        frozenset({RunStatus.RUNNING}),
        frozenset({RunStatus.QUEUED, RunStatus.CANCELLED}),
        frozenset({RunStatus.AWAITING_APPROVAL}),
        frozenset({RunStatus.COMPLETED}),
    ):
        page = await store.list_runs(statuses=wanted)
        expected = sorted((rid for rid, s in statuses.items() if s in wanted), reverse=True)
        assert [h.run_id for h in page.runs] == expected, wanted
        assert all(h.status in wanted for h in page.runs)
    assert len((await store.list_runs(statuses=None)).runs) == 8


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 8, 50])
async def test_pagination_covers_every_run_exactly_once(store: RunStore, limit: int) -> None:
    await _runs_in_every_status(store)
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:  # bounded by the pages < 20 check below
        page = await store.list_runs(limit=limit, cursor=cursor)
        pages += 1
        assert len(page.runs) <= limit
        seen.extend(h.run_id for h in page.runs)
        if page.next_cursor is None:
            break
        assert page.runs, "a page with a next cursor is not empty"
        cursor = page.next_cursor
        assert pages < 20, "pagination does not terminate"
    assert seen == [run_id(n) for n in (8, 7, 6, 5, 4, 3, 2, 1)]
    assert pages == max(1, -(-8 // limit))


async def test_pagination_with_a_status_filter(store: RunStore) -> None:
    statuses = await _runs_in_every_status(store)
    wanted = frozenset({RunStatus.QUEUED, RunStatus.RUNNING})
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(20):  # bounded: a cursor that does not advance must fail, not hang
        page = await store.list_runs(statuses=wanted, limit=1, cursor=cursor)
        seen.extend(h.run_id for h in page.runs)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == sorted((rid for rid, s in statuses.items() if s in wanted), reverse=True)


async def test_a_run_created_while_paging_does_not_disturb_later_pages(store: RunStore) -> None:
    for n in range(1, 7):
        await create(store, run_id(n), at=BASE_TIME + timedelta(minutes=n))
    first = await store.list_runs(limit=3)
    assert [h.run_id for h in first.runs] == [run_id(6), run_id(5), run_id(4)]
    await create(store, run_id(7), at=BASE_TIME + timedelta(minutes=7))
    second = await store.list_runs(limit=3, cursor=first.next_cursor)
    assert [h.run_id for h in second.runs] == [run_id(3), run_id(2), run_id(1)]
    assert second.next_cursor is None


async def test_list_runs_on_an_empty_store(store: RunStore) -> None:
    page = await store.list_runs()
    assert page.runs == []
    assert page.next_cursor is None


def _forged(payload: str) -> str:
    return base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


#: Cursors nobody gave out: nested past the JSON parser's recursion limit, an object whose two keys
#: would unpack as two strings, a list of three.
FORGED_CURSORS = [
    _forged("[" * 100_000 + "]" * 100_000),
    _forged('{"2026-01-01T00:00:00.000000Z": 1, "run-x": 2}'),
    _forged('["2026-01-01T00:00:00.000000Z", "run-x", "more"]'),
]


@pytest.mark.parametrize(
    "cursor",
    ["not a cursor!", "bm90IGpzb24", "WzEsIDJd", "e30", *FORGED_CURSORS],
    ids=["text", "not-json", "numbers", "empty-object", "deep", "object", "three"],
)
async def test_an_unreadable_cursor_is_invalid_argument(store: RunStore, cursor: str) -> None:
    await create(store, run_id(1))
    with pytest.raises(InvalidArgument):
        await store.list_runs(cursor=cursor)


# ---------------------------------------------------------------------------------- runnable


async def test_runnable_lists_due_queued_and_running_runs(store: RunStore) -> None:
    now = BASE_TIME + timedelta(hours=1)
    fresh = await create(store, run_id(1))
    assert fresh.status == RunStatus.QUEUED
    running = await commit(store, start_attempt(await create(store, run_id(2))))
    assert running.status == RunStatus.RUNNING
    past = await commit(store, fail_attempt(await create(store, run_id(3)), now - timedelta(seconds=1)))
    exactly = await commit(store, fail_attempt(await create(store, run_id(4)), now))
    future = await commit(store, fail_attempt(await create(store, run_id(5)), now + timedelta(minutes=5)))
    assert {past.status, exactly.status, future.status} == {RunStatus.QUEUED}
    await commit(store, request_approval(await create(store, run_id(6))))
    await commit(store, cancel(await create(store, run_id(7))))

    due = await store.runnable(now)
    assert sorted(due) == [run_id(1), run_id(2), run_id(3), run_id(4)]
    later = await store.runnable(now + timedelta(minutes=5))
    assert sorted(later) == [run_id(n) for n in range(1, 6)]
    assert len(await store.runnable(now, limit=2)) == 2
    assert set(await store.runnable(now, limit=2)) <= set(due)


async def test_runnable_lists_oldest_first(store: RunStore) -> None:
    for n, minutes in ((1, 3), (2, 1), (3, 2), (4, 1)):
        await create(store, run_id(n), at=BASE_TIME + timedelta(minutes=minutes))
    assert await store.runnable(BASE_TIME + timedelta(hours=1)) == [
        run_id(2),
        run_id(4),
        run_id(3),
        run_id(1),
    ]
    assert await store.runnable(BASE_TIME + timedelta(hours=1), limit=2) == [run_id(2), run_id(4)]


#: Adapters known not to honour a promise yet, per test: strict xfail, so the fix turns the test red
#: until its entry is deleted here.
KNOWN_GAPS: dict[str, dict[str, str]] = {
    "wake_at": {},
}


def known_gap(request: pytest.FixtureRequest, store: RunStore, promise: str) -> None:
    reason = KNOWN_GAPS[promise].get(store.name)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"{store.name}: {reason}"))


async def test_runnable_lists_paused_runs_whose_deadline_passed(
    store: RunStore, request: pytest.FixtureRequest
) -> None:
    known_gap(request, store, "wake_at")
    deadline = BASE_TIME + timedelta(hours=1)
    for n in (1, 2, 3):
        head = await create(store, run_id(n), deadline_at=deadline)
        assert head.wake_at == deadline
        if n == 1:
            await commit(store, request_approval(head))
        elif n == 2:
            await commit(store, fail_attempt(head, deadline + timedelta(hours=1)))
        else:
            await commit(store, cancel(head))
    await commit(store, request_approval(await create(store, run_id(4))))  # no deadline at all

    assert await store.runnable(deadline - timedelta(seconds=1)) == []
    # Paused or waiting past not_before, the deadline wakes the run; a terminal run never wakes.
    assert await store.runnable(deadline) == [run_id(1), run_id(2)]


async def test_runnable_on_an_empty_store(store: RunStore) -> None:
    assert await store.runnable(BASE_TIME) == []


# ------------------------------------------------------------------------------------ leases


async def test_claim_a_free_lease(store: RunStore) -> None:
    await create(store, run_id(1))
    lease = await store.claim_lease(run_id(1), "worker-a", 30, BASE_TIME)
    assert lease is not None
    assert (lease.run_id, lease.owner, lease.expires_at) == (
        run_id(1),
        "worker-a",
        BASE_TIME + timedelta(seconds=30),
    )
    assert isinstance(lease.token, str) and len(lease.token) >= 16


async def test_a_held_lease_cannot_be_claimed_by_another_owner(store: RunStore) -> None:
    await create(store, run_id(1))
    await create(store, run_id(2))
    assert await store.claim_lease(run_id(1), "worker-a", 30, BASE_TIME) is not None
    assert await store.claim_lease(run_id(1), "worker-b", 30, BASE_TIME + timedelta(seconds=29)) is None
    # Leases are per run.
    assert await store.claim_lease(run_id(2), "worker-b", 30, BASE_TIME) is not None


async def test_the_owner_can_claim_its_lease_again_with_a_new_token(store: RunStore) -> None:
    await create(store, run_id(1))
    first = await store.claim_lease(run_id(1), "worker-a", 30, BASE_TIME)
    again = await store.claim_lease(run_id(1), "worker-a", 60, BASE_TIME + timedelta(seconds=10))
    assert first is not None and again is not None
    assert again.expires_at == BASE_TIME + timedelta(seconds=70)
    assert again.token != first.token


async def test_an_expired_lease_can_be_taken_over(store: RunStore) -> None:
    await create(store, run_id(1))
    await store.claim_lease(run_id(1), "worker-a", 30, BASE_TIME)
    # Expiry is judged by the caller's clock: at expires_at the lease is no longer held.
    taken = await store.claim_lease(run_id(1), "worker-b", 30, BASE_TIME + timedelta(seconds=30))
    assert taken is not None
    assert (taken.owner, taken.expires_at) == ("worker-b", BASE_TIME + timedelta(seconds=60))
    assert await store.claim_lease(run_id(1), "worker-a", 30, BASE_TIME + timedelta(seconds=31)) is None


async def test_renew_extends_the_lease(store: RunStore) -> None:
    await create(store, run_id(1))
    lease = await store.claim_lease(run_id(1), "worker-a", 10, BASE_TIME)
    assert lease is not None
    renewed = await store.renew_lease(lease, 10, BASE_TIME + timedelta(seconds=5))
    # A renewal keeps the claim's token.
    assert renewed == Lease(run_id(1), "worker-a", BASE_TIME + timedelta(seconds=15), lease.token)
    # Without the renewal worker-b could claim at t=12; with it the lease holds until t=15.
    assert await store.claim_lease(run_id(1), "worker-b", 10, BASE_TIME + timedelta(seconds=12)) is None
    assert await store.claim_lease(run_id(1), "worker-b", 10, BASE_TIME + timedelta(seconds=15)) is not None


async def test_an_expired_lease_nobody_took_can_still_be_renewed(store: RunStore) -> None:
    await create(store, run_id(1))
    lease = await store.claim_lease(run_id(1), "worker-a", 10, BASE_TIME)
    assert lease is not None
    # LeaseLost means another owner took the run or the lease was released; a late renewal of a
    # lease nobody took over is still the owner's.
    renewed = await store.renew_lease(lease, 10, BASE_TIME + timedelta(seconds=20))
    assert renewed.expires_at == BASE_TIME + timedelta(seconds=30)
    assert await store.claim_lease(run_id(1), "worker-b", 10, BASE_TIME + timedelta(seconds=25)) is None


async def test_renew_after_a_takeover_raises_lease_lost(store: RunStore) -> None:
    await create(store, run_id(1))
    lease_a = await store.claim_lease(run_id(1), "worker-a", 10, BASE_TIME)
    assert lease_a is not None
    lease_b = await store.claim_lease(run_id(1), "worker-b", 10, BASE_TIME + timedelta(seconds=11))
    assert lease_b is not None
    with pytest.raises(LeaseLost):
        await store.renew_lease(lease_a, 10, BASE_TIME + timedelta(seconds=12))
    # The failed renewal did not disturb worker-b's lease.
    assert await store.claim_lease(run_id(1), "worker-c", 10, BASE_TIME + timedelta(seconds=12)) is None
    assert await store.renew_lease(lease_b, 10, BASE_TIME + timedelta(seconds=12)) == Lease(
        run_id(1), "worker-b", BASE_TIME + timedelta(seconds=22), lease_b.token
    )


async def test_renew_after_release_raises_lease_lost(store: RunStore) -> None:
    await create(store, run_id(1))
    lease = await store.claim_lease(run_id(1), "worker-a", 10, BASE_TIME)
    assert lease is not None
    await store.release_lease(lease)
    with pytest.raises(LeaseLost):
        await store.renew_lease(lease, 10, BASE_TIME)


async def test_renew_leases_renews_several_in_one_call_and_reports_the_lost_ones(store: RunStore) -> None:
    for n in range(1, 6):
        await create(store, run_id(n))
    leases = []
    for n in range(1, 6):
        lease = await store.claim_lease(run_id(n), "worker-a", 10, BASE_TIME)
        assert lease is not None
        leases.append(lease)
    # Run 2's lease expired and worker-b claimed it; run 3's was released; run 4's expired but
    # nobody took it (still worker-a's); runs 1 and 5 are held.
    stolen = await store.claim_lease(run_id(2), "worker-b", 10, BASE_TIME + timedelta(seconds=11))
    assert stolen is not None
    await store.release_lease(leases[2])
    at = BASE_TIME + timedelta(seconds=12)
    renewed = await store.renew_leases(leases, 10, at)
    expires = BASE_TIME + timedelta(seconds=22)
    assert renewed == {
        run_id(1): Lease(run_id(1), "worker-a", expires, leases[0].token),
        run_id(2): None,
        run_id(3): None,
        run_id(4): Lease(run_id(4), "worker-a", expires, leases[3].token),
        run_id(5): Lease(run_id(5), "worker-a", expires, leases[4].token),
    }
    # The renewals hold (nobody can claim before t=22), worker-b's lease was not disturbed, and the
    # released run stays free.
    assert await store.claim_lease(run_id(1), "worker-c", 10, BASE_TIME + timedelta(seconds=21)) is None
    assert await store.claim_lease(run_id(4), "worker-c", 10, BASE_TIME + timedelta(seconds=21)) is None
    assert await store.renew_lease(stolen, 10, at) == Lease(run_id(2), "worker-b", expires, stolen.token)
    assert await store.claim_lease(run_id(3), "worker-c", 10, at) is not None
    assert await store.claim_lease(run_id(5), "worker-c", 10, BASE_TIME + timedelta(seconds=22)) is not None


async def test_renew_leases_keeps_the_fence_of_each_lease(store: RunStore) -> None:
    head = await create(store, run_id(1))
    lease = await _claim(store, "worker-a", 0)
    renewed = (await store.renew_leases([lease], 10, BASE_TIME + timedelta(seconds=5)))[run_id(1)]
    assert renewed is not None and renewed.token == lease.token
    write = start_attempt(head)
    assert await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=renewed) == (
        write.head
    )
    # A lease the batch reported lost fences its holder out, as one renew_lease's LeaseLost does.
    taken = await _claim(store, "worker-b", 20)
    assert await store.renew_leases([renewed], 10, BASE_TIME + timedelta(seconds=21)) == {run_id(1): None}
    await _refused(store, start_attempt(write.head), renewed, write.head)
    assert (await store.renew_leases([taken], 10, BASE_TIME + timedelta(seconds=21)))[run_id(1)] == Lease(
        run_id(1), "worker-b", BASE_TIME + timedelta(seconds=31), taken.token
    )


async def test_renew_leases_of_nothing_is_nothing(store: RunStore) -> None:
    assert await store.renew_leases([], 10, BASE_TIME) == {}


async def test_release_frees_the_lease(store: RunStore) -> None:
    await create(store, run_id(1))
    lease = await store.claim_lease(run_id(1), "worker-a", 30, BASE_TIME)
    assert lease is not None
    await store.release_lease(lease)
    assert await store.claim_lease(run_id(1), "worker-b", 30, BASE_TIME) is not None
    # Releasing twice is harmless.
    await store.release_lease(lease)


async def test_release_by_a_former_owner_does_nothing(store: RunStore) -> None:
    await create(store, run_id(1))
    lease_a = await store.claim_lease(run_id(1), "worker-a", 10, BASE_TIME)
    assert lease_a is not None
    lease_b = await store.claim_lease(run_id(1), "worker-b", 10, BASE_TIME + timedelta(seconds=10))
    assert lease_b is not None
    await store.release_lease(lease_a)
    assert await store.claim_lease(run_id(1), "worker-c", 10, BASE_TIME + timedelta(seconds=11)) is None
    await store.release_lease(lease_b)
    assert await store.claim_lease(run_id(1), "worker-c", 10, BASE_TIME + timedelta(seconds=11)) is not None


async def test_of_concurrent_claimers_exactly_one_gets_the_lease(store: RunStore) -> None:
    for round_ in range(5):
        rid = run_id(round_ + 1)
        await create(store, rid)
        winners: list[str] = []

        async def claim(rid: str, owner: str, winners: list[str]) -> None:
            if await store.claim_lease(rid, owner, 30, BASE_TIME) is not None:
                winners.append(owner)

        async with anyio.create_task_group() as tg:
            for n in range(8):
                tg.start_soon(claim, rid, f"worker-{n}", winners)
        assert len(winners) == 1, f"round {round_}: {winners}"


async def test_renew_and_release_with_a_token_the_owner_replaced_do_nothing(store: RunStore) -> None:
    await create(store, run_id(1))
    old = await store.claim_lease(run_id(1), "worker-a", 10, BASE_TIME)
    new = await store.claim_lease(run_id(1), "worker-a", 10, BASE_TIME + timedelta(seconds=1))
    assert old is not None and new is not None
    with pytest.raises(LeaseLost):
        await store.renew_lease(old, 10, BASE_TIME + timedelta(seconds=2))
    await store.release_lease(old)
    # The new claim still holds the run, and its token still renews.
    assert await store.claim_lease(run_id(1), "worker-b", 10, BASE_TIME + timedelta(seconds=2)) is None
    renewed = await store.renew_lease(new, 10, BASE_TIME + timedelta(seconds=2))
    assert renewed.token == new.token


async def test_every_claim_gets_a_token_of_its_own(store: RunStore) -> None:
    tokens: set[str] = set()
    for n in range(1, 4):
        await create(store, run_id(n))
        for owner in ("worker-a", "worker-a", "worker-b"):
            at = BASE_TIME + timedelta(seconds=100 * len(tokens))
            lease = await store.claim_lease(run_id(n), owner, 10, at)
            assert lease is not None
            tokens.add(lease.token)
    assert len(tokens) == 9


async def test_leases_are_not_facts(store: RunStore) -> None:
    head = await create(store, run_id(1))
    lease = await store.claim_lease(run_id(1), "worker-a", 30, BASE_TIME)
    assert lease is not None
    await store.renew_lease(lease, 30, BASE_TIME)
    await store.release_lease(lease)
    assert await store.load(run_id(1)) == head
    assert await seqs(store, run_id(1)) == [1]


# ------------------------------------------------------------------------------------- close


async def test_close_is_idempotent(store: RunStore) -> None:
    await store.close()
    await store.close()


async def test_a_written_fact_is_the_typed_model(store: RunStore) -> None:
    head = await create(store, run_id(1))
    write = start_attempt(head, executor="provider:fake:m")
    await commit(store, write)
    fact = await store.read_fact(run_id(1), 2)
    assert isinstance(fact, AttemptStarted)
    assert fact == write.facts[0]
    assert fact.at.tzinfo is not None


# ------------------------------------------------------------------------------ the lease fence


async def _claim(store: RunStore, owner: str, at_seconds: float, ttl: float = 10) -> Lease:
    lease = await store.claim_lease(run_id(1), owner, ttl, BASE_TIME + timedelta(seconds=at_seconds))
    assert lease is not None
    return lease


async def _refused(store: RunStore, write: Write, lease: Lease, before: RunHead) -> None:
    """The fenced append raises ``LeaseLost`` and writes nothing."""
    with pytest.raises(LeaseLost) as caught:
        await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=lease)
    assert caught.value.code == "lease_lost"
    assert await store.load(run_id(1)) == before
    assert await seqs(store, run_id(1)) == list(range(1, before.last_seq + 1))


async def test_an_append_with_the_lease_it_holds_is_accepted(store: RunStore) -> None:
    head = await create(store, run_id(1))
    lease = await _claim(store, "worker-a", 0)
    write = start_attempt(head)
    stored = await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=lease)
    assert stored == write.head
    # A renewed lease is the same claim: it fences nothing out.
    renewed = await store.renew_lease(lease, 10, BASE_TIME + timedelta(seconds=5))
    nxt = start_attempt(stored)
    assert await store.append(run_id(1), nxt.expected_version, nxt.facts, nxt.head, lease=renewed) == nxt.head


async def test_an_append_whose_lease_another_owner_took_is_refused_and_writes_nothing(
    store: RunStore,
) -> None:
    head = await create(store, run_id(1))
    stale = await _claim(store, "worker-a", 0)
    await _claim(store, "worker-b", 11)  # worker-a's lease had expired
    await _refused(store, start_attempt(head), stale, head)


async def test_a_lost_lease_is_reported_before_a_lost_version_race(store: RunStore) -> None:
    head = await create(store, run_id(1))
    stale = await _claim(store, "worker-a", 0)
    fresh = await _claim(store, "worker-b", 11)
    theirs = start_attempt(head)
    moved = await store.append(run_id(1), 1, theirs.facts, theirs.head, lease=fresh)
    # worker-a writes on the version it read before worker-b moved the run: LeaseLost, which tells
    # it to stop, not VersionConflict, which would make it decide again.
    await _refused(store, start_attempt(head), stale, moved)


async def test_an_append_after_the_owner_claimed_again_is_refused_for_the_old_token(store: RunStore) -> None:
    head = await create(store, run_id(1))
    old = await _claim(store, "worker-a", 0)
    new = await _claim(store, "worker-a", 5)
    write = start_attempt(head)
    await _refused(store, write, old, head)
    assert (
        await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=new)
        == write.head
    )


async def test_an_expired_lease_nobody_claimed_still_lets_its_holder_write(store: RunStore) -> None:
    head = await create(store, run_id(1))
    lease = await _claim(store, "worker-a", 0, ttl=10)
    # Long past its expiry, but nobody claimed the run since: the token still holds.
    write = start_attempt(head)
    stored = await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=lease)
    assert stored == write.head
    renewed = await store.renew_lease(lease, 10, BASE_TIME + timedelta(seconds=60))
    assert renewed.token == lease.token


async def test_an_append_with_a_released_lease_is_refused(store: RunStore) -> None:
    head = await create(store, run_id(1))
    lease = await _claim(store, "worker-a", 0)
    await store.release_lease(lease)
    await _refused(store, start_attempt(head), lease, head)


async def test_appends_without_a_lease_need_none(store: RunStore) -> None:
    """External events (a host's output, an approval, a cancel) hold no lease."""
    head = await create(store, run_id(1))
    await _claim(store, "worker-a", 0)
    write = cancel(head)
    assert await commit(store, write) == write.head


async def test_a_fenced_append_needs_a_lease_on_its_own_run(store: RunStore) -> None:
    head = await create(store, run_id(1))
    await create(store, run_id(2))
    other = await store.claim_lease(run_id(2), "worker-a", 10, BASE_TIME)
    assert other is not None
    write = start_attempt(head)
    with pytest.raises(InvalidArgument):
        await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=other)
    assert await store.load(run_id(1)) == head


async def test_a_fenced_append_to_a_missing_run_is_run_not_found(store: RunStore) -> None:
    head, _ = new_run(run_id(1))
    write = start_attempt(head)
    lease = Lease(run_id(1), "worker-a", BASE_TIME, "0" * 32)
    with pytest.raises(RunNotFound):
        await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=lease)


async def test_batch_claims_carry_tokens_that_fence(store: RunStore) -> None:
    """The optional ``claim_runnable`` ability (``ClaimsRunnable``: sqlite, postgres) hands out
    leases like ``claim_lease`` does: each with a new token, which fences the previous holder."""
    if not isinstance(store, ClaimsRunnable):
        pytest.skip(f"{store.name} has no claim_runnable")
    head = await create(store, run_id(1))
    stale = await _claim(store, "worker-a", 0)
    leases = await store.claim_runnable("worker-b", 10, BASE_TIME + timedelta(seconds=11), 10)
    assert [lease.run_id for lease in leases] == [run_id(1)]
    assert leases[0].token and leases[0].token != stale.token
    await _refused(store, start_attempt(head), stale, head)
    write = start_attempt(head)
    assert (
        await store.append(run_id(1), write.expected_version, write.facts, write.head, lease=leases[0])
        == write.head
    )

"""Records that outlive a version, on every adapter: records written by a newer
version of the server are planted raw into each store's own storage, then read with this code.

- A head or a fact of a newer record format is ``record_too_new`` (naming both formats and the run),
  never read as something else; lists skip such a run and log it.
- A fact of a type this code does not know is ``record_too_new`` too: it is never dropped.
- A record of this format with fields this code does not know reads fine; they are ignored.
- The runtime leaves such a run alone: status and every call on it say ``record_too_new``, a drive
  sets it aside, and nothing stored for the run changes (compared byte for byte).

The rules are in docs/development.md, "Record formats".
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.fold import apply_write
from orchestration.core.models import RECORD_FORMAT, RunHead
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from orchestration.errors import CorruptRecord, RecordTooNew
from orchestration.store import RunStore
from orchestration.workers.host import host_output_facts
from tests.stores.builders import BASE_TIME, Write, complete_task, new_run, run_id
from tests.stores.raw_records import RawRecords

NEWER = RECORD_FORMAT + 1


async def create(store: RunStore, n: int) -> RunHead:
    head, facts = new_run(run_id(n), at=BASE_TIME + timedelta(minutes=n))
    assert (await store.create(head, facts)).created
    return head


async def commit(store: RunStore, write: Write) -> RunHead:
    return await store.append(write.head.run_id, write.expected_version, write.facts, write.head)


def needs_text(raw: RawRecords) -> None:
    if not raw.holds_text:
        pytest.skip("the memory store holds records as objects: only a valid record can be planted")


def assert_too_new(exc: RecordTooNew, rid: str, record_format: int, where: str) -> None:
    assert exc.code == "record_too_new"
    assert isinstance(exc, CorruptRecord)  # so every path that leaves an unreadable run alone does
    assert (exc.run_id, exc.record_format, exc.supported_format) == (rid, record_format, RECORD_FORMAT)
    assert where in exc.where
    text = str(exc)
    assert rid in text and f"record format {record_format}" in text, text
    assert f"record formats up to {RECORD_FORMAT}" in text, text


# ------------------------------------------------------------------------------- store level


async def test_every_record_states_its_format(store: RunStore) -> None:
    raw = RawRecords(store)
    needs_text(raw)
    head = await create(store, 1)
    await commit(store, complete_task(head))
    # Format 1 is what today's records need (a newer RECORD_FORMAT leaves them at 1).
    assert (await raw.head(run_id(1)))["format"] == 1
    assert [(await raw.fact(run_id(1), seq))["format"] for seq in (1, 2, 3)] == [1, 1, 1]


async def test_a_head_of_a_newer_format_is_record_too_new(
    store: RunStore, caplog: pytest.LogCaptureFixture
) -> None:
    raw = RawRecords(store)
    for n in (1, 2, 3):
        await create(store, n)
    newer = await raw.head(run_id(2))
    # What a newer version could write: a new field, and the format that says it must not be ignored.
    newer |= {"format": NEWER, "lanes": [{"lane": "main"}]}
    await raw.set_head(run_id(2), newer)
    stored = await raw.everything(run_id(2))

    with pytest.raises(RecordTooNew) as info:
        await store.load(run_id(2))
    assert_too_new(info.value, run_id(2), NEWER, "head")

    with caplog.at_level(logging.WARNING):
        page = await store.list_runs()
    assert [h.run_id for h in page.runs] == [run_id(3), run_id(1)]
    reports = [r.getMessage() for r in caplog.records if run_id(2) in r.getMessage()]
    assert reports and all(f"record format {NEWER}" in m for m in reports), reports
    assert await raw.everything(run_id(2)) == stored


async def test_a_fact_of_a_newer_format_is_record_too_new(store: RunStore) -> None:
    raw = RawRecords(store)
    head = await create(store, 1)
    await commit(store, complete_task(head))
    await raw.set_fact(run_id(1), 3, await raw.fact(run_id(1), 3) | {"format": NEWER})

    with pytest.raises(RecordTooNew) as info:
        await store.read_fact(run_id(1), 3)
    assert_too_new(info.value, run_id(1), NEWER, "fact 3")
    with pytest.raises(RecordTooNew):
        await store.read_facts(run_id(1))
    # The facts before it are read as ever.
    assert [f.seq for f in await store.read_facts(run_id(1), limit=2)] == [1, 2]
    assert (await store.read_fact(run_id(1), 2)).type == "attempt_started"


async def test_a_fact_of_an_unknown_type_is_record_too_new_not_dropped(store: RunStore) -> None:
    raw = RawRecords(store)
    needs_text(raw)
    head = await create(store, 1)
    await commit(store, complete_task(head))
    # A newer version's fact whose writer did not raise the format: still never skipped.
    unknown = {"seq": 3, "at": "2026-01-01T00:00:02Z", "format": 1, "type": "lane_forked", "lane": "b"}
    await raw.set_fact(run_id(1), 3, unknown)

    with pytest.raises(RecordTooNew) as info:
        await store.read_fact(run_id(1), 3)
    assert_too_new(info.value, run_id(1), 1, "fact 3")
    assert info.value.fact_type == "lane_forked" and "'lane_forked'" in str(info.value)
    with pytest.raises(RecordTooNew):
        await store.read_facts(run_id(1))


async def test_a_damaged_record_is_still_corrupt_not_too_new(store: RunStore) -> None:
    raw = RawRecords(store)
    needs_text(raw)
    head = await create(store, 1)
    await commit(store, complete_task(head))
    fact = await raw.fact(run_id(1), 3)
    del fact["output"]
    await raw.set_fact(run_id(1), 3, fact)
    with pytest.raises(CorruptRecord) as info:
        await store.read_fact(run_id(1), 3)
    assert info.value.code == "corrupt_record"


async def test_unknown_fields_of_this_format_are_ignored(store: RunStore) -> None:
    raw = RawRecords(store)
    needs_text(raw)
    head = await create(store, 1)
    stored = await commit(store, complete_task(head))
    original_fact = await store.read_fact(run_id(1), 3)

    extended = await raw.head(run_id(1))
    extended["priority"] = "high"
    extended["tasks"][0]["lane"] = "main"
    extended["chain"]["steps"][0]["retries"] = {"max": 5}
    await raw.set_head(run_id(1), extended)
    fact = await raw.fact(run_id(1), 3)
    fact["telemetry"]["cached_tokens"] = 12
    fact["citations"] = ["a", "b"]
    await raw.set_fact(run_id(1), 1, (await raw.fact(run_id(1), 1)) | {"labels": {"team": "x"}})
    await raw.set_fact(run_id(1), 3, fact)

    assert await store.load(run_id(1)) == stored
    assert await store.read_fact(run_id(1), 3) == original_fact
    assert [f.seq for f in await store.read_facts(run_id(1))] == [1, 2, 3]
    assert [h.run_id for h in (await store.list_runs()).runs] == [run_id(1)]


async def test_a_record_without_a_format_is_format_1(store: RunStore) -> None:
    """Records written before formats existed state none: they are format 1 and read as before."""
    raw = RawRecords(store)
    needs_text(raw)
    head = await create(store, 1)
    stored = await commit(store, complete_task(head))
    old_head = await raw.head(run_id(1))
    del old_head["format"]
    await raw.set_head(run_id(1), old_head)
    old_fact = await raw.fact(run_id(1), 3)
    del old_fact["format"]
    await raw.set_fact(run_id(1), 3, old_fact)

    loaded = await store.load(run_id(1))
    assert loaded == stored and loaded.format == 1
    assert (await store.read_fact(run_id(1), 3)).format == 1


# ------------------------------------------------------------------------------ runtime level


def runtime_on(store: RunStore, clock: ManualClock, owner: str = "old-server") -> Runtime:
    return Runtime(
        store, Catalog.builtin(), clock=clock, settings=RuntimeSettings(owner=owner, lease_ttl_seconds=30)
    )


async def queued_after_architect(runtime: Runtime) -> str:
    """An inline run whose architect is done: the next drive would prepare the engineer's task,
    reading the architect's output (fact 4)."""
    head, _ = await runtime.start(StartRequest("records test", chain=("architect", "engineer")))
    # The architect's output recorded alone, as a server before issue 23 recorded it (since, the
    # engineer's task is prepared in the same write).
    head = await runtime.store.load(head.run_id)
    facts = host_output_facts(head, "architect", 1, "the design", runtime.clock.now())
    await runtime.store.append(head.run_id, head.version, facts, apply_write(head, facts))
    return head.run_id


async def assert_left_alone(
    runtime: Runtime, clock: ManualClock, raw: RawRecords, rid: str, where: str, calls: bool
) -> None:
    """Drives and (with ``calls``) every call on the run answer ``record_too_new``; the run's
    lease is free afterwards and nothing stored for it changed."""
    stored = await raw.everything(rid)
    with pytest.raises(RecordTooNew) as info:
        await runtime.drive(rid)
    assert_too_new(info.value, rid, NEWER, where)
    # Set aside, not retried at every poll ...
    assert await runtime.drive(rid) is None
    # ... and when it is tried again, still left alone.
    clock.advance(runtime.unreadable_retry_seconds + 1)
    with pytest.raises(RecordTooNew):
        await runtime.drive(rid)
    if calls:
        for call in (
            runtime.status(rid),
            runtime.submit_host_output(rid, "engineer", "an answer"),
            runtime.cancel(rid),
        ):
            with pytest.raises(RecordTooNew):
                await call
    lease = await runtime.store.claim_lease(rid, "new-server", 30, clock.now())
    assert lease is not None, "the drive did not release the run's lease"
    await runtime.store.release_lease(lease)
    assert await raw.everything(rid) == stored, "a record of a newer format was rewritten"


async def test_the_runtime_leaves_a_run_with_a_newer_head_alone(store: RunStore) -> None:
    raw = RawRecords(store)
    needs_text(raw)  # the memory store's claim reads the head itself
    clock = ManualClock()
    runtime = runtime_on(store, clock)
    rid = await queued_after_architect(runtime)
    other = await queued_after_architect(runtime)
    await raw.set_head(rid, await raw.head(rid) | {"format": NEWER})

    await assert_left_alone(runtime, clock, raw, rid, "head", calls=True)
    # The other run is untouched by it.
    assert [h.run_id for h in (await runtime.list_runs()).runs] == [other]
    assert type(await runtime.drive(other)).__name__ == "AwaitHost"


async def test_the_runtime_leaves_a_run_with_a_newer_fact_alone(store: RunStore) -> None:
    raw = RawRecords(store)
    needs_text(raw)
    clock = ManualClock()
    runtime = runtime_on(store, clock)
    rid = await queued_after_architect(runtime)
    head = await runtime.status(rid)
    output_seq = head.task("architect").output_seq
    assert output_seq is not None
    record: dict[str, Any] = await raw.fact(rid, output_seq)
    await raw.set_fact(rid, output_seq, record | {"format": NEWER})

    await assert_left_alone(runtime, clock, raw, rid, f"fact {output_seq}", calls=False)

"""The host's path in one write: each host output, gate decision and inline start is ONE durable
write that holds what follows from it, needs no lease and no drive, reads nothing but the run's
head when the process's memory holds what it showed last, and builds the snapshot a view shows
exactly as a read of the log would."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, cast

import anyio
import anyio.lowlevel
import pytest

from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.decide import AwaitHost, FailTask, next_actions
from orchestration.core.facts import Fact, HostTaskPrepared, RunCreated
from orchestration.core.fold import apply
from orchestration.core.inputs import with_task_timeout
from orchestration.core.models import AttemptRecord, PromptRead, RunHead, evolve
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.host_writes import Written, follow_up, host_answers_next, while_writing
from orchestration.engine.reading import RunSnapshot, read_prompt, read_snapshot
from orchestration.engine.runtime import Runtime
from orchestration.errors import LeaseLost, VersionConflict
from orchestration.store import CreateResult, Lease
from stores.memory import MemoryStore
from tests.unit.helpers import make_runtime
from tests.unit.parallel import PARALLEL_CATALOG, RESEARCHERS
from tests.unit.routed import ROUTED_CATALOG, answer_for


class CountingStore(MemoryStore):
    """Counts writes, lease claims and reads of the log."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.claims = 0
        self.log_reads = 0

    async def create(
        self, head: RunHead, facts: Sequence[Fact], *, flushing: Callable[[], None] | None = None
    ) -> CreateResult:
        self.writes += 1
        return await super().create(head, facts, flushing=flushing)

    async def append(
        self,
        run_id: str,
        expected_version: int,
        facts: Sequence[Fact],
        head: RunHead,
        lease: Lease | None = None,
        *,
        flushing: Callable[[], None] | None = None,
    ) -> RunHead:
        self.writes += 1
        return await super().append(run_id, expected_version, facts, head, lease, flushing=flushing)

    async def claim_lease(self, run_id: str, owner: str, ttl_seconds: float, now: datetime) -> Lease | None:
        self.claims += 1
        return await super().claim_lease(run_id, owner, ttl_seconds, now)

    async def read_facts(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Fact]:
        self.log_reads += 1
        return await super().read_facts(run_id, after_seq, limit)

    async def read_fact(self, run_id: str, seq: int) -> Fact:
        self.log_reads += 1
        return await super().read_fact(run_id, seq)


class Remembering:
    """A run memory for the tests: keeps every write (``kept``: each with what was built for it),
    and shows the runtime what the test says this process showed last (``shown``, by run id: a
    call hands it in, see :func:`hand_in`). ``building``: what a write builds while it flushes
    (none by default: the write is then not watched)."""

    def __init__(self, building: Callable[[Written], object] | None = None) -> None:
        self.building = building
        self.builds = building is not None
        self.kept: list[tuple[Written, object]] = []
        self.shown: dict[str, Written | RunSnapshot] = {}

    def last(self, run_id: str) -> Written | RunSnapshot | None:
        return self.shown.get(run_id)

    def build(self, written: Written) -> object:
        return None if self.building is None else self.building(written)

    def keep(self, written: Written, built: object) -> None:
        self.kept.append((written, built))

    def prompt_read(self, run_id: str, task_id: str) -> PromptRead | None:
        return None


def remembering(store: MemoryStore | None = None, **kwargs: object) -> Runtime:
    memory = kwargs.pop("memory", None) or Remembering()
    return make_runtime(store, memory=cast(Remembering, memory), **kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Call:
    """A host call's result: the run's head after it, and what it wrote (None: a repeat)."""

    head: RunHead
    written: Written | None

    @property
    def snapshot(self) -> RunSnapshot | None:
        return None if self.written is None else self.written.snapshot


async def _called(runtime: Runtime, run_id: str, shown: Call | RunSnapshot | None, call: object) -> Call:
    memory = cast(Remembering, runtime.memory)
    memory.shown.pop(run_id, None)
    if isinstance(shown, Call) and shown.written is not None:
        memory.shown[run_id] = shown.written
    elif isinstance(shown, RunSnapshot):
        memory.shown[run_id] = shown
    kept = len(memory.kept)
    head = await call  # type: ignore[misc]
    return Call(head, memory.kept[-1][0] if len(memory.kept) > kept else None)


async def start(runtime: Runtime, request: StartRequest) -> tuple[Call, bool]:
    memory = cast(Remembering, runtime.memory)
    kept = len(memory.kept)
    head, created = await runtime.start(request)
    return Call(head, memory.kept[-1][0] if len(memory.kept) > kept else None), created


async def hand_in(
    runtime: Runtime, run_id: str, task_id: str, output: str, shown: Call | RunSnapshot | None = None
) -> Call:
    """``submit_host_output`` by a caller that showed ``shown`` last (None: nothing)."""
    return await _called(runtime, run_id, shown, runtime.submit_host_output(run_id, task_id, output))


async def decide(
    runtime: Runtime,
    run_id: str,
    decision: Literal["approve", "reject", "revise"],
    gate_id: str,
    comment: str | None = None,
    shown: Call | RunSnapshot | None = None,
) -> Call:
    return await _called(runtime, run_id, shown, runtime.approve(run_id, decision, gate_id, comment))


async def host_plays(
    runtime: Runtime, answered: Call, output: object = None, decide_as: str = "approve"
) -> tuple[Call, list[Call]]:
    """Answer every host task and gate from the answers alone (no drive, no status read): the
    snapshot of each answer is what the next call shows. Returns the last answer and all."""
    answers = [answered]
    for _ in range(60):
        head, snapshot = answered.head, answered.snapshot
        if head.status.is_terminal:
            return answered, answers
        assert snapshot is not None
        if snapshot.host_tasks:
            task_id = snapshot.host_tasks[0].task_id
            text = output(task_id) if callable(output) else f"the work of {task_id}"
            answered = await hand_in(runtime, head.run_id, task_id, text, snapshot)
        else:
            gate = next(g for g in head.gates if g.status == "requested")
            answered = await decide(runtime, head.run_id, decide_as, gate.gate_id, shown=snapshot)  # type: ignore[arg-type]
        answers.append(answered)
    raise AssertionError("the run did not end")


async def test_an_inline_run_ends_with_one_write_per_answer_and_no_lease_nor_drive() -> None:
    store = CountingStore()
    runtime = remembering(store)
    answered, created = await start(
        runtime,
        StartRequest("Build it", chain=("architect", "engineer", "reviewer"), approve_before=("engineer",)),
    )
    assert created and answered.head.status == RunStatus.AWAITING_HOST and answered.head.version == 1
    final, answers = await host_plays(runtime, answered)
    assert final.head.status == RunStatus.COMPLETED
    # created (with the architect's task), architect's answer (with the gate's request), the
    # decision (with the engineer's task), the engineer's answer (with the reviewer's task), the
    # reviewer's answer (with the run's end): five writes, each call one.
    assert store.writes == len(answers) == final.head.version == 5
    assert store.claims == 0
    facts = await store.read_facts(final.head.run_id)
    assert [f.type for f in facts] == [
        "run_created",
        "host_task_prepared",
        "host_output_submitted",
        "task_completed",
        "approval_requested",
        "approval_decided",
        "host_task_prepared",
        "host_output_submitted",
        "task_completed",
        "host_task_prepared",
        "host_output_submitted",
        "task_completed",
        "run_finished",
    ]


async def test_an_answer_reads_nothing_but_the_head_when_handed_the_snapshot_it_showed() -> None:
    store = CountingStore()
    runtime = remembering(store)
    answered, _ = await start(runtime, StartRequest("Build it", chain=("architect", "engineer", "reviewer")))
    reads = store.log_reads
    final, _ = await host_plays(runtime, answered)
    assert final.head.status == RunStatus.COMPLETED
    assert store.log_reads == reads == 0


async def test_the_prompt_handed_out_is_the_one_the_record_materializes() -> None:
    store = MemoryStore()
    runtime = remembering(store)
    answered, _ = await start(runtime, StartRequest("Build it", chain=("architect", "engineer", "reviewer")))
    for _ in range(3):
        head, snapshot = answered.head, answered.snapshot
        assert snapshot is not None and snapshot.host_task is not None
        task_id = snapshot.host_task.task_id
        recorded = await read_prompt(store, head, task_id)
        assert snapshot.host_task == recorded
        prepared = [
            f
            for f in await store.read_facts(head.run_id)
            if isinstance(f, HostTaskPrepared) and f.task_id == task_id
        ]
        assert [f.prompt_sha256 for f in prepared] == [recorded.sha256]
        answered = await hand_in(runtime, head.run_id, task_id, f"the work of {task_id}", snapshot)


async def test_every_answers_snapshot_is_the_one_a_read_of_the_log_gives() -> None:
    """Linear with gates and a revise, a routed loop, and a parallel fan-out/fan-in."""
    cases = [
        (
            remembering(),
            StartRequest("Build it", chain=("architect", "engineer"), approve_before=("engineer",)),
            None,
        ),
        (remembering(catalog=ROUTED_CATALOG), StartRequest("Build it", chain="review-loop"), "review"),
        (remembering(catalog=PARALLEL_CATALOG), StartRequest("Adopt X?", chain="fan-gated"), None),
        (remembering(), StartRequest("Adopt X?", chain="research"), None),
    ]
    verdicts = {"reviewer": "revise", "reviewer~2": "approve"}
    for runtime, request, kind in cases:
        answered, _ = await start(runtime, request)
        output = answer_for(verdicts) if kind == "review" else None
        final, answers = await host_plays(runtime, answered, output)
        assert final.head.status == RunStatus.COMPLETED, (request.chain, final.head.status)
        for each in answers:
            assert each.snapshot is not None
            assert each.snapshot == await read_snapshot(runtime.store, each.head), (
                request.chain,
                each.head.version,
            )
        # A snapshot shown earlier catches up with the facts written since (one read of those).
        first = answers[0].snapshot
        assert first is not None
        assert await runtime.snapshot(final.head.run_id) == await read_snapshot(runtime.store, final.head)


async def test_a_revise_prepares_the_revised_step_in_the_decisions_write() -> None:
    runtime = remembering()
    answered, _ = await start(
        runtime, StartRequest("Build it", chain=("architect", "engineer"), approve_before=("engineer",))
    )
    assert answered.snapshot is not None
    answered = await hand_in(runtime, answered.head.run_id, "architect", "a design", answered.snapshot)
    before = answered.head.version
    answered = await decide(
        runtime, answered.head.run_id, "revise", "before:engineer", "more detail", answered.snapshot
    )
    assert answered.head.version == before + 1
    assert answered.snapshot is not None and answered.snapshot.host_task is not None
    assert (
        answered.snapshot.host_task.task_id == "architect~2"
        and "more detail" in answered.snapshot.host_task.user
    )


async def test_an_answer_needs_no_lease_and_a_lease_holders_stale_write_is_refused() -> None:
    """A drive may hold the run's lease (a run with work elsewhere): the host's answer is fenced by
    the version alone, and the holder's next write, decided on the older head, is refused; it
    reads the run again."""
    store = MemoryStore()
    runtime = remembering(store)
    answered, _ = await start(runtime, StartRequest("Build it", chain=("architect", "engineer")))
    held = await store.claim_lease(answered.head.run_id, "a-drive", 60, runtime.clock.now())
    assert held is not None
    stale = answered.head
    answered = await hand_in(runtime, stale.run_id, "architect", "a design", answered.snapshot)
    assert answered.head.task("engineer").status == TaskStatus.AWAITING_HOST
    prepared = HostTaskPrepared(
        seq=stale.last_seq + 1,
        at=runtime.clock.now(),
        task_id="architect",
        attempt=2,
        executor="inline:host",
        prompt_sha256="0" * 64,
    )
    try:
        await store.append(
            stale.run_id,
            stale.version,
            [prepared],
            evolve(stale, {"version": stale.version + 1, "last_seq": stale.last_seq + 1}),
            lease=held,
        )
    except (VersionConflict, LeaseLost) as exc:
        assert isinstance(exc, VersionConflict)
    else:
        raise AssertionError("a write on a stale version went through")
    # The lease still holds: the answer did not take it, the holder goes on (re-reading).
    assert await store.renew_lease(held, 60, runtime.clock.now())


def created_with_time_limit(
    clock: ManualClock, chain_name: str | tuple[str, ...], request: str
) -> RunCreated:
    """The ``run_created`` fact of an inline run of ``chain_name`` whose tasks have 10 s each."""
    runtime = remembering()
    chain = with_task_timeout(runtime.catalog.resolve(chain_name, ()), 10)
    return RunCreated(
        seq=1,
        at=clock.now(),
        run_id="run-x",
        request=request,
        chain=chain,
        chain_hash=chain.content_hash(),
        contract=runtime.resolve_contract(StartRequest(request, chain=chain_name), chain),
        request_hash="h",
        format=2,
    )


def test_a_running_task_is_left_to_the_lease_holder() -> None:
    """In a parallel run, a branch whose attempt is ``running`` (in flight in some drive, or an
    orphan: the record cannot tell) is the lease holder's: what follows from an answer on another
    branch is recorded, the running branch's decisions (here: fail it, past its time limit) are
    not."""
    clock = ManualClock()
    created = created_with_time_limit(clock, "research", "Adopt X?")
    head = apply(None, created)
    busy = RESEARCHERS[0]
    attempt = AttemptRecord(number=1, executor="agent:x", started_at=clock.now())
    tasks = tuple(
        evolve(t, {"status": TaskStatus.RUNNING, "attempts": (attempt,), "started_at": clock.now()})
        if t.task_id == busy
        else t
        for t in head.tasks
    )
    head = evolve(head, {"tasks": tasks})
    clock.advance(60)
    actions = next_actions(head, clock.now())
    assert any(isinstance(a, FailTask) and a.task_id == busy for a in actions), actions
    follow = follow_up(head, [created], clock.now(), {})
    prepared = [f.task_id for f in follow.facts if isinstance(f, HostTaskPrepared)]
    assert prepared == list(RESEARCHERS[1:])
    assert all(getattr(f, "task_id", None) != busy for f in follow.facts[1:])
    assert follow.head.task(busy).status == TaskStatus.RUNNING


async def test_an_answer_written_on_a_stale_head_is_decided_again_on_the_run_as_read() -> None:
    """A caller's last answer is written on without reading the run (the compare-and-swap checks
    it): when another caller moved the run meanwhile, the write is refused, the run read and the
    answer decided again; a repeat answers the run as it is, not as the caller last saw it."""
    store = CountingStore()
    runtime = remembering(store)
    first, _ = await start(runtime, StartRequest("Adopt X?", chain="research"))
    sources, practice, critique = RESEARCHERS
    mine = await hand_in(runtime, first.head.run_id, sources, "s", first)
    # Another caller (another process, a client without the answer) answers a sibling meanwhile.
    theirs = await hand_in(runtime, first.head.run_id, practice, "p")
    assert theirs.head.version == mine.head.version + 1
    last = await hand_in(runtime, first.head.run_id, critique, "c", mine)
    assert last.head.version == theirs.head.version + 1
    assert last.head.task("writer").status == TaskStatus.AWAITING_HOST
    assert last.snapshot == await read_snapshot(store, last.head)
    facts = await store.read_facts(first.head.run_id)
    assert sorted(f.task_id for f in facts if f.type == "task_completed") == sorted(RESEARCHERS)
    # A repeat with the stale answer writes nothing and answers the run as it is now.
    writes = store.writes
    again = await hand_in(runtime, first.head.run_id, sources, "s", mine)
    assert store.writes == writes and again.head == last.head


class ElsewhereStore(CountingStore):
    """A memory store whose writes are made elsewhere, as a database server's are: it tells
    ``flushing`` once the statement is sent, and notes whether a write was in flight when the
    call's ``meanwhile`` ran."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = False

    async def append(
        self,
        run_id: str,
        expected_version: int,
        facts: Sequence[Fact],
        head: RunHead,
        lease: Lease | None = None,
        *,
        flushing: Callable[[], None] | None = None,
    ) -> RunHead:
        self.in_flight = True
        try:
            if flushing is not None:
                flushing()  # the statement is sent
            await anyio.sleep(0.01)  # the database's round trip
            return await super().append(run_id, expected_version, facts, head, lease)
        finally:
            self.in_flight = False


async def test_an_answer_is_built_while_its_write_is_in_flight_on_a_store_that_writes_elsewhere() -> None:
    store = ElsewhereStore()
    built: list[tuple[Written, bool]] = []

    def build(early: Written) -> object:
        built.append((early, store.in_flight))
        return early.snapshot  # built now, while the write is in flight

    memory = Remembering(build)
    runtime = remembering(store, memory=memory)
    answered, _ = await start(runtime, StartRequest("Build it", chain=("architect", "engineer")))
    built.clear()
    task_id = answered.head.tasks[0].task_id
    after = await hand_in(runtime, answered.head.run_id, task_id, "design", answered)
    # What was built while the write was in flight is kept with that very write, as a read gives it.
    assert after.written is not None
    assert [(w is after.written, flying) for w, flying in built] == [(True, True)]
    assert memory.kept[-1] == (after.written, after.snapshot)
    assert after.snapshot == await read_snapshot(store, after.head)
    # A write refused (another caller moved the run): what was built for it is dropped.
    engineer = after.head.tasks[1].task_id
    await hand_in(runtime, answered.head.run_id, engineer, "code")  # another caller
    built.clear()
    kept = len(memory.kept)
    again = await hand_in(runtime, answered.head.run_id, engineer, "code", after)
    # The optimistic write on ``after`` was refused; read again, the call is a repeat.
    assert again.head.status == RunStatus.COMPLETED and again.written is None
    assert len(built) == 1 and len(memory.kept) == kept
    assert again.head == await store.load(answered.head.run_id)


async def test_while_writing_raises_the_writes_error_as_it_is_and_drops_an_error_of_meanwhile() -> None:
    async def refused(flushing: Callable[[], None]) -> RunHead:
        flushing()  # sent, then refused by the server
        await anyio.lowlevel.checkpoint()
        raise VersionConflict("run-x", 1, 2)

    ran: list[bool] = []
    with pytest.raises(VersionConflict):
        await while_writing(refused, lambda: ran.append(True))
    assert ran == [True]

    async def written(flushing: Callable[[], None]) -> str:
        flushing()
        await anyio.sleep(0.001)
        return "stored"

    def broken() -> None:
        raise RuntimeError("a bug in what runs meanwhile")

    assert await while_writing(written, broken) == "stored"


class FlushTellingStore(CountingStore):
    """A memory store that says when a write's flush begins (as SQLite's writer thread does
    before its ``COMMIT``), and notes which phase a write was in when the call's ``meanwhile``
    ran."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "idle"

    async def append(
        self,
        run_id: str,
        expected_version: int,
        facts: Sequence[Fact],
        head: RunHead,
        lease: Lease | None = None,
        *,
        flushing: Callable[[], None] | None = None,
    ) -> RunHead:
        self.phase = "statements"
        try:
            await anyio.sleep(0.005)  # the statements, holding the interpreter's lock
            stored = await super().append(run_id, expected_version, facts, head, lease)  # refused: raises
            self.phase = "flush"
            if flushing is not None:
                flushing()
            await anyio.sleep(0.01)  # the fsync, with the lock released
            return stored
        finally:
            self.phase = "idle"

    async def create(
        self, head: RunHead, facts: Sequence[Fact], *, flushing: Callable[[], None] | None = None
    ) -> CreateResult:
        self.phase = "statements"
        try:
            result = await super().create(head, facts)
            self.phase = "flush"
            if flushing is not None:
                flushing()  # also for a create that found its key taken, as SQLite may
            await anyio.sleep(0.01)
            return result
        finally:
            self.phase = "idle"


async def test_a_start_is_answered_with_what_was_built_while_its_create_flushed() -> None:
    store = FlushTellingStore()
    phases: list[tuple[Written, str]] = []

    def build(early: Written) -> object:
        phases.append((early, store.phase))
        return early.snapshot

    memory = Remembering(build)
    runtime = remembering(store, memory=memory)
    request = StartRequest("Build it", chain=("architect", "engineer"), idempotency_key="k1")
    answered, created = await start(runtime, request)
    assert created and [(w is answered.written, phase) for w, phase in phases] == [(True, "flush")]
    assert memory.kept == [(answered.written, answered.snapshot)]
    assert answered.snapshot == await read_snapshot(store, answered.head)
    # A repeat creates nothing: what was built meanwhile is dropped, the run found is answered.
    phases.clear()
    again, created = await start(runtime, request)
    assert not created and again.head == answered.head and again.written is None
    assert len(phases) == 1 and len(memory.kept) == 1


async def test_an_answer_is_built_while_its_write_flushes_on_a_store_that_tells_when() -> None:
    store = FlushTellingStore()
    phases: list[tuple[Written, str]] = []

    def build(early: Written) -> object:
        phases.append((early, store.phase))
        return early.snapshot

    runtime = remembering(store, memory=Remembering(build))
    answered, _ = await start(runtime, StartRequest("Build it", chain=("architect", "engineer")))
    phases.clear()
    task_id = answered.head.tasks[0].task_id
    after = await hand_in(runtime, answered.head.run_id, task_id, "design", answered)
    # Built once the flush began (never while the statements ran), for the very write kept.
    assert [(w is after.written, phase) for w, phase in phases] == [(True, "flush")]
    assert after.snapshot == await read_snapshot(store, after.head)
    # A write refused before its flush (another caller moved the run) builds nothing.
    phases.clear()
    engineer = after.head.tasks[1].task_id
    await hand_in(runtime, answered.head.run_id, engineer, "code")  # another caller
    phases.clear()
    again = await hand_in(runtime, answered.head.run_id, engineer, "code", after)
    assert phases == [] and again.head.status == RunStatus.COMPLETED


async def test_while_writing_runs_nothing_for_a_write_that_ends_before_it_is_under_way() -> None:
    async def refused(flushing: Callable[[], None]) -> RunHead:
        await anyio.lowlevel.checkpoint()
        raise VersionConflict("run-x", 1, 2)

    ran: list[bool] = []
    with pytest.raises(VersionConflict):
        await while_writing(refused, lambda: ran.append(True))
    assert ran == []

    async def never_told(flushing: Callable[[], None]) -> str:  # a store that cannot tell (memory)
        await anyio.sleep(0.001)
        return "stored"

    assert await while_writing(never_told, lambda: ran.append(True)) == "stored" and ran == []

    async def written(flushing: Callable[[], None]) -> str:
        flushing()
        await anyio.sleep(0.001)
        return "stored"

    def broken() -> None:
        ran.append(True)
        raise RuntimeError("a bug in what runs meanwhile")

    assert await while_writing(written, broken) == "stored"
    assert ran == [True]


@pytest.mark.parametrize("chain", ["default", "review-loop", ("architect", "engineer", "reviewer")])
async def test_a_follow_up_that_stops_at_a_prepared_host_task_leaves_nothing_undecided(
    chain: str | tuple[str, ...],
) -> None:
    """``follow_up`` stops deciding once it prepared a host task in a linear run with nothing due
    (``host_answers_next``): at that moment every next action is the wait for the host."""
    clock = ManualClock()
    runtime = remembering(clock=clock)
    answered, _ = await start(
        runtime, StartRequest("Build it", chain=chain, approve_before=("engineer",), task_timeout_seconds=600)
    )
    verdicts = answer_for({"reviewer": "revise", "reviewer~2": "approve"})
    final, answers = await host_plays(runtime, answered, output=verdicts)
    assert final.head.status.is_terminal
    waits = [a.head for a in answers if a.head.status == RunStatus.AWAITING_HOST]
    assert len(waits) >= 3
    for head in waits:
        assert host_answers_next(head, clock.now())
        assert all(isinstance(a, AwaitHost) for a in next_actions(head, clock.now())), head


def test_a_linear_run_awaiting_the_host_is_decided_again_when_a_time_limit_is_due() -> None:
    clock = ManualClock()
    created = created_with_time_limit(clock, ("architect", "engineer"), "Build it")
    follow = follow_up(apply(None, created), [created], clock.now(), {})
    head = follow.head
    assert [f.type for f in follow.facts] == ["run_created", "host_task_prepared"]
    assert head.status == RunStatus.AWAITING_HOST and host_answers_next(head, clock.now())
    clock.advance(11)  # the architect's time limit passed: deciding again fails the task
    assert not host_answers_next(head, clock.now())
    assert any(isinstance(a, FailTask) for a in next_actions(head, clock.now()))

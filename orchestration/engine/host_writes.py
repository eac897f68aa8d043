"""The host's path in one write: a host's output, a gate's decision or an inline start is recorded
with everything that follows from it (the task completed, a route, the next host task prepared, a
gate requested, the run's end) in ONE compare-and-swap, without a lease.

The invariant: those facts are exactly the ones a drive would have recorded, one write each, in the
same order, decided by the same pure :func:`~orchestration.core.decide.next_actions` on the head the
call holds. So a crash before the write leaves the run as it was (the host repeats its call), a
crash after it as a drive would have left it (``tests/unit/engine/test_crash_prefixes.py`` checks
every prefix). The compare-and-swap is the fence: a racing writer makes the call read and decide
again. Nothing that executes (a provider or agent attempt, a child run, a durable wait, any action
on a ``running`` task) is taken here: that is left to a lease holder, whom the write wakes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from orchestration.chains.prompts import TaskPrompt, render, upstream
from orchestration.chains.schemas import validate_output
from orchestration.core.action_facts import recorded_fact
from orchestration.core.clock import Clock
from orchestration.core.costs import HostUsage
from orchestration.core.decide import (
    PAUSING_ACTIONS,
    Action,
    FailTask,
    PrepareHostTask,
    RequestBudget,
    StartAttempt,
    StartChild,
    next_actions,
)
from orchestration.core.facts import Fact, ForkOrigin, RouteDecided, TaskCompleted, TaskFailed
from orchestration.core.fold import apply, apply_write
from orchestration.core.graph import is_parallel
from orchestration.core.inputs import Limits, check_id
from orchestration.core.models import DecisionChannel, PromptRead, RunHead, TaskState, evolve, text_hash
from orchestration.core.vocabulary import RunStatus, TaskStatus
from orchestration.engine.agent_waits import giving_up
from orchestration.engine.changes import ChangeFeed
from orchestration.engine.children import refuse_detached
from orchestration.engine.leased_run import RuntimeSettings
from orchestration.engine.reading import (
    RunSnapshot,
    awaited_calls,
    awaiting_host_task,
    read_snapshot,
    refuse_if_out_of_time,
)
from orchestration.errors import (
    Conflict,
    ConstructError,
    InvalidArgument,
    InvalidState,
    TooLarge,
    VersionConflict,
    quoted,
)
from orchestration.store import CreateResult, RunStore
from orchestration.tracing import traced_write
from orchestration.workers.host import host_output_facts, host_task_prepared
from orchestration.workers.port import TaskWorker

log = logging.getLogger("construct.runtime")
T = TypeVar("T")


class Written:
    """What a host's call wrote: the run's head after its write, the facts written, the outputs of
    the run's done tasks (the next prompts are rendered from them), the prompts of the host tasks it
    prepared (rendered once, by task id), and the run as a view shows it at that head
    (:attr:`snapshot`, made from what the call held when first asked for: nothing is read)."""

    __slots__ = ("_make", "_snapshot", "facts", "head", "outputs", "prompts")

    def __init__(
        self,
        head: RunHead,
        facts: Sequence[Fact],
        outputs: Mapping[str, str],
        prompts: Mapping[str, TaskPrompt],
        make: Callable[[], RunSnapshot],
    ) -> None:
        self.head = head
        self.facts = facts
        self.outputs = outputs
        self.prompts = prompts
        self._make: Callable[[], RunSnapshot] | None = make
        self._snapshot: RunSnapshot | None = None

    @classmethod
    def read(cls, snapshot: RunSnapshot) -> Written:
        """What a call holds of a run it read (``snapshot``), having written nothing yet."""
        return cls(snapshot.head, (), snapshot.outputs, {}, lambda: snapshot)

    @property
    def snapshot(self) -> RunSnapshot:
        if self._snapshot is None:
            assert self._make is not None
            self._snapshot, self._make = self._make(), None
        return self._snapshot


class RunMemory(Protocol):
    """What a process keeps of the runs its host's calls wrote and showed, per run version (a
    version is one committed state: what is kept of it never changes, it is only evicted). The
    runtime's host use cases consult it: the next call writes on the head it wrote last without
    reading the run first (the compare-and-swap checks it) and renders the next prompt from the
    outputs it holds. The server keeps its answers' views in it.

    ``builds``: whether :meth:`build` does anything (if not, a write is not watched for its flush)."""

    builds: bool

    def last(self, run_id: str) -> Written | RunSnapshot | None:
        """What this process showed last of ``run_id``: the last write its host's path made on it
        (the next call writes on its head without reading the run), else the newest snapshot
        kept (only the facts after it are read), else None."""
        ...

    def build(self, written: Written) -> object:
        """Called while the write of ``written`` flushes (:func:`while_writing`): build what the
        answer needs; what it returns is handed to :meth:`keep` if the write succeeds, else dropped.
        Must not record or publish anything."""
        ...

    def keep(self, written: Written, built: object) -> None:
        """The write of ``written`` succeeded: keep it as the run's last (``built``: what
        :meth:`build` returned for it, or None when it was not called)."""
        ...

    def prompt_read(self, run_id: str, task_id: str) -> PromptRead | None:
        """How much of the task's prompt, handed out in parts by this process, the host read
        (recorded with its output); None when it was handed out whole or elsewhere."""
        ...


class Forgetful:
    """A :class:`RunMemory` that keeps nothing: every call reads the run it writes."""

    builds = False

    def last(self, run_id: str) -> Written | RunSnapshot | None:
        return None

    def build(self, written: Written) -> object:
        return None

    def keep(self, written: Written, built: object) -> None:
        pass

    def prompt_read(self, run_id: str, task_id: str) -> PromptRead | None:
        return None


@dataclass(frozen=True, slots=True)
class FollowUp:
    """One write's facts with what follows from them (:func:`follow_up`): ``facts`` in order,
    ``head`` the head they fold to (the version of one write), and the prompts of the host tasks
    prepared among them, by task id."""

    facts: list[Fact]
    head: RunHead
    prompts: dict[str, TaskPrompt]


def _own_action(head: RunHead, now: datetime) -> Action | None:
    """The next action the host's call records itself, or None when what is left is a pause or
    a lease holder's (see the module docstring). The first action, in run order, that is neither
    a pause nor an attempt nor about a ``running`` task, as the fan-out picks it; a child start
    there stops the call (the drive starts children)."""
    if head.status.is_terminal:
        return None
    for action in next_actions(head, now):
        if isinstance(action, (*PAUSING_ACTIONS, StartAttempt)):
            continue
        if isinstance(action, (FailTask, RequestBudget)) and _running(head, action.task_id):
            continue
        if isinstance(action, StartChild):
            return None
        return action
    return None


def _running(head: RunHead, task_id: str) -> bool:
    return head.task(task_id).status == TaskStatus.RUNNING


def prompt_of(head: RunHead, task_id: str, outputs: Mapping[str, str]) -> TaskPrompt:
    """``task_id``'s prompts from ``outputs`` (done tasks' outputs by task id, at least those of
    its upstream tasks), as :func:`~orchestration.engine.reading.read_prompt` renders them."""
    up = upstream(head, task_id)
    return render(head, up.task, up.position, up.index, up.work, {k: outputs[k] for k in up.ids})


def follow_up(after: RunHead, facts: Sequence[Fact], now: datetime, outputs: Mapping[str, str]) -> FollowUp:
    """``facts`` (the call's own, folded into ``after``) with the facts of every action that
    follows from them and that the call records itself (:func:`_own_action`), each decided by
    :func:`~orchestration.core.decide.next_actions` on the head the facts before it fold to. Pure.
    ``outputs``: the done tasks' outputs by task id (those of ``facts`` included), for the
    prompts of the host tasks it prepares."""
    written = list(facts)
    prompts: dict[str, TaskPrompt] = {}
    while (action := _own_action(after, now)) is not None:
        if isinstance(action, PrepareHostTask):
            prompt = prompts[action.task_id] = prompt_of(after, action.task_id, outputs)
            fact: Fact | None = host_task_prepared(after, prompt, action.attempt, now)
        else:
            fact = recorded_fact(after, action, now)
        assert fact is not None, action  # _own_action returns bookkeeping actions only
        written.append(fact)
        after = apply(after, fact)
        if isinstance(action, PrepareHostTask) and host_answers_next(after, now):
            break
    return FollowUp(written, after, prompts)


def host_answers_next(head: RunHead, now: datetime) -> bool:
    """Whether nothing can follow ``head`` at ``now`` but the host's answer, known without
    deciding again: a linear run awaiting the host with no time limit or gate expiry due
    (``wake_at``). Once a host task is prepared in such a run, the decision walk meets what the
    one before it met — the same earlier tasks and gates at the same instant — and then the
    prepared task, which waits for the host; only a time that has come could make it decide
    otherwise. :func:`follow_up` stops there: one decision less per answer."""
    return (
        head.status == RunStatus.AWAITING_HOST
        and (head.wake_at is None or head.wake_at > now)
        and not is_parallel(head.chain)
    )


def extend_snapshot(
    base: RunSnapshot | None,
    facts: Sequence[Fact],
    head: RunHead,
    prompts: Mapping[str, TaskPrompt] | None = None,
    warnings: tuple[str, ...] = (),
) -> RunSnapshot:
    """The snapshot :func:`~orchestration.engine.reading.read_snapshot` reads at ``head``, made
    from ``base`` (the snapshot of an earlier head of the run; None: of no head, ``facts`` start
    with ``run_created``) and ``facts``, the run's facts after it up to ``head.last_seq``, without
    reading anything. ``prompts``: host prompts rendered already, by task id (others are
    rendered here, or kept from ``base``)."""
    detailed = None if base is None else base.head
    outputs = {} if base is None else dict(base.outputs)
    values = {} if base is None else dict(base.values)
    routes = () if base is None else base.routes
    copied = {} if base is None else dict(base.copied)
    forked_from: ForkOrigin | None = None if base is None else base.forked_from
    for fact in facts:
        if detailed is None:
            forked_from = getattr(fact, "forked_from", None)
        detailed = apply(detailed, fact, keep_history=True)
        if isinstance(fact, TaskCompleted):
            outputs[fact.task_id] = fact.output
            if fact.value is not None:
                values[fact.task_id] = fact.value
        elif isinstance(fact, RouteDecided):
            routes = (*routes, fact)
        if isinstance(fact, TaskCompleted | TaskFailed) and fact.copied_from is not None:
            copied[fact.task_id] = fact.copied_from
    assert detailed is not None and detailed.last_seq == head.last_seq, "the facts end at the head"
    shown = evolve(head, {"tasks": detailed.tasks})
    known = dict(prompts or {})
    if base is not None:
        for prompt in base.host_tasks:
            known.setdefault(prompt.task_id, prompt)
    awaiting = [t for t in shown.tasks if t.status == TaskStatus.AWAITING_HOST]
    host_tasks: tuple[TaskPrompt, ...] = ()
    if awaiting and (shown.status == RunStatus.AWAITING_HOST or is_parallel(shown.chain)):
        host_tasks = tuple(known.get(t.task_id) or prompt_of(shown, t.task_id, outputs) for t in awaiting)
    host_task = host_tasks[0] if host_tasks and shown.status == RunStatus.AWAITING_HOST else None
    return RunSnapshot(shown, outputs, host_task, warnings, values, routes, host_tasks, forked_from, copied)


class HostServices(Protocol):
    """What the host's path needs of the runtime it runs in
    (:class:`~orchestration.engine.runtime.Runtime`)."""

    store: RunStore
    memory: RunMemory
    clock: Clock
    limits: Limits
    worker: TaskWorker | None
    settings: RuntimeSettings
    warnings: tuple[str, ...]
    changes: ChangeFeed


async def while_writing(
    write: Callable[[Callable[[], None]], Coroutine[Any, Any, T]],
    meanwhile: Callable[[], object],
) -> T:
    """Run ``write(flushing)`` (a store's write, given its ``flushing`` hook), running
    ``meanwhile`` on this task once the store says the write is under way (its statement sent to
    a database server, or its flush begun: the writer waits, not on this process's interpreter
    lock, so the work costs the write nothing), then await the write. Not at all for a write that
    ends before (refused, failed, or on a store that never says). For CPU work that only the
    write's success makes useful (an answer's view built while the write commits). ``meanwhile``
    must not record or publish anything; an error in it is logged and dropped (the caller builds
    what it needed the usual way), so the write's outcome is the call's, its error raised as it
    is. A cancelled call cancels the write, as awaiting it directly would.

    An asyncio task, not an anyio task group: the stores run on asyncio (their pools and threads
    are asyncio's), and a task group costs 31 us per call here where a task costs 5 us."""
    flushing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(write(lambda: _settle(flushing)))
    try:
        task.add_done_callback(lambda _: _settle(flushing))
        await flushing
        if not task.done():
            try:
                meanwhile()
            except Exception:
                log.exception("work done while a write was under way failed; it is done again after it")
        return await task
    finally:
        if not task.done():  # cancelled meanwhile
            task.cancel()


async def record(
    services: HostServices,
    head: RunHead,
    facts: Sequence[Fact],
    new_head: RunHead | None = None,
    meanwhile: Callable[[RunHead, list[Fact]], object] | None = None,
) -> tuple[RunHead, list[Fact]]:
    """Record an external event's ``facts`` on top of ``head`` (compare-and-swap, no lease; see the
    module docstring) and tell the runtime's listeners. ``new_head``: the head ``facts`` fold to,
    when the caller has it. A write that ends the wait for remote runs of agent steps (a cancel, a
    rejection, the run failing) cancels them first and records the results with it
    (:func:`~orchestration.engine.agent_waits.giving_up`). ``meanwhile``: called with the head and
    the facts being written while the write is under way (:func:`while_writing`), if the store
    says when. Returns the stored head and the facts written."""
    with traced_write(head) as traced:
        written = await giving_up(services.worker, head, facts, services.settings.remote_cancel_seconds)
        if new_head is None or len(written) != len(facts):
            new_head = apply_write(head, written)
        stored = await _append(services, head, written, new_head, meanwhile)
        traced.recorded(written, stored)
    await services.changes.recorded(written, stored)
    return stored, written


async def _append(
    services: HostServices,
    head: RunHead,
    written: list[Fact],
    new_head: RunHead,
    meanwhile: Callable[[RunHead, list[Fact]], object] | None,
) -> RunHead:
    """The store's append of ``written`` on ``head``, with ``meanwhile`` run while it is under way
    (see :func:`record` and :func:`while_writing`)."""
    store = services.store
    if meanwhile is None:
        return await store.append(head.run_id, head.version, written, new_head)

    def write(flushing: Callable[[], None]) -> Coroutine[Any, Any, RunHead]:
        return store.append(head.run_id, head.version, written, new_head, flushing=flushing)

    return await while_writing(write, lambda: meanwhile(new_head, written))


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def snapshot_at(services: HostServices, head: RunHead, earlier: RunSnapshot | None) -> RunSnapshot:
    """The run's snapshot at ``head``: ``earlier`` (an earlier snapshot of the run, what the process
    showed last) caught up with the facts written since (one read of those alone), else read."""
    if earlier is None or earlier.head.run_id != head.run_id or earlier.head.last_seq > head.last_seq:
        return await read_snapshot(services.store, head, services.warnings)
    if earlier.head.version == head.version:
        return earlier
    after = earlier.head.last_seq
    facts = await services.store.read_facts(head.run_id, after, head.last_seq - after)
    if len(facts) != head.last_seq - after:
        return await read_snapshot(services.store, head, services.warnings)
    return extend_snapshot(earlier, facts, head, warnings=services.warnings)


async def held_at(services: HostServices, head: RunHead, shown: Written | RunSnapshot | None) -> Written:
    """What the call holds of the run at ``head`` (its outputs, its snapshot): ``shown`` when it
    is a write at this very head (nothing read), else :func:`snapshot_at` from what it shows."""
    if isinstance(shown, Written):
        if shown.head.run_id == head.run_id and shown.head.version == head.version:
            return shown
        shown = shown.snapshot
    return Written.read(await snapshot_at(services, head, shown))


async def write_with_follow_up(
    services: HostServices, head: RunHead, facts: Sequence[Fact], held: Written
) -> Written:
    """Record ``facts`` on top of ``head`` with what follows from them (:func:`follow_up`) in one
    write, and keep it in the services' memory. ``held``: what the call holds of the run at
    ``head`` (:func:`held_at`: its outputs feed the prompts). ``VersionConflict`` when ``head`` is
    no longer the run's (the caller reads it again and decides again)."""
    now = services.clock.now()
    outputs = dict(held.outputs)
    for fact in facts:
        if isinstance(fact, TaskCompleted):
            outputs[fact.task_id] = fact.output
    follow = follow_up(apply_write(head, facts), facts, now, outputs)

    def written_at(stored: RunHead, written: list[Fact]) -> Written:
        def snapshot() -> RunSnapshot:
            return extend_snapshot(held.snapshot, written, stored, follow.prompts, services.warnings)

        return Written(stored, written, outputs, follow.prompts, snapshot)

    memory = services.memory
    built: list[tuple[Written, object]] = []

    def build(writing: RunHead, written: list[Fact]) -> None:
        early = written_at(writing, written)
        built.append((early, memory.build(early)))

    meanwhile = build if memory.builds else None
    stored, written = await record(services, head, follow.facts, follow.head, meanwhile)
    # The store stores the head it is given: what was built while it flushed is that write's.
    kept, extra = built[0] if built else (written_at(stored, written), None)
    memory.keep(kept, extra)
    return kept


async def create_with_follow_up(services: HostServices, first: FollowUp) -> CreateResult:
    """Create a run from its first write ``first`` (:func:`start_with_follow_up`) and keep a run
    it created in the services' memory (built from ``first``: nothing read back), as
    :func:`write_with_follow_up` keeps its writes."""
    store = services.store
    memory = services.memory
    early = started(services, first, first.head)
    if not memory.builds:
        result = await store.create(first.head, first.facts)
        built = None
    else:
        extra: list[object] = []

        def write(flushing: Callable[[], None]) -> Coroutine[Any, Any, CreateResult]:
            return store.create(first.head, first.facts, flushing=flushing)

        result = await while_writing(write, lambda: extra.append(memory.build(early)))
        built = extra[0] if extra else None
    if result.created:
        memory.keep(early, built)
    return result


def started(services: HostServices, first: FollowUp, head: RunHead) -> Written:
    """What the first write ``first`` of a run wrote, stored as ``head``."""

    def snapshot() -> RunSnapshot:
        return extend_snapshot(None, first.facts, head, first.prompts, services.warnings)

    return Written(head, first.facts, {}, first.prompts, snapshot)


def start_with_follow_up(services: HostServices, created: RunHead, facts: Sequence[Fact]) -> FollowUp:
    """A new run's first write: its ``run_created`` fact (``facts``, folded into ``created``) with
    what follows at once (an inline chain's first host task prepared, a first gate requested),
    as :func:`follow_up` decides it. Pure but for the clock."""
    return follow_up(created, facts, services.clock.now(), {})


async def hand_in(
    services: HostServices,
    run_id: str,
    task_id: str,
    output: str,
    usage: HostUsage | None = None,
    detach_children: bool = False,
    *,
    by: str | None = None,
    channel: DecisionChannel | None = None,
    verified: bool = False,
) -> RunHead:
    """Record the host's ``output`` for ``task_id`` and what follows from it in one write (see
    :meth:`Runtime.submit_host_output <orchestration.engine.runtime.Runtime.submit_host_output>`
    for the rules); the run's head after it. ``by``, ``channel`` and ``verified`` (who handed it
    in) are recorded on the submission."""
    check_id("task_id", task_id, services.limits)
    check_output(output, services.limits)
    memory = services.memory
    shown = memory.last(run_id)
    held_head = shown.head if isinstance(shown, Written) else None
    while True:
        # The head this process wrote last, if it has one, is written on without reading the run
        # first: the compare-and-swap checks that it is still the run's (else VersionConflict:
        # read the run, decide again). Anything but a write decided on it (a repeat, a refusal)
        # is decided again on the run as read: it may have moved on.
        optimistic = held_head is not None
        head, held_head = held_head or await services.store.load(run_id), None
        try:
            task = task_named(head, task_id)
            if await _output_recorded(services.store, head, task, output):
                if optimistic:
                    continue
                return head
            now = services.clock.now()
            _check_takes_output(head, task, detach_children, now)
        except ConstructError:
            if optimistic:
                continue
            raise
        attempt = task.attempts[-1].number if task.attempts else 1
        schema = head.step_of(task_id).output_schema
        # An answer that does not match the step's schema is refused (InvalidOutput) and
        # nothing is recorded: the host corrects it and calls again.
        value = None if schema is None else validate_output(schema, output)
        read = memory.prompt_read(run_id, task_id)
        facts = host_output_facts(
            head, task_id, attempt, output, now, value, usage, read, by=by, channel=channel, verified=verified
        )
        held = await held_at(services, head, shown)
        try:
            return (await write_with_follow_up(services, head, facts, held)).head
        except VersionConflict:
            shown = held
            continue


def check_output(output: str, limits: Limits) -> None:
    """Refuse an output no task could take: empty, or over the size limit."""
    if not isinstance(output, str) or not output.strip():
        raise InvalidArgument("output is empty; pass the host model's answer for the task")
    if len(output) > limits.max_output_chars:
        raise TooLarge(
            f"output is {len(output)} characters; the limit is {limits.max_output_chars} "
            "(CONSTRUCT_MAX_OUTPUT_CHARS)"
        )


async def _output_recorded(store: RunStore, head: RunHead, task: TaskState, output: str) -> bool:
    """Whether ``task`` is done with ``output`` already (a repeat: nothing to record). A task
    done with a different output is a ``Conflict``; False for a task not done."""
    if task.status != TaskStatus.DONE or task.output_seq is None:
        return False
    done = await store.read_fact(head.run_id, task.output_seq)
    if isinstance(done, TaskCompleted) and done.output_sha256 == text_hash(output):
        return True
    raise Conflict(
        f"task {task.task_id} of run {head.run_id} is already done with a different output; "
        "a done task's output cannot be replaced"
    )


def _check_takes_output(head: RunHead, task: TaskState, detach_children: bool, now: datetime) -> None:
    """Refuse output for ``task`` unless the run is live, in time, and the task awaits it
    (with no live host-started children, unless ``detach_children``)."""
    if head.status.is_terminal:
        raise InvalidState(f"run {head.run_id} is {head.status.value}; it takes no more output")
    refuse_if_out_of_time(head, now)
    refuse_detached(head, task.task_id, detach_children)
    if task.status != TaskStatus.AWAITING_HOST:
        awaiting = awaiting_host_task(head)
        hint = f"the task awaiting output is {awaiting!r}" if awaiting else "no task awaits output"
        raise Conflict(
            f"task {task.task_id} of run {head.run_id} is {task.status.value}, not awaiting "
            f"output; {hint}" + awaited_calls(head)
        )


def task_named(head: RunHead, task_id: str) -> TaskState:
    """The run's task ``task_id``, or ``InvalidArgument`` naming the tasks it has."""
    try:
        return head.task(task_id)
    except KeyError:
        raise InvalidArgument(
            f"run {head.run_id} has no task {quoted(task_id)}; its tasks are: "
            f"{', '.join(t.task_id for t in head.tasks)}" + awaited_calls(head)
        ) from None


__all__ = [
    "FollowUp",
    "Forgetful",
    "HostServices",
    "RunMemory",
    "Written",
    "check_output",
    "create_with_follow_up",
    "extend_snapshot",
    "follow_up",
    "hand_in",
    "held_at",
    "host_answers_next",
    "prompt_of",
    "record",
    "snapshot_at",
    "start_with_follow_up",
    "started",
    "task_named",
    "while_writing",
    "write_with_follow_up",
]

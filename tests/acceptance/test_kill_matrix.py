"""The kill matrix (issue 5): a gated provider chain survives SIGKILL at any write and mid-call, on
every persistent store.

The chain is architect -> engineer -> reviewer with an approval gate before the engineer, run by the
server itself against the fake provider (real HTTP; it counts the calls per task). Its uninterrupted
run records ten facts in nine durable writes (the engineer's outcome and the reviewer's
``attempt_started`` are one write: see :func:`write_ends`). Two ways of killing it:

* **after each durable write in turn**: a server started with ``CONSTRUCT_FAULT_CRASH_AFTER_WRITES=N``
  SIGKILLs itself right after its N-th write; and
* **from outside, at random moments while a provider call is in flight**: the test SIGKILLs the
  server (pid file) a seeded random delay after the fake received the call it holds open.

A second server is then started on the same store and the host repeats what it was doing (every
call is idempotent: ``orchestrate_start`` with the same idempotency key, ``orchestrate_approve``,
``run_status`` with a wait). The run must end exactly as the uninterrupted run: same status, same
output per task, same decisions, the same facts in the same order except one orphaned attempt of
the task whose attempt was in progress at the kill. That task's next attempt is marked
``possible_duplicate_call``; the provider is called once per task, twice only for that task and
only when the kill caught the call in flight (an attempt killed right after ``attempt_started``
never reached the provider).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from orchestration.core.facts import AttemptFailed, AttemptStarted, Fact, TaskCompleted
from orchestration.core.fold import with_history
from orchestration.core.models import RunHead
from tests.acceptance.harness import call, pid_alive, read_log, stdio_client_for
from tests.acceptance.reliability import trial
from tests.acceptance.store_targets import BACKENDS, StoreTarget, store_target
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

TASKS = ("architect", "engineer", "reviewer")
MODEL = "claude-test-1"
#: The writes of the uninterrupted run: created, the architect's attempt started and completed, the
#: gate's request and decision, the engineer's attempt started, its outcome with the reviewer's
#: attempt started, the reviewer's outcome, finished.
WRITES = 9
#: How long the fake holds the call the random kill aims at.
CALL_SECONDS = 1.2
#: Seeds of the random kills (each picks the task and the moment): ``CONSTRUCT_RANDOM_KILL_SEEDS=1,2,...``
#: explores more of them than the three a normal run tries.
RANDOM_SEEDS = tuple(int(s) for s in os.environ.get("CONSTRUCT_RANDOM_KILL_SEEDS", "1,2,3").split(","))


def write_ends(facts: list[Fact]) -> list[int]:
    """How many facts were recorded after each durable write of a sequential provider run: one
    fact per write, except that an outcome and the ``attempt_started`` following it are one write
    (``Drive._attempt``). The references check this against the head's version (its count of
    writes)."""
    return [
        n
        for n, fact in enumerate(facts, 1)
        if not (
            isinstance(fact, TaskCompleted | AttemptFailed)
            and n < len(facts)
            and isinstance(facts[n], AttemptStarted)
        )
    ]


def answer(task: str) -> str:
    return f"{task}: the model's deterministic answer"


def scenario(slow_task: str | None = None) -> dict[str, Any]:
    replies: dict[str, Any] = {task: [{"text": answer(task)}] for task in TASKS}
    if slow_task is not None:
        replies[slow_task] = [{"text": answer(slow_task), "delay_seconds": CALL_SECONDS}]
    return replies


def start_arguments(key: str) -> dict[str, Any]:
    return {
        "request": f"Design, build and review a rate limiter ({key}).",
        "chain": list(TASKS),
        "approve_before": ["engineer"],
        "worker_backend": "provider",
        "idempotency_key": key,
    }


async def host(client: Client, key: str) -> dict[str, Any]:
    """Drive the run to its end. Restartable: every call is idempotent."""
    view = await call(client, "orchestrate_start", **start_arguments(key), wait_seconds=30)
    for _ in range(30):
        run_id, kind = view["run_id"], view["next_action"]["kind"]
        if kind == "none":
            return view
        if kind == "approve":
            gate_id = view["next_action"]["gate_id"]
            view = await call(
                client,
                "orchestrate_approve",
                run_id=run_id,
                decision="approve",
                gate_id=gate_id,
                wait_seconds=30,
            )
        else:
            view = await call(client, "run_status", run_id=run_id, wait_seconds=30)
    raise AssertionError(f"the run did not end: {view['status']}")


async def run_host(env: dict[str, str], log: Path, key: str) -> dict[str, Any] | None:
    """The host against one server process; None when the server died under it."""
    try:
        with anyio.fail_after(90):
            async with stdio_client_for(env, log) as client:
                return await host(client, key)
    except TimeoutError:
        raise
    except Exception:
        # The client sees a killed server as a closed stream or a failed call.
        return None


def server_env(target: StoreTarget, home: Path, fake: FakeProvider, **extra: str) -> dict[str, str]:
    return target.env(
        home,
        CONSTRUCT_MODEL=MODEL,
        CONSTRUCT_ANTHROPIC_BASE_URL=fake.base_url,
        ANTHROPIC_API_KEY="sk-ant-test-kill-matrix",
        # An orphan's lease expires by the time a restarted server is up.
        CONSTRUCT_LEASE_TTL_SECONDS="1",
        **extra,
    )


# ------------------------------------------------------------------------------------------------
# What "ends exactly as the uninterrupted run" means


def shape(fact: Fact) -> tuple[Any, ...]:
    """What a fact decides, without times, attempt numbers, ids and telemetry."""
    data = fact.model_dump(mode="json")
    return (
        data["type"],
        data.get("task_id"),
        data.get("gate_id"),
        data.get("decision"),
        data.get("status"),
        data.get("output"),
    )


def orphaned_attempts(facts: list[Fact]) -> list[AttemptStarted]:
    """Attempts that never ended: the next fact starts another attempt of the same task."""
    return [
        fact
        for fact, following in itertools.pairwise(facts)
        if isinstance(fact, AttemptStarted)
        and isinstance(following, AttemptStarted)
        and following.task_id == fact.task_id
    ]


def without_orphans(facts: list[Fact]) -> list[tuple[Any, ...]]:
    orphans = {id(f) for f in orphaned_attempts(facts)}
    return [shape(f) for f in facts if id(f) not in orphans]


@dataclass(frozen=True)
class Outcome:
    head: RunHead
    facts: list[Fact]

    @property
    def outputs(self) -> dict[str, str]:
        return {f.task_id: f.output for f in self.facts if isinstance(f, TaskCompleted)}

    @property
    def decisions(self) -> list[tuple[str, str]]:
        return [(f.gate_id, f.decision) for f in self.facts if f.type == "approval_decided"]

    def marked(self) -> dict[str, list[int]]:
        """Per task, the attempts marked as possible duplicate provider calls."""
        out: dict[str, list[int]] = {}
        for fact in self.facts:
            if isinstance(fact, AttemptStarted) and fact.possible_duplicate_call:
                out.setdefault(fact.task_id, []).append(fact.attempt)
        return out


async def only_run(target: StoreTarget) -> Outcome:
    runs = await target.runs()
    # One run: a repeated start with the same idempotency key must not have made a second one.
    assert len(runs) == 1, [head.run_id for head, _ in runs]
    head, facts = runs[0]
    return Outcome(head, facts)


def assert_same_as_reference(got: Outcome, reference: Outcome, in_flight: str | None) -> None:
    """``in_flight``: the task whose attempt the kill interrupted, if any."""
    assert got.head.status == reference.head.status == "completed"
    assert got.outputs == reference.outputs
    assert got.decisions == reference.decisions
    assert without_orphans(got.facts) == without_orphans(reference.facts)
    assert [f.seq for f in got.facts] == list(range(1, len(got.facts) + 1))
    orphans = orphaned_attempts(got.facts)
    if in_flight is None:
        assert orphans == [] and got.marked() == {}
        assert got.head.version == reference.head.version
        return
    assert [(o.task_id, o.attempt) for o in orphans] == [(in_flight, 1)]
    # The next attempt says the provider may have been called twice, in the fact and in the
    # telemetry of the completion the host sees.
    assert got.marked() == {in_flight: [2]}
    completion = next(f for f in got.facts if isinstance(f, TaskCompleted) and f.task_id == in_flight)
    assert completion.attempt == 2 and completion.telemetry.possible_duplicate_call
    task = with_history(got.head, got.facts).task(in_flight)
    assert got.head.task(in_flight).attempts == (), "a finished task is settled in the stored head"
    assert [a.outcome for a in task.attempts] == ["failed", "succeeded"]
    assert task.attempts[0].error is not None and task.attempts[0].error.code == "orphaned"
    assert got.head.version == reference.head.version + 1


# ------------------------------------------------------------------------------------------------
# The uninterrupted run, once per store


@pytest.fixture(scope="module")
def references() -> dict[str, Outcome]:
    return {}


async def reference_for(backend: str, references: dict[str, Outcome], workdir: Path) -> Outcome:
    if backend not in references:
        async with store_target(backend, workdir) as target:
            with FakeProvider(scenario()) as fake:
                env = server_env(target, workdir / "reference", fake)
                view = await run_host(env, workdir / "reference.log", "reference")
                assert view is not None and view["status"] == "completed", read_log(workdir / "reference.log")
                assert fake.calls() == dict.fromkeys(TASKS, 1)
            outcome = await only_run(target)
        assert outcome.head.version == WRITES == len(write_ends(outcome.facts)), [
            f.type for f in outcome.facts
        ]
        assert len(outcome.facts) == 10
        references[backend] = outcome
    return references[backend]


# ------------------------------------------------------------------------------------------------
# SIGKILL after each durable write


@pytest.mark.parametrize("position", range(1, WRITES + 1))
@pytest.mark.parametrize("backend", BACKENDS)
async def test_sigkill_after_write_n_then_resume(
    backend: str, position: int, tmp_path: Path, references: dict[str, Outcome]
) -> None:
    reference = await reference_for(backend, references, tmp_path / "ref")
    killed_after = reference.facts[write_ends(reference.facts)[position - 1] - 1]
    # Killed right after recording attempt_started: the attempt is orphaned before its call.
    in_flight = killed_after.task_id if isinstance(killed_after, AttemptStarted) else None
    with trial(
        "kill_after_write", store=backend, position=position, write=killed_after.type, task=in_flight
    ) as t:
        async with store_target(backend, tmp_path / "store") as target:
            with FakeProvider(scenario()) as fake:
                log1, log2 = tmp_path / "server1.log", tmp_path / "server2.log"
                env1 = server_env(
                    target, tmp_path / "s1", fake, CONSTRUCT_FAULT_CRASH_AFTER_WRITES=str(position)
                )
                first = await run_host(env1, log1, "kill-matrix")
                assert first is None, f"server 1 should have died after write {position}"
                assert f"SIGKILL after write {position}" in read_log(log1)
                assert not pid_alive(int((tmp_path / "s1" / "server.pid").read_text()))

                second = await run_host(server_env(target, tmp_path / "s2", fake), log2, "kill-matrix")
                assert second is not None and second["status"] == "completed", read_log(log2)
                # The attempt killed before its call never reached the provider: once per task.
                assert fake.calls() == dict.fromkeys(TASKS, 1)
            got = await only_run(target)
        assert_same_as_reference(got, reference, in_flight)
        t.note(restarts=1, provider_calls=sum(fake.calls().values()), orphaned=in_flight is not None)


# ------------------------------------------------------------------------------------------------
# SIGKILL from outside while a provider call is in flight


async def kill_during_call(fake: FakeProvider, task: str, delay: float, pid_file: Path) -> float:
    """Wait until the fake holds ``task``'s call, wait ``delay`` more, SIGKILL the server. Returns
    how far into the call the kill landed (seconds)."""
    with anyio.fail_after(60):
        # The fake counts on its own thread; there is no event to wait on.
        while fake.calls_for(task) < 1:  # noqa: ASYNC110
            await anyio.sleep(0.005)
    seen = anyio.current_time()
    await anyio.sleep(delay)
    os.kill(int(await anyio.Path(pid_file).read_text()), signal.SIGKILL)
    return anyio.current_time() - seen


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_random_sigkill_during_a_provider_call(
    backend: str, seed: int, tmp_path: Path, references: dict[str, Outcome]
) -> None:
    reference = await reference_for(backend, references, tmp_path / "ref")
    rng = random.Random(f"{backend}:{seed}")
    task = rng.choice(TASKS)
    # Well inside the call the fake holds open: the kill lands while the call is in flight.
    delay = round(rng.uniform(0.1, 0.8) * CALL_SECONDS, 3)
    with trial("random_kill", store=backend, seed=seed, task=task, delay_seconds=delay) as t:
        async with store_target(backend, tmp_path / "store") as target:
            with FakeProvider(scenario(slow_task=task)) as fake:
                log1, log2 = tmp_path / "server1.log", tmp_path / "server2.log"
                env1 = server_env(target, tmp_path / "s1", fake)
                landed: list[float] = []
                async with anyio.create_task_group() as tg:

                    async def killer() -> None:
                        pid_file = tmp_path / "s1" / "server.pid"
                        landed.append(await kill_during_call(fake, task, delay, pid_file))

                    tg.start_soon(killer)
                    first = await run_host(env1, log1, "random-kill")
                    # A server that ended any other way leaves the killer waiting: stop it.
                    tg.cancel_scope.cancel()
                assert first is None, "server 1 finished before the kill"
                assert landed and landed[0] < CALL_SECONDS, landed

                second = await run_host(server_env(target, tmp_path / "s2", fake), log2, "random-kill")
                assert second is not None and second["status"] == "completed", read_log(log2)
                # The interrupted call reached the provider; the retry is the second call.
                assert fake.calls() == {t_: 2 if t_ == task else 1 for t_ in TASKS}
            got = await only_run(target)
        assert_same_as_reference(got, reference, task)
        t.note(
            restarts=1, provider_calls=sum(fake.calls().values()), kill_into_call_seconds=round(landed[0], 3)
        )

"""The crash matrix on ``review-loop`` (issue 10): a looping provider run survives SIGKILL after each
of its durable writes, on every persistent store, and routes exactly as the uninterrupted run.

The server runs architect -> engineer -> reviewer against the fake provider (real HTTP), which
answers *by task instance* (the prompt of a later visit states its task id): the first reviewer
says ``revise`` and ``reviewer~2`` says ``approve``. So every kill point is deterministic, however
many calls were made before it. The uninterrupted run records 13 facts: run_created; attempt_started
and task_completed for architect, engineer, reviewer, engineer~2 and reviewer~2; and two
route_decided facts (reviewer -> engineer~2, reviewer~2 -> end, which completes the run). They take
10 writes: an outcome followed by the next ``attempt_started`` is one write (see
:func:`~tests.acceptance.test_kill_matrix.write_ends`).

A server started with ``CONSTRUCT_FAULT_CRASH_AFTER_WRITES=N`` SIGKILLs itself right after its
N-th write; a second server on the same store finishes the run while the host repeats what it was
doing. The run must end as the reference did: the same facts in the same order (the same routes,
to the same task instances, from the same output facts), except one orphaned attempt when the kill
came right after ``attempt_started`` (retried, marked as a possible duplicate call); and the
provider is called once per task instance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from orchestration.core.facts import AttemptStarted, Fact, RouteDecided, TaskCompleted
from tests.acceptance.harness import call, pid_alive, read_log, stdio_client_for
from tests.acceptance.store_targets import BACKENDS, StoreTarget, store_target
from tests.acceptance.test_kill_matrix import Outcome, only_run, orphaned_attempts, server_env, write_ends
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

INSTANCES = ("architect", "engineer", "reviewer", "engineer~2", "reviewer~2")
FACTS = 13
WRITES = 10


def scenario() -> dict[str, Any]:
    return {
        "architect": [{"text": "Design: a token bucket per client."}],
        "engineer": [{"text": "Code v1."}],
        "reviewer": [{"text": '{"verdict": "revise", "notes": "Handle clock skew."}'}],
        "engineer~2": [{"text": "Code v2, skew handled."}],
        "reviewer~2": [{"text": '{"verdict": "approve", "notes": "Good."}'}],
    }


async def host(client: Client, key: str) -> dict[str, Any]:
    """Drive the run to its end. Restartable: every call is idempotent."""
    view = await call(
        client,
        "orchestrate_start",
        request="Build a rate limiter.",
        chain="review-loop",
        worker_backend="provider",
        idempotency_key=key,
        wait_seconds=30,
    )
    for _ in range(30):
        if view["next_action"]["kind"] == "none":
            return view
        view = await call(client, "run_status", run_id=view["run_id"], wait_seconds=30)
    raise AssertionError(f"the run did not end: {view['status']}")


async def run_host(env: dict[str, str], log: Path, key: str) -> dict[str, Any] | None:
    try:
        with anyio.fail_after(90):
            async with stdio_client_for(env, log) as client:
                return await host(client, key)
    except TimeoutError:
        raise
    except Exception:
        return None


def shape(fact: Fact) -> tuple[Any, ...]:
    """What a fact decides: without times, attempt numbers, sequence numbers and telemetry, with
    every routing field but the output fact's number (checked apart: an orphan shifts it)."""
    data = fact.model_dump(mode="json")
    route = (
        (fact.route_on, fact.value, fact.target, fact.applied, fact.next_task_id)
        if isinstance(fact, RouteDecided)
        else None
    )
    return (data["type"], data.get("task_id"), data.get("output"), data.get("value"), route)


def without_orphans(facts: list[Fact]) -> list[tuple[Any, ...]]:
    orphans = {id(f) for f in orphaned_attempts(facts)}
    return [shape(f) for f in facts if id(f) not in orphans]


def assert_routes_as(got: Outcome, reference: Outcome, orphaned: str | None) -> None:
    assert got.head.status == reference.head.status == "completed"
    assert [t.task_id for t in got.head.tasks] == list(INSTANCES)
    assert got.outputs == reference.outputs
    routes = [
        (f.task_id, f.value, f.applied, f.next_task_id) for f in got.facts if isinstance(f, RouteDecided)
    ]
    assert routes == [
        ("reviewer", "revise", "engineer", "engineer~2"),
        ("reviewer~2", "approve", "end", None),
    ]
    # Each route names the output fact it routed on, in this run's log.
    for route in (f for f in got.facts if isinstance(f, RouteDecided)):
        output = got.facts[route.output_seq - 1]
        assert isinstance(output, TaskCompleted) and output.task_id == route.task_id
    if orphaned is None:
        # Same facts, same sequence numbers: each route names the same output fact.
        assert [shape(f) for f in got.facts] == [shape(f) for f in reference.facts]
        assert [f.output_seq for f in got.facts if isinstance(f, RouteDecided)] == [
            f.output_seq for f in reference.facts if isinstance(f, RouteDecided)
        ]
        assert got.marked() == {} and got.head.version == reference.head.version
        return
    assert without_orphans(got.facts) == without_orphans(reference.facts)
    assert [(o.task_id, o.attempt) for o in orphaned_attempts(got.facts)] == [(orphaned, 1)]
    assert got.marked() == {orphaned: [2]}


@pytest.fixture(scope="module")
def references() -> dict[str, Outcome]:
    return {}


async def reference_for(backend: str, references: dict[str, Outcome], workdir: Path) -> Outcome:
    if backend not in references:
        async with store_target(backend, workdir) as target:
            with FakeProvider(scenario()) as fake:
                view = await run_host(
                    server_env(target, workdir / "reference", fake), workdir / "ref.log", "ref"
                )
                assert view is not None and view["status"] == "completed", read_log(workdir / "ref.log")
                assert fake.calls() == dict.fromkeys(INSTANCES, 1)
            outcome = await only_run(target)
        assert outcome.head.version == WRITES == len(write_ends(outcome.facts)), [
            f.type for f in outcome.facts
        ]
        assert len(outcome.facts) == FACTS
        references[backend] = outcome
    return references[backend]


@pytest.mark.parametrize("position", range(1, WRITES + 1))
@pytest.mark.parametrize("backend", BACKENDS)
async def test_review_loop_sigkill_after_write_n_then_resume(
    backend: str, position: int, tmp_path: Path, references: dict[str, Outcome]
) -> None:
    reference = await reference_for(backend, references, tmp_path / "ref")
    killed_after = reference.facts[write_ends(reference.facts)[position - 1] - 1]
    orphaned = killed_after.task_id if isinstance(killed_after, AttemptStarted) else None
    target: StoreTarget
    async with store_target(backend, tmp_path / "store") as target:
        with FakeProvider(scenario()) as fake:
            log1, log2 = tmp_path / "server1.log", tmp_path / "server2.log"
            env1 = server_env(target, tmp_path / "s1", fake, CONSTRUCT_FAULT_CRASH_AFTER_WRITES=str(position))
            assert await run_host(env1, log1, "loop") is None, (
                f"server 1 should have died after write {position}"
            )
            assert f"SIGKILL after write {position}" in read_log(log1)
            assert not pid_alive(int((tmp_path / "s1" / "server.pid").read_text()))

            second = await run_host(server_env(target, tmp_path / "s2", fake), log2, "loop")
            assert second is not None and second["status"] == "completed", read_log(log2)
            # Scripted per instance: the restarted run asked each instance once, and got the same
            # verdicts, so it routed the same way.
            assert fake.calls() == dict.fromkeys(INSTANCES, 1)
        got = await only_run(target)
    assert_routes_as(got, reference, orphaned)

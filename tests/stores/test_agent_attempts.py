"""An agent step's attempts are bounded by the configured ``max_attempts`` (issue 22, finding 5), on
every store: ``CONSTRUCT_MAX_ATTEMPTS`` goes into the contract of an inline run as it does into a
provider run's, and the bound a run keeps is the one its contract recorded at start — a server
restarted with another setting decides the run as the one that started it would have.

The runtime is built as the server builds it (settings from the environment through
:func:`server.settings.config.load_settings`, the contract from
:func:`orchestration.workers.contract_resolver` over the provider settings); the agent is the
scripted construct-mcp of ``tests/unit/server/test_agent_runs.py``, whose ``run_status`` loses the
connection a given number of times (``agent_unreachable``, retryable) before it answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.vocabulary import RunStatus
from orchestration.engine import RuntimeSettings
from orchestration.engine.runtime import Runtime
from orchestration.store import RunStore
from orchestration.workers import Workers, contract_resolver
from server.settings.config import load_settings
from server.settings.providers import provider_settings
from tests.unit.helpers import play, sequential_ids
from tests.unit.server.test_agent_runs import FakeRemote, agent_worker, catalog

#: how many times the remote loses the connection before it answers
FAILURES = 4


def runtime_with(
    store: RunStore, home: Path, max_attempts: int, remote: FakeRemote, clock: ManualClock, owner: str
) -> Runtime:
    """A runtime whose server was started with ``CONSTRUCT_MAX_ATTEMPTS=max_attempts``."""
    settings = load_settings(env={"CONSTRUCT_MAX_ATTEMPTS": str(max_attempts)}, home=home)
    assert settings.max_attempts == max_attempts and settings.worker_backend == "inline"
    worker = agent_worker(remote)
    worker.clock = clock  # the retry's not_before is on the runtime's clock
    return Runtime(
        store,
        catalog(),
        clock=clock,
        new_id=sequential_ids(),
        resolve_contract=contract_resolver(settings.worker_backend, provider_settings(settings)),
        worker=Workers(None, worker),
        settings=RuntimeSettings(owner=owner, lease_ttl_seconds=30, cancel_poll_seconds=0.01),
    )


def failing_remote() -> FakeRemote:
    remote = FakeRemote(polls=1)
    remote.fail_polls = FAILURES
    return remote


@pytest.mark.parametrize(
    ("configured", "status", "attempts"), [(5, RunStatus.COMPLETED, 5), (2, RunStatus.FAILED, 2)]
)
async def test_an_agent_step_takes_the_configured_max_attempts(
    store: RunStore, tmp_path: Path, configured: int, status: RunStatus, attempts: int
) -> None:
    remote, clock = failing_remote(), ManualClock()
    runtime = runtime_with(store, tmp_path, configured, remote, clock, "p1")
    head, _ = await runtime.start(StartRequest(request="Build a cache", chain="delegated"))
    done = await play(runtime, head.run_id)
    snap = await runtime.snapshot(head.run_id)
    review = snap.head.task("review")  # the settled head keeps no attempts: the snapshot's fold does
    assert (done.status, len(review.attempts)) == (status, attempts), done.error
    assert done.contract.worker_backend == "inline" and done.contract.max_attempts == configured
    failed = review.attempts if status == RunStatus.FAILED else review.attempts[:-1]
    assert [a.error.code if a.error else None for a in failed] == ["agent_unreachable"] * len(failed)
    # every attempt after the first followed the one remote run the first started
    assert [a.follows for a in review.attempts] == [None] + [1] * (attempts - 1)
    assert remote.starts() == 1
    if status == RunStatus.COMPLETED:
        assert snap.outputs["review"] == "remote verdict"
    else:
        assert done.error is not None and done.error.code == "agent_unreachable", done.error
        assert f"attempt {configured} of {configured} failed" in done.error.message


@pytest.mark.parametrize(
    ("started_with", "driven_with", "status", "attempts"),
    [(5, 2, RunStatus.COMPLETED, 5), (2, 5, RunStatus.FAILED, 2)],
)
async def test_a_restarted_server_keeps_the_bound_the_run_recorded(
    store: RunStore, tmp_path: Path, started_with: int, driven_with: int, status: RunStatus, attempts: int
) -> None:
    """The run is started by a server with one setting and driven to its end by another process
    with a different one: the attempts follow the contract recorded at start."""
    remote, clock = failing_remote(), ManualClock()
    first = runtime_with(store, tmp_path, started_with, remote, clock, "p1")
    head, _ = await first.start(StartRequest(request="Build a cache", chain="delegated"))
    await first.drive(head.run_id)  # the first task is the host's: the run waits for it
    clock.advance(60)
    second = runtime_with(store, tmp_path, driven_with, remote, clock, "p2")
    done = await play(second, head.run_id)
    review = (await second.snapshot(head.run_id)).head.task("review")
    assert (done.status, len(review.attempts)) == (status, attempts), done.error
    assert done.contract.max_attempts == started_with
    assert remote.starts() == 1

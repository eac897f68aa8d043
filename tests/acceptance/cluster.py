"""Several ``construct-mcp serve`` processes on one store, one fake provider process, and the checks
the scale-out and store-fault tests share (also used by ``bench/scale_out.py`` and ``bench/scale.py``).

* :func:`fake_provider_process` runs ``python -m tests.fakes.fake_provider`` as its own process (the
  servers' 600 model calls then do not compete with the test's event loop), with a scenario file;
  :meth:`FakeProcess.calls` reads its per-key counters over HTTP, :meth:`FakeProcess.stats` the
  requests in flight and when each key was first called.
* :func:`server` starts ``construct-mcp serve --transport streamable-http`` on a free port with the
  environment a :class:`~tests.acceptance.store_targets.StoreTarget` gives (store URL, fallback
  off), the provider backend pointed at the fake, and its own home (pid file, log).
* :func:`start_runs` spreads ``orchestrate_start`` calls over the servers through their MCP tools;
  :func:`check_runs` asserts what every run must show afterwards.

Runs are named by a ``[run:NAME]`` marker in their request, which the fake provider uses to count
calls per run and task (``NAME/architect``), and by the idempotency key ``NAME``.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from anyio.abc import Process
from mcp import Client

from orchestration.core.facts import AttemptStarted, Fact, TaskCompleted
from orchestration.core.models import RunHead
from orchestration.core.vocabulary import RunStatus
from tests.acceptance.harness import REPO, SERVER_COMMAND, ToolCaller, call, free_port, read_log
from tests.acceptance.store_targets import StoreTarget

TASKS = ("architect", "engineer", "reviewer")
MODEL = "claude-test-1"
API_KEY = "sk-ant-test-scale-out"


# ------------------------------------------------------------------------------------------------
# The fake provider, as a process


@dataclass(frozen=True)
class FakeStats:
    #: requests being answered now, and the most at once so far
    in_flight: int
    peak_in_flight: int
    #: task key -> when it was first called (``time.time()`` of the fake's machine)
    first_at: dict[str, float]


@dataclass
class FakeProcess:
    base_url: str
    process: Process

    async def _get(self, path: str) -> Any:
        async with httpx2.AsyncClient(base_url=self.base_url) as http:
            response = await http.get(path)
            response.raise_for_status()
            return response.json()

    async def calls(self) -> dict[str, int]:
        counted: dict[str, int] = await self._get("/_calls")
        return counted

    async def stats(self) -> FakeStats:
        body = await self._get("/_stats")
        return FakeStats(int(body["in_flight"]), int(body["peak_in_flight"]), dict(body["first_at"]))


@asynccontextmanager
async def fake_provider_process(scenario: Mapping[str, Any], workdir: Path) -> AsyncIterator[FakeProcess]:
    """The fake provider on a free port in a process of its own; stopped on exit."""
    await anyio.Path(workdir).mkdir(parents=True, exist_ok=True)
    scenario_file = workdir / "scenario.json"
    await anyio.Path(scenario_file).write_text(json.dumps(scenario))
    log_path = workdir / "fake_provider.log"
    with log_path.open("wb") as errlog:
        process = await anyio.open_process(
            [
                sys.executable,
                "-m",
                "tests.fakes.fake_provider",
                "--port",
                "0",
                "--scenario-file",
                str(scenario_file),
            ],
            cwd=str(REPO),
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stderr=errlog,
        )
        try:
            assert process.stdout is not None
            with anyio.fail_after(30):
                first = b""
                while not first.endswith(b"\n"):
                    first += await process.stdout.receive(64)
            port = int(first.splitlines()[0])
            yield FakeProcess(f"http://127.0.0.1:{port}", process)
        finally:
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
            await process.aclose()


# ------------------------------------------------------------------------------------------------
# Server processes


@dataclass
class Server:
    name: str
    home: Path
    port: int
    process: Process
    env: dict[str, str] = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def log_path(self) -> Path:
        return self.home / "server.log"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return read_log(self.log_path)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no lease released, nothing flushed."""
        os.kill(self.pid, signal.SIGKILL)


def server_env(
    target: StoreTarget,
    home: Path,
    fake: FakeProcess,
    extra: Mapping[str, str] | None = None,
    *,
    concurrency: int = 8,
) -> dict[str, str]:
    """A provider-backend server on ``target``, calling ``fake``; ``extra`` overrides anything."""
    home.mkdir(parents=True, exist_ok=True)
    # The provider worker's own limit on calls in flight defaults to 4 per process: raise it with
    # the dispatcher's concurrency, or it would be the bottleneck being measured.
    (home / "construct.toml").write_text(f"[providers.anthropic]\nmax_concurrency = {concurrency * 2}\n")
    env = target.env(
        home,
        CONSTRUCT_WORKER_BACKEND="provider",
        CONSTRUCT_MODEL=MODEL,
        CONSTRUCT_ANTHROPIC_BASE_URL=fake.base_url,
        ANTHROPIC_API_KEY=API_KEY,
        CONSTRUCT_DISPATCH_CONCURRENCY=str(concurrency),
        PATH=os.environ.get("PATH", ""),
    )
    env.update(extra or {})
    return env


@asynccontextmanager
async def server(name: str, env: dict[str, str], home: Path) -> AsyncIterator[Server]:
    """``construct-mcp serve --transport streamable-http`` on a free port, once it accepts
    connections; stopped with SIGTERM on exit (SIGKILL if it does not go), unless already dead."""
    port = free_port()
    log_path = home / "server.log"
    with log_path.open("ab") as errlog:
        process = await anyio.open_process(
            [*SERVER_COMMAND, "serve", "--transport", "streamable-http", "--port", str(port)],
            env=env,
            cwd=str(REPO),
            stdout=errlog,
            stderr=errlog,
        )
        try:
            with anyio.fail_after(30):
                while True:
                    assert process.returncode is None, f"{name} exited early:\n{read_log(log_path)}"
                    try:
                        stream = await anyio.connect_tcp("127.0.0.1", port)
                    except OSError:
                        await anyio.sleep(0.05)
                        continue
                    await stream.aclose()
                    break
            yield Server(name, home, port, process, env)
        finally:
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(15):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
            await process.aclose()


@asynccontextmanager
async def servers(envs: Sequence[tuple[str, dict[str, str], Path]]) -> AsyncIterator[list[Server]]:
    """Several :func:`server` processes, started one after the other (each context owns its
    process's cancel scopes, so they are entered from this task) and stopped in reverse order."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(server(name, env, home)) for name, env, home in envs]


@asynccontextmanager
async def clients(running: Sequence[Server]) -> AsyncIterator[list[Client]]:
    """One MCP client session per server (over Streamable HTTP)."""
    async with AsyncExitStack() as stack:
        opened = [await stack.enter_async_context(Client(s.url, read_timeout_seconds=60)) for s in running]
        yield opened


# ------------------------------------------------------------------------------------------------
# Runs


def start_arguments(name: str, approve_before: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "request": f"Design, build and review a rate limiter [run:{name}].",
        "chain": list(TASKS),
        "approve_before": list(approve_before),
        "worker_backend": "provider",
        "idempotency_key": name,
        "wait_seconds": 0,
    }


async def start_runs(
    via: Sequence[ToolCaller],
    names: Sequence[str],
    *,
    parallel: int = 12,
    timings: dict[str, tuple[float, float]] | None = None,
    failures: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, str]:
    """Start one run per name, spread round-robin over the clients, ``parallel`` calls at once;
    returns name -> run id. ``timings``, when given, receives name -> (when the call was sent, when
    its answer came), as ``time.time()`` (comparable with :attr:`FakeStats.first_at`). A start that
    fails raises, unless ``failures`` is given: it then receives name -> the error, and the other
    starts go on."""
    limiter = anyio.CapacityLimiter(parallel)
    run_ids: dict[str, str] = {}

    async def start(client: ToolCaller, name: str) -> None:
        async with limiter:
            sent = time.time()
            try:
                view = await call(client, "orchestrate_start", **start_arguments(name, **extra))
            except Exception as exc:
                if failures is None:
                    raise
                failures[name] = f"{type(exc).__name__} after {time.time() - sent:.1f} s: {exc}"[:300]
                return
            if timings is not None:
                timings[name] = (sent, time.time())
            run_ids[name] = view["run_id"]

    async with anyio.create_task_group() as tg:
        for client, name in zip(itertools.cycle(via), names, strict=False):
            tg.start_soon(start, client, name)
    return run_ids


async def wait_for_runs(
    target: StoreTarget, count: int, within: float, statuses: frozenset[RunStatus] | None = None
) -> float:
    """Wait until ``count`` runs of the store are terminal (or in ``statuses``); returns when that
    was first seen (``anyio.current_time``)."""
    wanted = statuses or frozenset(s for s in RunStatus if s.is_terminal)
    async with target.opened() as store:
        with anyio.fail_after(within):
            while True:
                page = await store.list_runs(wanted, limit=500)
                if len(page.runs) >= count:
                    return anyio.current_time()
                # The servers write; the test can only look.
                await anyio.sleep(0.1)


@dataclass(frozen=True)
class RunRecord:
    name: str
    head: RunHead
    facts: list[Fact]

    def marked(self) -> list[tuple[str, int]]:
        """Attempts marked as possible duplicate provider calls: (task, attempt)."""
        return [
            (f.task_id, f.attempt)
            for f in self.facts
            if isinstance(f, AttemptStarted) and f.possible_duplicate_call
        ]


async def records(target: StoreTarget, run_ids: Mapping[str, str]) -> list[RunRecord]:
    async with target.opened() as store:
        return [
            RunRecord(name, await store.load(run_id), await store.read_facts(run_id))
            for name, run_id in run_ids.items()
        ]


def check_runs(runs: Sequence[RunRecord], calls: Mapping[str, int], *, interrupted: bool = False) -> int:
    """What every run must show: completed; sequence numbers contiguous (no fact lost); one
    ``task_completed`` per task, in chain order (none written twice); the provider called once per
    task. With ``interrupted`` (a process was killed, or a call cancelled), a task may have been
    called twice, and then the second attempt is marked ``possible_duplicate_call``. Returns the
    number of tasks called twice."""
    twice = 0
    for run in runs:
        seqs = [f.seq for f in run.facts]
        assert run.head.status == RunStatus.COMPLETED, (
            run.name,
            run.head.status,
            [f.type for f in run.facts],
        )
        assert seqs == list(range(1, len(seqs) + 1)), (run.name, seqs)
        completed = [f.task_id for f in run.facts if isinstance(f, TaskCompleted)]
        assert completed == list(TASKS), (run.name, completed)
        marked = {task for task, _ in run.marked()}
        for task in TASKS:
            n = calls.get(f"{run.name}/{task}", 0)
            if n == 2 and interrupted:
                # The call in flight at the interruption, retried as a marked attempt.
                assert task in marked, (run.name, task, run.marked())
                twice += 1
            else:
                assert n == 1, (run.name, task, n)
    # Nothing was called for a run that does not exist.
    names = {run.name for run in runs}
    assert {key.split("/", 1)[0] for key in calls} <= names, sorted(calls)[:5]
    return twice

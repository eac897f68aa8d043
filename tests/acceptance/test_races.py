"""Racing callers (issue 5): 20 MCP clients, spread over 2 server processes on one store, fire
``orchestrate_resume``, ``orchestrate_approve`` and ``orchestrate_cancel`` at the same runs at once.

Each round opens four runs and, behind a barrier, lets every client fire one call at each of them:

* ``resume``: a run awaiting the host's architect output; half the clients send the same output,
  the others an output of their own;
* ``approve``: a run at an approval gate; half approve, half reject;
* ``resume_cancel_approve``: a run awaiting the host; cancel, resume (same output) and approve mixed;
* ``approve_reject_cancel``: a run at a gate; approve, reject and cancel mixed.

What must hold, per run: every caller got a typed answer (a run view, or an error whose text starts
with a stable code: ``conflict``, ``invalid_state``); exactly one caller's request made each
transition, and the callers who asked for the same thing got the current state while those who
asked for something else got a ``conflict``; no task was completed or prepared twice; no fact is
duplicated (sequence numbers contiguous, no two facts for one transition); the head equals the
fold of the facts. Both servers' dispatchers then race to advance the runs too.

A second test races the provider backend: runs become runnable on both servers at once (the
approvals come through both), and the fake provider must see each task of each run exactly once,
while racing cancels from both servers stop some runs during their calls.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from orchestration.core.facts import ApprovalDecided, Fact, RunCancelled, TaskCompleted
from orchestration.core.fold import fold
from orchestration.core.models import RunHead
from tests.acceptance.harness import call, read_log, text_of
from tests.acceptance.processes import http_server
from tests.acceptance.reliability import trial
from tests.acceptance.store_targets import BACKENDS, StoreTarget, store_target
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

CLIENTS = 20
SERVERS = 2
ROUNDS = 3
#: The error codes a racing caller may get: the run moved on (invalid_state) or it asked for
#: something other than what won (conflict). A version_conflict must never reach a caller.
TYPED_CODES = {"conflict", "invalid_state"}
SAME_OUTPUT = "the architect's design (the same from every client that sends it)"


@dataclass(frozen=True)
class Answer:
    client: int
    run: str
    action: str
    argument: str | None
    ok: bool
    code: str | None
    text: str


def transition(fact: Fact) -> tuple[Any, ...]:
    """What a fact changes; two facts of one run with the same key would be a duplicated transition."""
    data = fact.model_dump()
    return (data["type"], data.get("task_id"), data.get("gate_id"), data.get("attempt"))


def check_record(head: RunHead, facts: list[Fact]) -> None:
    assert [f.seq for f in facts] == list(range(1, len(facts) + 1)), head.run_id
    keys = Counter(transition(f) for f in facts)
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1]
    # No task executed (or handed to the host) twice; attempts may repeat, each once (key above).
    for kind in ("task_completed", "host_task_prepared"):
        per_task = Counter(getattr(f, "task_id", None) for f in facts if f.type == kind)
        assert all(n == 1 for n in per_task.values()), (kind, per_task)
    terminal = [f for f in facts if f.type in ("run_cancelled", "run_finished")]
    assert len(terminal) <= 1 and (not terminal or terminal[0] is facts[-1])
    assert fold(facts).model_dump(exclude={"version"}) == head.model_dump(exclude={"version"})


async def fire(client: Client, index: int, run: str, action: str, argument: str | None) -> Answer:
    if action == "resume":
        arguments: dict[str, Any] = {"run_id": run, "task_id": "architect", "output": argument}
        tool = "orchestrate_resume"
    elif action == "approve":
        arguments = {"run_id": run, "decision": argument, "gate_id": "before:architect"}
        tool = "orchestrate_approve"
    else:
        arguments, tool = {"run_id": run, "reason": f"client {index}"}, "orchestrate_cancel"
    if tool != "orchestrate_cancel":
        arguments["wait_seconds"] = 0
    result = await client.call_tool(tool, arguments)
    text = text_of(result)
    if result.is_error:
        code = text.split(": ", 1)[0] if re.match(r"^[a-z_]+: ", text) else None
        return Answer(index, run, action, argument, False, code, text)
    # A success is a view of the run that was asked about; anything else counts as untyped.
    viewed = result.structured_content is not None and result.structured_content.get("run_id") == run
    return Answer(index, run, action, argument, viewed, None, text)


def plan(kind: str, index: int) -> tuple[str, str | None]:
    """What client ``index`` fires at a run of ``kind``."""
    if kind == "resume":
        return "resume", SAME_OUTPUT if index % 2 == 0 else f"client {index}'s own design"
    if kind == "approve":
        return "approve", "approve" if index % 2 == 0 else "reject"
    if kind == "resume_cancel_approve":
        return [("cancel", None), ("resume", SAME_OUTPUT), ("approve", "approve")][index % 3]
    return [("approve", "approve"), ("approve", "reject"), ("cancel", None)][index % 3]


async def open_runs(client: Client, tag: str) -> dict[str, str]:
    """One run per kind, each waiting for what its race is about."""
    runs: dict[str, str] = {}
    for kind in ("resume", "approve", "resume_cancel_approve", "approve_reject_cancel"):
        gated = kind.startswith("approve")
        view = await call(
            client,
            "orchestrate_start",
            request=f"race {tag} {kind}",
            chain=["architect", "engineer"],
            approve_before=["architect"] if gated else [],
        )
        assert view["next_action"]["kind"] == ("approve" if gated else "run_host_task"), view
        runs[kind] = view["run_id"]
    return runs


def judge(kind: str, answers: list[Answer], facts: list[Fact]) -> None:
    for a in answers:
        # In resume_cancel_approve the run has no gate: an approval names one it does not have.
        no_gate = kind == "resume_cancel_approve" and a.action == "approve"
        typed = {"invalid_argument"} if no_gate else TYPED_CODES
        assert a.ok or a.code in typed, f"untyped answer to {a.action}: {a.text}"
    decided = [f.decision for f in facts if isinstance(f, ApprovalDecided)]
    completed = [f.output for f in facts if isinstance(f, TaskCompleted)]
    cancels = [a for a in answers if a.action == "cancel"]
    cancelled = any(isinstance(f, RunCancelled) for f in facts)
    if kind in ("resume", "approve"):
        # Exactly one request made the transition. The same request again gets the current
        # state; a different one a conflict.
        [won] = completed if kind == "resume" else decided
        for a in answers:
            assert a.ok == (a.argument == won), a
            assert a.ok or a.code == "conflict", a
        return
    # Cancel succeeds (once recorded, repeating it returns the cancelled run) unless a rejection
    # ended the run first; then every cancel says so.
    assert all(a.ok for a in cancels) == cancelled, cancels
    if not cancelled:
        assert decided == ["reject"] and all(a.code == "invalid_state" for a in cancels), cancels
    for a in answers:
        if a.action == "approve" and decided:
            # The gate was decided before any cancel: the same decision is answered, a different
            # one is a conflict.
            assert a.ok == (a.argument == decided[0]), a
            assert a.ok or a.code == "conflict", a
        elif a.action == "approve":
            # No such gate (resume_cancel_approve), or the cancel came first.
            assert a.code == ("invalid_argument" if kind == "resume_cancel_approve" else "invalid_state"), a
        elif a.action == "resume":
            # The recorded output is answered again; after the cancel nothing else is accepted.
            assert a.ok == (completed == [SAME_OUTPUT]), a
            assert a.ok or a.code == "invalid_state", a


@asynccontextmanager
async def servers(target: StoreTarget, workdir: Path, **env: str) -> AsyncIterator[list[int]]:
    async with AsyncExitStack() as stack:
        ports = []
        for n in range(SERVERS):
            home = workdir / f"server{n}"
            _, port = await stack.enter_async_context(
                http_server(target.env(home, **env), workdir / f"s{n}.log")
            )
            ports.append(port)
        yield ports


@asynccontextmanager
async def clients(ports: list[int]) -> AsyncIterator[list[Client]]:
    """``CLIENTS`` sessions spread over the servers. They are owned by a task of their own (see
    :class:`tests.acceptance.harness.SharedClient`): a failing assertion in the test then surfaces
    as itself instead of wrapped by twenty session exits."""
    ready: asyncio.Future[list[Client]] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def own() -> None:
        try:
            async with AsyncExitStack() as stack:
                # No kept-alive connections: a pooled connection reused just as the server closes
                # it for being idle fails with a ReadError, a race of the test's HTTP client.
                limits = httpx2.Limits(max_keepalive_connections=0)
                http = await stack.enter_async_context(
                    httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300), limits=limits)
                )
                opened = []
                for n in range(CLIENTS):
                    # Spread over the servers: client n talks to server n % SERVERS.
                    url = f"http://127.0.0.1:{ports[n % len(ports)]}/mcp"
                    client = Client(streamable_http_client(url, http_client=http))
                    opened.append(await stack.enter_async_context(client))
                ready.set_result(opened)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    owner = asyncio.create_task(own())
    failed = False
    try:
        yield await asyncio.wait_for(asyncio.shield(ready), 120)
    except BaseException:
        failed = True
        raise
    finally:
        stop.set()
        if failed:
            # The test's own failure is the one to report.
            with suppress(BaseException):
                await asyncio.wait_for(owner, 60)
        else:
            await asyncio.wait_for(owner, 60)


async def race_round(cs: list[Client], runs: dict[str, str]) -> list[Answer]:
    """Every client fires its call at every run, all released at once."""
    answers: list[Answer] = []
    go = anyio.Event()

    async def one(index: int, kind: str, run: str) -> None:
        action, argument = plan(kind, index)
        await go.wait()
        answers.append(await fire(cs[index], index, run, action, argument))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for index in range(len(cs)):
                for kind, run in runs.items():
                    tg.start_soon(one, index, kind, run)
            await anyio.sleep(0.2)
            go.set()
    assert len(answers) == len(cs) * len(runs)
    return answers


@pytest.mark.parametrize("backend", BACKENDS)
async def test_racing_resume_approve_and_cancel(backend: str, tmp_path: Path) -> None:
    async with store_target(backend, tmp_path / "store") as target:
        with trial("race", store=backend, servers=SERVERS, clients=CLIENTS, rounds=ROUNDS) as t:
            calls, outcomes = 0, Counter[str]()
            async with servers(target, tmp_path) as ports, clients(ports) as cs:
                for round_ in range(ROUNDS):
                    runs = await open_runs(cs[round_ % CLIENTS], f"{backend}-{round_}")
                    answers = await race_round(cs, runs)
                    calls += len(answers)
                    outcomes.update("ok" if a.ok else str(a.code) for a in answers)
                    # Let both dispatchers race to advance what the calls left runnable.
                    await anyio.sleep(1.0)
                    async with target.opened() as store:
                        for kind, run in runs.items():
                            head, facts = await store.load(run), await store.read_facts(run)
                            check_record(head, facts)
                            judge(kind, [a for a in answers if a.run == run], facts)
            logs = "".join(read_log(tmp_path / f"s{n}.log") for n in range(SERVERS))
            assert "Traceback" not in logs and "version_conflict" not in logs
            t.note(racing_calls=calls, runs=ROUNDS * 4, answers=dict(outcomes))


# ------------------------------------------------------------------------------------------------
# The provider backend: both servers' dispatchers race for the same runnable runs

PROVIDER_RUNS = 8
CANCELLED_RUNS = 2
CHAIN = ["architect", "engineer"]
CANCELLED_CHAIN = ["researcher", "writer"]
_RUN_TAG = re.compile(r"race-run-(\d+)\b")
_STEP = re.compile(r'You are step \d+ of \d+ \(\\"([a-z]+)\\"')


def calls_per_run_task(fake: FakeProvider) -> Counter[tuple[int, str]]:
    counted: Counter[tuple[int, str]] = Counter()
    for request in fake.requests():
        body = json.dumps(request["body"])
        run, step = _RUN_TAG.search(body), _STEP.search(body)
        assert run is not None and step is not None, body[:300]
        counted[(int(run.group(1)), step.group(1))] += 1
    return counted


@pytest.mark.parametrize("backend", BACKENDS)
async def test_two_servers_run_each_provider_task_once(backend: str, tmp_path: Path) -> None:
    scenario = {
        "architect": [{"text": "the design", "delay_seconds": 0.5}],
        "engineer": [{"text": "the code", "delay_seconds": 0.2}],
        # The runs to cancel run another chain, whose first call outlasts any cancel.
        "researcher": [{"text": "never delivered", "delay_seconds": 60}],
    }
    async with store_target(backend, tmp_path / "store") as target:
        with FakeProvider(scenario) as fake, trial("provider_race", store=backend, servers=SERVERS) as t:
            env = {
                "CONSTRUCT_MODEL": "claude-test-1",
                "CONSTRUCT_ANTHROPIC_BASE_URL": fake.base_url,
                "ANTHROPIC_API_KEY": "sk-ant-test-races",
            }
            async with servers(target, tmp_path, **env) as ports, clients(ports) as cs:
                runs = []
                for n in range(PROVIDER_RUNS):
                    chain = CANCELLED_CHAIN if n < CANCELLED_RUNS else CHAIN
                    view = await call(
                        cs[n],
                        "orchestrate_start",
                        request=f"race-run-{n}: build it",
                        chain=chain,
                        approve_before=[chain[0]],
                        worker_backend="provider",
                    )
                    assert view["next_action"]["kind"] == "approve", view
                    runs.append(view["run_id"])
                cancelled = set(runs[:CANCELLED_RUNS])

                async def approve(index: int) -> None:
                    # Every run is approved through both servers at once: both wake for it.
                    run = runs[index % PROVIDER_RUNS]
                    gate = f"before:{(CANCELLED_CHAIN if run in cancelled else CHAIN)[0]}"
                    await call(
                        cs[index],
                        "orchestrate_approve",
                        run_id=run,
                        decision="approve",
                        gate_id=gate,
                        wait_seconds=0,
                    )

                async def cancel(client: Client, run: str) -> None:
                    view = await call(client, "orchestrate_cancel", run_id=run)
                    assert view["status"] == "cancelled", view

                async def cancel_during_call(n: int) -> None:
                    with anyio.fail_after(30):
                        while calls_per_run_task(fake)[(n, CANCELLED_CHAIN[0])] < 1:  # noqa: ASYNC110
                            await anyio.sleep(0.02)
                        async with anyio.create_task_group() as tg:
                            for s in range(SERVERS):
                                tg.start_soon(cancel, cs[s], runs[n])

                with anyio.fail_after(60):
                    async with anyio.create_task_group() as tg:
                        for index in range(CLIENTS):
                            tg.start_soon(approve, index)
                        for n in range(CANCELLED_RUNS):
                            tg.start_soon(cancel_during_call, n)
                views = {}
                for n, run in enumerate(runs):
                    views[run] = await call(cs[n], "run_status", run_id=run, wait_seconds=30)
            async with target.opened() as store:
                for n, run in enumerate(runs):
                    head, facts = await store.load(run), await store.read_facts(run)
                    check_record(head, facts)
                    expected = "cancelled" if run in cancelled else "completed"
                    assert head.status == expected, (n, head.status, [f.type for f in facts])
                    if run in cancelled:
                        # Cancel won over the call in flight: nothing was recorded after it.
                        assert [f.type for f in facts][-2:] == ["attempt_started", "run_cancelled"]
                        assert not any(f.type == "task_completed" for f in facts)
            counted = calls_per_run_task(fake)
            # Each task of each run called once; the cancelled runs' first call was cut short.
            expected_calls = {(n, CANCELLED_CHAIN[0]): 1 for n in range(CANCELLED_RUNS)} | {
                (n, task): 1 for n in range(CANCELLED_RUNS, PROVIDER_RUNS) for task in CHAIN
            }
            assert dict(counted) == expected_calls
            for n in range(SERVERS):
                log = read_log(tmp_path / f"s{n}.log")
                assert "Traceback" not in log
                # Which server made how many attempts: both share the work, in whatever split.
                t.note(**{f"server{n}_attempts": log.count("recorded attempt_started")})
            t.note(
                runs=PROVIDER_RUNS, cancelled_mid_call=CANCELLED_RUNS, provider_calls=sum(counted.values())
            )

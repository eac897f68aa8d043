"""``construct-mcp demo``: a chain that survives a SIGKILLed server, end to end, with no API key and
no database.

What it does, with the official MCP client (``mcp.Client``) talking to real server processes over
stdio:

1. starts server #1 (``python -m server serve``) on a fresh ``CONSTRUCT_HOME`` (a temp dir unless
   ``--home``) with the filesystem store;
2. ``orchestrate_start`` on the ``default`` chain (architect -> engineer -> reviewer) with
   ``approve_before=["engineer"]``; plays the host for the architect task with clearly labelled demo
   text (``[demo host output] ...``) — no model is called anywhere;
3. SIGKILLs server #1 while the run waits at the approval gate, in the middle of the chain. The
   server's PID is read from ``CONSTRUCT_PID_FILE``, which the server writes when it starts (a
   setting meant for tests and this demo), so the demo kills exactly the process it started;
4. starts server #2 on the same store, finds the run with ``run_status``, approves the gate, plays the
   host for the engineer and the reviewer, and the run completes;
5. reads the run's facts from the store, prints a timeline, and checks that the run completed and no
   task was executed twice: every task has exactly one ``host_task_prepared`` and one
   ``task_completed`` fact.

Exit status 0 only if those checks pass. Output goes to stdout (the demo is not an MCP channel);
the servers' logs go to ``server-1.log`` / ``server-2.log`` in the demo home.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from orchestration.core import HostTaskPrepared, RunStatus, TaskCompleted
from server.settings.config import load_settings
from server.settings.storage import open_run_store
from server.views.timeline import render_timeline
from stores import redact_url

#: How long the demo waits for a server to start (or a killed one to die).
STARTUP_TIMEOUT_SECONDS = 30.0

REQUEST = (
    "Build a small command-line todo app in Python: add a todo, list todos, mark one done. "
    "Todos must survive restarts."
)

DEMO_OUTPUTS = {
    "architect": (
        "[demo host output] Architect: a single module todo.py with an argparse CLI (add, list, done), "
        "todos kept in a JSON file under the user's home, written atomically (temp file + rename); "
        "ids are increasing integers; an unknown id is a clear error."
    ),
    "engineer": (
        "[demo host output] Engineer: implemented todo.py as designed — load() and save() around an "
        "atomic JSON write, three subcommands, exit status 1 with a message for an unknown id — plus "
        "tests for each subcommand and for a corrupt file."
    ),
    "reviewer": (
        "[demo host output] Reviewer: approve. The implementation follows the design; atomic writes "
        "protect the file; tests cover the happy paths and the error cases. Nit: document the file path."
    ),
}


class DemoFailed(Exception):
    pass


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


@asynccontextmanager
async def _server(env: dict[str, str], log_path: Path) -> AsyncIterator[Client]:
    """A ``construct-mcp serve`` subprocess over stdio, connected with the official client."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "server", "serve"], env=env)
    with log_path.open("a", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=60) as client:
            yield client


async def _call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    if result.is_error:
        text = result.content[0].text if result.content and hasattr(result.content[0], "text") else "?"
        raise DemoFailed(f"{tool} failed: {text}")
    if result.structured_content is None:
        raise DemoFailed(f"{tool} returned no structured content")
    return dict(result.structured_content)


async def _play_host(client: Client, view: dict[str, Any], out: TextIO) -> dict[str, Any]:
    """Answer host tasks until the run needs something else."""
    while view["next_action"]["kind"] == "run_host_task":
        action = view["next_action"]
        task_id = action["task_id"]
        output = DEMO_OUTPUTS.get(action["specialist"], f"[demo host output] {action['specialist']}: done.")
        _say(
            out,
            f"  host task {task_id!r}: got a {len(action['user_prompt'])}-char prompt; "
            "answering with demo text (no model is called)",
        )
        view = await _call(
            client, "orchestrate_resume", {"run_id": view["run_id"], "task_id": task_id, "output": output}
        )
    return view


async def _wait_for_pid(pid_file: Path) -> int:
    """The pid the server wrote to CONSTRUCT_PID_FILE once its lifespan started."""
    with anyio.fail_after(STARTUP_TIMEOUT_SECONDS):
        while True:
            try:
                text = (await anyio.Path(pid_file).read_text()).strip()
            except FileNotFoundError:
                text = ""
            if text:
                return int(text)
            await anyio.sleep(0.05)


async def _wait_dead(pid: int) -> None:
    with anyio.fail_after(STARTUP_TIMEOUT_SECONDS):
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            # A killed child stays a zombie until its parent reaps it; the client's transport does.
            if _is_zombie(pid):
                return
            await anyio.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def _check(env: dict[str, str], run_id: str, out: TextIO) -> bool:
    """Read the run's facts from the store and check: completed, no task executed twice."""
    settings = load_settings(env=env)
    opened = await open_run_store(settings)
    try:
        head = await opened.store.load(run_id)
        facts = await opened.store.read_facts(run_id)
    finally:
        await opened.store.close()
    _say(out, "\nTimeline (from the stored facts):")
    out.write(render_timeline(head, facts))
    prepared = Counter(f.task_id for f in facts if isinstance(f, HostTaskPrepared))
    completed = Counter(f.task_id for f in facts if isinstance(f, TaskCompleted))
    ok = head.status == RunStatus.COMPLETED
    _say(out, f"\nCheck: run status is {head.status.value}: {'ok' if ok else 'FAILED'}")
    for task in head.tasks:
        once = prepared[task.task_id] == 1 and completed[task.task_id] == 1
        ok = ok and once
        _say(
            out,
            f"Check: task {task.task_id}: prepared {prepared[task.task_id]}x, completed "
            f"{completed[task.task_id]}x: {'ok' if once else 'FAILED (executed more than once or never)'}",
        )
    return ok


async def run_demo(
    home: Path | None = None, store: str | None = None, keep: bool = False, out: TextIO | None = None
) -> int:
    """Run the demo in ``home`` (an absolute path: the servers are given it as ``CONSTRUCT_HOME``;
    default a temporary directory, removed afterwards unless ``keep``); its exit status."""
    out = out if out is not None else sys.stdout
    made_home = home is None
    demo_home = Path(tempfile.mkdtemp(prefix="construct-demo-")) if home is None else home
    demo_home.mkdir(parents=True, exist_ok=True)
    pid_file = demo_home / "server.pid"
    env = {
        "CONSTRUCT_HOME": str(demo_home),
        "CONSTRUCT_PID_FILE": str(pid_file),
        "CONSTRUCT_LOG_LEVEL": "INFO",
    }
    if store is not None:
        env["CONSTRUCT_ORCHESTRATION_STORE"] = store
    where = (
        f"store {redact_url(store)}, logs in {demo_home}"
        if store is not None
        else f"state in {demo_home} (no API key, no database)"
    )
    _say(out, f"construct-mcp demo — {where}\n")
    started: list[str] = []  # the run's id, once the demo has started it
    try:
        ok = await _demo(env, demo_home, pid_file, out, started)
    except (DemoFailed, TimeoutError, OSError) as exc:
        _say(out, f"\nDEMO FAILED: {exc}")
        ok = False
    finally:
        if made_home and not keep:
            shutil.rmtree(demo_home, ignore_errors=True)
    _say(out, "\nDemo passed." if ok else "\nDemo FAILED.")
    if not made_home or keep:
        _say(out, kept_note(demo_home, store, started[0] if started else None))
    return 0 if ok else 1


def kept_note(home: Path, store: str | None, run_id: str | None) -> str:
    """Where a kept demo left its run, and the command that shows it: the store named whatever
    the person's environment says (their ``CONSTRUCT_ORCHESTRATION_STORE`` is not the demo's)."""
    named = redact_url(store) if store is not None else "filesystem"
    command = (
        f"construct-mcp runs {'status ' + run_id if run_id else 'list'} "
        f"--store {shlex.quote(named)} --home {shlex.quote(str(home))}"
    )
    password = " (with the password in place of ***)" if store is not None and named != store else ""
    return (
        f"\nThe demo's run is kept in {home} (logs: server-1.log, server-2.log). See it with:\n"
        f"  {command}{password}"
    )


async def _demo(env: dict[str, str], home: Path, pid_file: Path, out: TextIO, started: list[str]) -> bool:
    # 1-3: server #1 starts the run, the host answers the architect, then the server is SIGKILLed.
    async with _server(env, home / "server-1.log") as client:
        pid = await _wait_for_pid(pid_file)
        _say(out, f"[server #1, pid {pid}] started over stdio")
        view = await _call(
            client,
            "orchestrate_start",
            {
                "request": REQUEST,
                "chain": "default",
                "approve_before": ["engineer"],
                "idempotency_key": f"demo-{secrets.token_hex(6)}",
            },
        )
        run_id = view["run_id"]
        started.append(run_id)
        steps = " -> ".join(t["task_id"] for t in view["tasks"])  # the compact answer has no chain
        _say(out, f"  orchestrate_start: run {run_id} ({steps}, gate before engineer): {view['status']}")
        view = await _play_host(client, view, out)
        _say(out, f"  run is {view['status']}: next action {view['next_action']['kind']}")
        if view["next_action"]["kind"] != "approve":
            raise DemoFailed(f"expected the run to wait at the gate, it is {view['status']}")
        _say(out, f"  SIGKILL server #1 (pid {pid}) in the middle of the chain")
        os.kill(pid, signal.SIGKILL)
        await _wait_dead(pid)
        await anyio.Path(pid_file).unlink(missing_ok=True)

    # 4: server #2 on the same store picks the run up, the gate is approved, the chain finishes.
    async with _server(env, home / "server-2.log") as client:
        pid = await _wait_for_pid(pid_file)
        _say(out, f"\n[server #2, pid {pid}] started on the same store")
        view = await _call(client, "run_status", {"run_id": run_id})
        _say(out, f"  run_status: {view['status']} — next action {view['next_action']['kind']}")
        if view["next_action"]["kind"] != "approve":
            raise DemoFailed(f"after the restart the run should wait at the gate, it is {view['status']}")
        gate = view["next_action"]["gate_id"]
        view = await _call(
            client,
            "orchestrate_approve",
            {
                "run_id": run_id,
                "decision": "approve",
                "gate_id": gate,
                "comment": "demo: approved",
                "approver": "demo-user",
            },
        )
        _say(out, f"  orchestrate_approve {gate}: {view['status']}")
        view = await _play_host(client, view, out)
        _say(out, f"  run is {view['status']}")
        full = await _call(client, "run_status", {"run_id": run_id, "detail": "full"})
        _say(out, f"  semantics: {full['semantics']}")

    # 5: the record says what happened.
    return await _check(env, run_id, out)

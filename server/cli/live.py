"""``runs tail`` and ``runs watch``: follow runs live in the terminal.

::

    construct-mcp runs tail RUN_ID [--from-start] [--json] [--url URL [--token-file PATH]]
    construct-mcp runs watch [--once] [--limit N]

``runs tail`` prints a run's events as they are recorded, one line each (the ``run_events`` feed of
:mod:`server.views.events`: seq, time, type, summary; an output as its size, never whole), and exits 0
when the run has ended and every event is printed. It starts with the last
:data:`TAIL_BACKLOG` events (``--from-start``: every event from the first); ``--json`` prints each
event as one JSON line (JSON Lines). With ``--url`` (a running server's Streamable HTTP endpoint,
``http://127.0.0.1:8000/mcp``; ``--token-file``: a file holding a bearer token for it) it follows the
``run_events`` tool of that server instead of the store, and so also prints the output of the calls
that server has in flight as it is written (``output_delta`` events: ``  task> text``);
from the store it prints recorded events only (the output as written lives in the memory of the
server that makes the call). ``runs watch`` shows the live runs (not ended), newest first,
one progress line each — chain, status, tasks finished of all, what the run waits for — refreshed
every second; ``--once`` prints one snapshot and exits.

Both only read: they follow the store through the runtime (woken at once by this process's writes,
polling the store for the writes of servers and other CLI processes) and never drive a run. A run
nobody drives (:mod:`server.views.attendance`: its driver stopped, and no server serves its store)
would never move: ``tail`` says so, with the command that continues the run, and exits
:data:`TAIL_UNATTENDED` instead of waiting. Ctrl-C stops them (exit status 130).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import anyio

from orchestration.core import RunHead, RunStatus, TaskStatus
from orchestration.engine import Runtime
from orchestration.errors import ConstructError, InvalidArgument
from orchestration.workers import open_session
from server.cli.subcommands import Subcommands
from server.views.attendance import attendance, said
from server.views.events import Event, read_events
from server.views.listing import waiting_for

#: The ``runs`` actions this module serves.
LIVE_COMMANDS = frozenset({"tail", "watch"})
#: How many of the newest events ``runs tail`` prints first (without ``--from-start``).
TAIL_BACKLOG = 10
#: How long one wait of ``runs tail`` for the next event lasts before it asks again.
TAIL_WAIT_SECONDS = 30.0
#: How long one wait of ``runs tail`` on the store lasts: between two, it checks that someone
#: drives the run.
TAIL_STORE_WAIT_SECONDS = 5.0
#: ``runs tail``'s exit status for a run nobody drives (it would wait forever).
TAIL_UNATTENDED = 1
#: How often ``runs watch`` redraws.
WATCH_SECONDS = 1.0
#: The statuses ``runs watch`` shows.
LIVE_STATUSES = frozenset(s for s in RunStatus if not s.is_terminal)

#: Adds the shared options (--home, --config, --store, --log-level) to a parser.
AddOptions = Callable[[argparse.ArgumentParser], None]


def add_live_parsers(
    runs_sub: Subcommands,
    common: AddOptions,
    json_flag: AddOptions,
) -> None:
    """Add ``tail`` and ``watch`` to the ``runs`` sub-commands."""
    tail = runs_sub.add_parser("tail", help="follow a run's events live until it ends (Ctrl-C stops)")
    tail.add_argument("run_id")
    tail.add_argument(
        "--from-start",
        action="store_true",
        help=f"print every event from the first (default: the last {TAIL_BACKLOG}, then new ones)",
    )
    tail.add_argument(
        "--url", help="follow a running server's run_events at this MCP URL (shows output as it is written)"
    )
    tail.add_argument("--token-file", type=Path, help="with --url: a file holding a bearer token")
    common(tail)
    json_flag(tail)
    watch = runs_sub.add_parser(
        "watch", help="show the live runs with a progress line each, every second (Ctrl-C stops)"
    )
    watch.add_argument("--once", action="store_true", help="print one snapshot and exit")
    watch.add_argument("--limit", type=int, default=50, help="show at most this many runs (default 50)")
    common(watch)


async def run_live(runtime: Runtime, args: argparse.Namespace, out: TextIO, where: str = "") -> int:
    """``runs tail`` or ``runs watch``; returns the exit status. ``where``: the flags that name the
    store in a command printed (``--home DIR``)."""
    if args.runs_command == "tail" and args.url:
        try:
            token = args.token_file.read_text().strip() if args.token_file else None
        except OSError as exc:
            raise InvalidArgument(f"cannot read --token-file {args.token_file}: {exc.strerror}") from None
        return await tail_server(
            args.url, args.run_id, out, token=token, from_start=args.from_start, as_json=args.json
        )
    if args.runs_command == "tail":
        return await tail(
            runtime, args.run_id, out, from_start=args.from_start, as_json=args.json, where=where
        )
    return await watch(runtime, out, once=args.once, limit=args.limit)


#: One page of the feed: ``(after_seq, output_after, wait_seconds)`` -> the ``run_events`` page.
PageReader = Callable[[int, int, float], Awaitable[dict[str, Any]]]
#: Asked after a page with no event of a run not ended: what to say when nobody drives it, or None.
StallCheck = Callable[[], Awaitable[str | None]]


async def tail(
    runtime: Runtime,
    run_id: str,
    out: TextIO,
    *,
    from_start: bool = False,
    as_json: bool = False,
    wait_seconds: float = TAIL_STORE_WAIT_SECONDS,
    where: str = "",
) -> int:
    """Print the run's events as they are recorded; return 0 once it has ended and all are out,
    :data:`TAIL_UNATTENDED` when nobody drives it (it would not move)."""
    head = await runtime.status(run_id)
    after = 0 if from_start else max(0, head.last_seq - TAIL_BACKLOG)
    if not as_json:
        out.write(f"run {head.run_id} ({head.chain.name}): {head.status.value}\n")

    async def read(after_seq: int, output_after: int, wait: float) -> dict[str, Any]:
        page = await read_events(runtime, head.run_id, after_seq, 100, wait, output_after=output_after)
        return page.model_dump(mode="json")

    async def stalled() -> str | None:
        now = await runtime.status(head.run_id)
        nobody = await attendance(runtime.store, now, runtime.clock.now(), where)
        return None if nobody is None else f"run {head.run_id}: {said(nobody)}"

    return await follow(
        read, run_id, out, after=after, as_json=as_json, wait_seconds=wait_seconds, stalled=stalled
    )


async def tail_server(
    url: str,
    run_id: str,
    out: TextIO,
    *,
    token: str | None = None,
    from_start: bool = False,
    as_json: bool = False,
    wait_seconds: float = TAIL_WAIT_SECONDS,
) -> int:
    """:func:`tail` through a running server's ``run_events`` tool (see the module docstring). A
    server that cannot be reached is an ``invalid_argument`` naming ``--url``, not a traceback."""
    try:
        return await _tail_server(url, run_id, out, token, from_start, as_json, wait_seconds)
    except Exception as exc:  # the SDK raises transport errors inside exception groups
        leaves = list(_leaves(exc))
        said = next((leaf for leaf in leaves if isinstance(leaf, ConstructError)), None)
        if said is not None:
            raise said from None
        why = "; ".join(dict.fromkeys(f"{type(leaf).__name__}: {leaf}"[:200] for leaf in leaves))
        raise InvalidArgument(
            f"--url {url}: cannot follow the run there ({why}); check the URL and that a server "
            "runs there (construct-mcp serve --transport streamable-http)"
        ) from None


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from _leaves(sub)
    else:
        yield exc


async def _tail_server(
    url: str,
    run_id: str,
    out: TextIO,
    token: str | None,
    from_start: bool,
    as_json: bool,
    wait_seconds: float,
) -> int:
    async with open_session(url, token, call_timeout_seconds=wait_seconds + 30) as client:

        async def read(after_seq: int, output_after: int, wait: float) -> dict[str, Any]:
            arguments = {"run_id": run_id, "after_seq": after_seq, "output_after": output_after, "limit": 100}
            result = await client.call_tool("run_events", {**arguments, "wait_seconds": wait})
            if result.is_error or result.structured_content is None:
                text = "".join(getattr(c, "text", "") for c in result.content)
                raise ConstructError(f"run_events failed: {text}")
            return dict(result.structured_content)

        after = 0
        if not from_start:  # the newest events: read to the end first, without printing
            page = await read(0, 0, 0.0)
            while page["more"]:
                page = await read(page["next_after_seq"], 0, 0.0)
            after = max(0, page["next_after_seq"] - TAIL_BACKLOG)
        if not as_json:
            out.write(f"run {run_id} (from {url})\n")
        return await follow(read, run_id, out, after=after, as_json=as_json, wait_seconds=wait_seconds)


async def follow(
    read: PageReader,
    run_id: str,
    out: TextIO,
    *,
    after: int,
    as_json: bool,
    wait_seconds: float,
    stalled: StallCheck | None = None,
) -> int:
    """Print the feed's pages from ``after`` until the run has ended and every event is out
    (``stalled``: asked after each page that brought nothing: a run nobody drives ends the tail
    with what it says, exit status :data:`TAIL_UNATTENDED`)."""
    output_after = 0
    writing: str | None = None  # the task whose text the last line is, still open
    while True:
        page = await read(after, output_after, wait_seconds)
        if stalled is not None and not page["events"] and not page["terminal"]:
            nobody = await stalled()
            if nobody is not None:
                out.write(("\n" if writing else "") + nobody + "\n")
                return TAIL_UNATTENDED
        for item in page["events"]:
            event = Event.model_validate(item)
            if not as_json and event.type == "output_delta":
                writing = write_delta(out, event, writing)
                continue
            if writing is not None:
                out.write("\n")
                writing = None
            out.write((json.dumps(item) if as_json else event_line(event)) + "\n")
        out.flush()
        after, output_after = page["next_after_seq"], page.get("next_output_after", output_after)
        if page["terminal"] and not page["more"]:
            if not as_json:
                out.write(("\n" if writing else "") + f"run {run_id} ended: {page['status']}\n")
            return 0


def write_delta(out: TextIO, event: Event, writing: str | None) -> str:
    """Print an ``output_delta``'s text as ``  task> text`` (continued lines indented, a task's
    text continuing its open line), after a note of what it missed; the task now writing."""
    task = event.task_id or ""
    if writing != task or event.missed:
        if writing is not None:
            out.write("\n")
        if event.missed:
            out.write(f"  {task}> [... {event.missed} characters not held]\n")
        out.write(f"  {task}> ")
    out.write((event.text or "").replace("\n", "\n" + " " * (len(task) + 4)))
    return task


def event_line(event: Event) -> str:
    """One recorded event as ``runs tail`` prints it."""
    size = f" ({event.output.chars} chars: {event.output.uri})" if event.output else ""
    return f"#{event.seq:<4} {event.at:%H:%M:%S}  {event.type:<22} {event.summary}{size}"


async def watch(runtime: Runtime, out: TextIO, *, once: bool = False, limit: int = 50) -> int:
    """Show the live runs, redrawn every :data:`WATCH_SECONDS` (``once``: one snapshot)."""
    while True:
        page = await runtime.list_runs(LIVE_STATUSES, limit)
        text = render_watch(page.runs, runtime.clock.now(), more=page.next_cursor is not None)
        if not once and out.isatty():
            out.write("\x1b[H\x1b[2J")  # redraw in place
        out.write(text)
        out.flush()
        if once:
            return 0
        await anyio.sleep(WATCH_SECONDS)


def render_watch(heads: Sequence[RunHead], now: datetime, more: bool = False) -> str:
    """The live runs, one progress line each (what ``runs watch`` prints)."""
    runs = "live run" if len(heads) == 1 and not more else "live runs"
    lines = [f"{len(heads)}{'+' if more else ''} {runs} at {now:%H:%M:%S}Z"]
    for head in heads:
        finished = sum(1 for t in head.tasks if t.status.is_terminal)
        lines.append(
            f"{head.run_id}  {head.chain.name:<10} {head.status.value:<17} "
            f"tasks {finished}/{len(head.tasks)}  {progress(head, now)}"
        )
    if more:
        lines.append("(more live runs: --limit N shows more)")
    return "\n".join(lines) + "\n"


def progress(head: RunHead, now: datetime) -> str:
    """What a live run waits for, in a few words."""
    waiting = waiting_for(head)
    if waiting is not None:
        return f"waits for {waiting}"
    if head.status == RunStatus.QUEUED and head.not_before is not None and head.not_before > now:
        return f"waits until {head.not_before:%H:%M:%S}Z to retry"
    running = [t.task_id for t in head.tasks if t.status == TaskStatus.RUNNING]
    if running:
        return "running " + ", ".join(running)
    return "waits for a worker to pick it up"

"""``construct-mcp`` (also ``python -m server``): serve, work with runs, migrate, demo.

::

    construct-mcp serve [--transport stdio|sse|streamable-http] [--host H] [--port P] [--store S] [--config F]
    construct-mcp runs start REQUEST [--chain NAME | --chain a,b,c | --specialists a[,b]]
                             [--approve-before STEP]... [--idempotency-key K] [--quiet] [--show-prompt]
    construct-mcp runs status RUN_ID [--full]
    construct-mcp runs resume RUN_ID [--task-id T (--output TEXT | --output-file FILE|-)]
    construct-mcp runs approve RUN_ID --gate-id G [--reject | --revise] [--comment C] [--approver A]
                               [--raise-tokens N] [--raise-usd X]   (a budget gate: what to add)
    construct-mcp runs cancel RUN_ID [--reason R]
    construct-mcp runs list [--status S]... [--limit N] [--cursor C]
    construct-mcp runs timeline RUN_ID
    construct-mcp runs fork RUN_ID --from TASK [--request R] [--chain NAME] (see server.cli.fork)
    construct-mcp runs upgrade RUN_ID | --chain NAME --all [--to V] [--dry-run] (see server.cli.upgrade)
    construct-mcp runs versions CHAIN (see server.cli.upgrade)
    construct-mcp runs audit [RUN_ID] [--since ISO-8601] [--by IDENTITY] [--limit N] [--json]
    construct-mcp runs tail RUN_ID [--from-start] [--json]
    construct-mcp runs watch [--once] [--limit N]
    construct-mcp runs export RUN_ID [--out FILE]  |  runs import FILE [--move --from SOURCE]
    construct-mcp runs prune --older-than 30d [--status S,...] [--dry-run] [--export-dir DIR]
    construct-mcp migrate [--check] [--store S]
    construct-mcp demo [--store S] [--home DIR] [--keep]
    construct-mcp --version

The ``runs`` commands work directly on the configured store, without a server: each records its
event through the :class:`~orchestration.engine.runtime.Runtime` and then drives the run in this process
until it settles (a host task, a gate, the end), so the CLI alone can run a chain (``tail`` and
``watch`` only follow runs: :mod:`server.cli.live`). If a server holds
the run's lease, the CLI leaves the driving to it and waits briefly for it. While a command drives
a run it prints the run id first, each task's start and end and the provider's streamed text
(:mod:`server.cli.progress`; ``--quiet``: none of it); Ctrl-C then says the run, what was recorded
and the command that continues it (exit 130). A run nobody drives is said so, with that command
(:mod:`server.views.attendance`). A host task's prompt is written to a file whose path is printed
(``--show-prompt`` prints it too); the ``next:`` command is the last line. Output is
human-readable; ``--json`` prints the same run view the MCP tools return: compact, each task's output
as a preview. ``runs status --full`` shows every task's whole output (``--json --full``: the view of
``run_status(detail="full")``). Like the tools, a command that records something names what it
answers: ``resume`` with an output needs ``--task-id`` and ``approve`` needs ``--gate-id``; without
one, the error names the task or gate the run awaits.

Exit status (:data:`EXIT_STATUSES`, also in ``--help``): 0 success; 1 the command failed, with one
``code: message`` line on stderr (``run_not_found: no run with id ...``); 2 a usage or configuration
error (argparse's -- no command given prints the help listing the commands; an unknown flag is said
under its sub-command's usage with the closest flag -- a ``--gate-id`` or ``--task-id`` left out, or
``construct-mcp: configuration error: FILE: TABLE.FIELD: problem``); 3 the run a command advanced
ended failed, rejected or cancelled. A reader that goes away (``| head -1``) changes no status.
Messages name commands and flags (``construct-mcp runs list``, ``--task-id``): an error's next steps
are rendered in the CLI's words (:mod:`server.cli.command_hints`), never as MCP tools.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO, TypeVar

import anyio

from orchestration.chains import Catalog
from orchestration.core import Fact, RunHead, RunStatus, StartRequest, TaskStatus, budget_raise
from orchestration.engine import Runtime
from orchestration.errors import (
    ConfigError,
    ConstructError,
    InvalidArgument,
    LeaseLost,
    StoreUnavailable,
    did_you_mean,
)
from orchestration.ops import behind
from orchestration.store import RunPage
from server.cli.audit_command import run_audit
from server.cli.budget_flags import budget_of, usage_of
from server.cli.command_hints import cli_message
from server.cli.fork import run_fork
from server.cli.grammar import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUN_ENDED_UNSUCCESSFULLY,
    EXIT_USAGE,
    build_parser,
)
from server.cli.live import LIVE_COMMANDS, run_live
from server.cli.printing import HostPrompts, emit
from server.cli.progress import Progress
from server.cli.retention_commands import RETENTION_COMMANDS, run_retention
from server.cli.upgrade import run_upgrade, run_versions
from server.cli.usage import UsageError
from server.identity import cli_user
from server.settings.config import Settings, check_home, load_settings
from server.settings.logs import configure_logging
from server.settings.storage import open_run_store, store_choice, store_url
from server.settings.telemetry import configure_tracing
from server.views.attendance import attended, continue_command
from server.views.chain_behind import ChainNews
from server.views.listing import RunsPage, runs_page
from server.views.run_view import Detail, RunView, run_view
from server.views.timeline import render_timeline
from server.wiring import runtime_for
from stores import parse_store_spec

_T = TypeVar("_T")

#: How long a ``runs`` command waits for a server that holds the run's lease to move it on.
CLI_WAIT_SECONDS = 10.0

#: the commands that advance a run in-process (see :data:`EXIT_RUN_ENDED_UNSUCCESSFULLY`)
_ADVANCING = frozenset({"start", "resume", "approve", "fork"})
_UNSUCCESSFUL = frozenset({RunStatus.FAILED, RunStatus.REJECTED, RunStatus.CANCELLED})


def _on_a_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


def _settings(args: argparse.Namespace, *, default_log_level: str | None = None) -> Settings:
    flags: dict[str, Any] = {
        "store": getattr(args, "store", None),
        "log_level": getattr(args, "log_level", None),
    }
    settings = load_settings(
        flags, home=getattr(args, "home", None), config_file=getattr(args, "config", None)
    )
    # The runs commands print for a person: only warnings and errors reach stderr unless asked.
    explicit = "log_level" in settings.sources or default_log_level is None
    configure_logging(settings.log_level if explicit else (default_log_level or "WARNING"))
    if args.command != "serve" and settings.source_of("store") == "--store":
        # A store typed on this command line is the one meant: one that cannot be opened is the
        # command's error, not a quiet switch to another store that has none of its runs.
        return settings.model_copy(update={"store_fallback": False})
    return settings


# ------------------------------------------------------------------------------------------------
# runs ...


@dataclass
class _Here:
    """What a ``runs`` command knows of where it runs: the flags that name its store in a command
    it prints (``--home DIR``, and ``--store``, ``--config`` as given), where a host task's
    prompts go, whether it prints progress, and the run it advances once known (what Ctrl-C
    reports: :func:`_interrupted`)."""

    flags: str
    prompts: HostPrompts
    progress: bool
    out: TextIO
    run_id: str | None = None
    #: said on stderr once the run is started (see :func:`_runs`)
    note: str | None = None


def _here(args: argparse.Namespace, settings: Settings, out: TextIO) -> _Here:
    """What the ``runs`` command ``args`` knows of where it runs (see :class:`_Here`)."""
    flags = [f"--home {shlex.quote(str(settings.home))}"]
    for name in ("store", "config"):
        value = getattr(args, name, None)
        if value is not None:
            flags.append(f"--{name} {shlex.quote(str(value))}")
    show = getattr(args, "show_prompt", False)
    quiet = getattr(args, "quiet", False) or getattr(args, "json", False)
    return _Here(" ".join(flags), HostPrompts(settings.home / "prompts", show), not quiet, out)


#: what the progress's first line says a command did to the run
_VERBS = {"start": "started", "resume": "resumed", "approve": "continues", "fork": "forked"}


async def _advance(runtime: Runtime, head: RunHead, here: _Here, verb: str) -> RunHead:
    """Drive the run in this process until it settles, printing its progress (:mod:`server.cli.progress`);
    if another process holds its lease, give that process a moment to move it on."""
    here.run_id = head.run_id
    if head.status.kind != "active":
        return head
    progress = Progress(runtime, here.out) if here.progress else None
    async with anyio.create_task_group() as group:
        if progress is not None:
            progress.begin(head, verb)
            group.start_soon(progress.follow, head.run_id)
        try:
            action = await runtime.drive(head.run_id)
        except LeaseLost:
            # Another process claimed the run while this one drove it: it is that process's now.
            action = None
        if action is None:
            head = await runtime.wait_settled(head.run_id, CLI_WAIT_SECONDS)
        else:
            head = await runtime.status(head.run_id)
        group.cancel_scope.cancel()
    if progress is not None:
        await progress.catch_up(head.run_id)
    return head


def _read_text(value: str | None, file: str | None, what: str) -> str | None:
    if file is None:
        return value
    try:
        return sys.stdin.read() if file == "-" else Path(file).read_text("utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {what} from {file}: {exc.strerror}") from None


def _chain_arg(chain: str | None, specialists: str | None) -> str | tuple[str, ...] | None:
    """``--chain name`` is a chain; ``--chain a,b`` and ``--specialists a[,b]`` are specialist lists."""
    listed = specialists if specialists is not None else chain if chain and "," in chain else None
    if listed is None:
        return chain
    return tuple(part.strip() for part in listed.split(",") if part.strip())


def _refuse_another_kind_of_store(settings: Settings) -> None:
    """A home that holds a SQLite store and no filesystem store, read as a filesystem store
    because no store is named, is refused with the store to name: opening it would say "no runs"
    and leave an empty filesystem store beside the runs the person looks for."""
    _spec, source = store_choice(settings)
    database = parse_store_spec("sqlite", home=settings.home).path
    assert database is not None  # the sqlite store is a file
    if source == "default" and database.is_file() and not (settings.home / "runs").exists():
        raise UsageError(
            f"{settings.home} holds a SQLite store ({database.name}), not a filesystem store: "
            "name it with --store sqlite (or set CONSTRUCT_ORCHESTRATION_STORE=sqlite)"
        )


async def _runs(args: argparse.Namespace, settings: Settings, here: _Here) -> int:
    _refuse_another_kind_of_store(settings)
    out = here.out
    if args.runs_command in RETENTION_COMMANDS:
        return await run_retention(args, settings, out)
    catalog = Catalog.load(settings.config_file)
    opened = await open_run_store(settings)
    # A mistyped home or URL would otherwise look like a store with no runs (or without the run
    # asked for): said after what the command prints, an error's `code: message` line first.
    note = (
        f"construct-mcp: note: the store {opened.description} did not exist before; if you "
        "expected runs here, check --store and CONSTRUCT_HOME"
        if opened.created
        else None
    )
    if args.runs_command == "start":
        # A start prints its run with the next command last, where the eye lands: the note (where
        # the new run went) is said once the run exists, before the run (an error still first).
        here.note, note = note, None
    stop_tracing = configure_tracing(settings.otel)  # a run driven here is traced as by the server
    try:
        async with runtime_for(settings, opened.store, catalog, opened.warnings) as runtime:
            code = await _runs_with(runtime, args, out, where=opened.description, here=here)
        if note is not None:
            sys.stderr.write(note + "\n")
        return code
    except (ConstructError, UsageError) as exc:
        note = note if note is not None else here.note  # a start's, if not said yet
        if note is not None:
            exc.add_note(note)
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await opened.store.close()
        stop_tracing()


async def _runs_with(
    runtime: Runtime,
    args: argparse.Namespace,
    out: TextIO,
    *,
    where: str | None = None,
    here: _Here | None = None,
) -> int:
    """Run the ``runs`` command ``args`` names on ``runtime``; ``where`` describes its store (an
    empty ``runs list`` says which store it looked in); ``here``: what the command knows of where
    it runs (None: no store flags to print, prompts printed whole, no progress). A run shown says
    whether anyone drives it (:mod:`server.views.attendance`)."""
    here = here if here is not None else _Here("", HostPrompts(show=True), False, out)
    command = args.runs_command
    model: RunView | RunsPage
    code = EXIT_OK
    if command in LIVE_COMMANDS:
        return await run_live(runtime, args, out, here.flags)
    if command == "upgrade":
        return await run_upgrade(runtime, args, out)
    if command == "versions":
        return await run_versions(runtime, args, out)
    if command == "audit":
        return await run_audit(runtime, args, out)
    if command == "list":
        if args.behind:
            page = RunPage(await behind(runtime, args.limit), None)
            if not page.runs and not args.json:
                out.write("no live run is on an older version of its chain\n")
                return EXIT_OK
        else:
            page = await runtime.list_runs(
                frozenset(RunStatus(s) for s in args.status) or None, args.limit, args.cursor
            )
        now = runtime.clock.now()
        listed = runs_page(page)
        runs = [
            await attended(summary, head, runtime.store, now, here.flags)
            for summary, head in zip(listed.runs, page.runs, strict=True)
        ]
        model = listed.model_copy(update={"runs": runs})
    elif command == "timeline":
        head = await runtime.status(args.run_id)
        facts = await runtime.read_facts(head.run_id)
        _emit_timeline(head, facts, args.json, out)
        return EXIT_OK
    else:
        head = await _run_command(command, args, runtime, here)
        detail: Detail = "full" if getattr(args, "full", False) else "compact"
        model = run_view(await runtime.snapshot(head.run_id, head), detail)
        model = await attended(model, head, runtime.store, runtime.clock.now(), here.flags)
        model = await ChainNews(runtime.catalog, runtime.versions).shown(model, head)
        if command in _ADVANCING and head.status in _UNSUCCESSFUL:
            code = EXIT_RUN_ENDED_UNSUCCESSFULLY
    emit(model, args.json, out, where, here.prompts)
    return code


async def _run_command(command: str, args: argparse.Namespace, runtime: Runtime, here: _Here) -> RunHead:
    if command == "start":
        request = sys.stdin.read() if args.request == "-" else args.request
        head, _created = await runtime.start(
            StartRequest(
                request=request,
                chain=_chain_arg(args.chain, args.specialists),
                approve_before=tuple(args.approve_before),
                idempotency_key=args.idempotency_key,
                worker_backend=args.worker_backend,
                provider=args.provider,
                model=args.model,
                timeout_seconds=args.timeout_seconds,
                task_timeout_seconds=args.task_timeout_seconds,
                budget=budget_of(args),
            )
        )
        if here.note is not None:
            sys.stderr.write(here.note + "\n")
            here.note = None
        return await _advance(runtime, head, here, _VERBS[command])
    if command == "fork":
        return await _advance(runtime, await run_fork(runtime, args), here, _VERBS[command])
    if command == "status":
        return await runtime.status(args.run_id)
    if command == "resume":
        output = _read_text(args.output, args.output_file, "the output")
        usage = usage_of(args)
        if output is None:
            if args.task_id is not None or usage is not None:
                raise UsageError(
                    error=InvalidArgument("--task-id or usage was given without --output or --output-file")
                )
            head = await runtime.check_resumable(args.run_id)
        elif args.task_id is None:
            raise _missing_flag(await runtime.missing_task_id(args.run_id, "--task-id"))
        else:
            # A local, trusted channel, as for approve: recorded as the OS user's, claimed.
            head = await runtime.submit_host_output(
                args.run_id, args.task_id, output, usage, args.detach_children, by=cli_user(), channel="cli"
            )
        return await _advance(runtime, head, here, _VERBS[command])
    if command == "approve":
        decision: Literal["approve", "reject", "revise"] = (
            "reject" if args.reject else "revise" if args.revise else "approve"
        )
        if args.gate_id is None:
            raise _missing_flag(await runtime.missing_gate_id(args.run_id, "--gate-id"))
        # The CLI is a local, trusted channel: the approver is what it says (--approver, else the
        # OS user), recorded as claimed.
        approver = args.approver if args.approver is not None else cli_user()
        raised = budget_raise(args.raise_tokens, args.raise_usd)
        head = await runtime.approve(
            args.run_id, decision, args.gate_id, args.comment, approver, channel="cli", budget_raise=raised
        )
        return await _advance(runtime, head, here, _VERBS[command])
    if command == "cancel":
        return await runtime.cancel(args.run_id, reason=args.reason, by=cli_user(), channel="cli")
    raise UsageError(f"unknown runs command {command!r}")  # pragma: no cover - argparse restricts it


def _missing_flag(error: ConstructError) -> Exception:
    """The error for a flag left out (``error`` says what the run awaits): a usage error (exit 2),
    as argparse's for a required flag; but when the run has ended no flag would help, and the
    run's state is the error (``invalid_state``, exit 1)."""
    return UsageError(error=error) if isinstance(error, InvalidArgument) else error


def _emit_timeline(head: RunHead, facts: Sequence[Fact], as_json: bool, out: TextIO) -> None:
    if as_json:
        data = {
            "run_id": head.run_id,
            "status": head.status.value,
            "facts": [f.model_dump(mode="json") for f in facts],
        }
        out.write(json.dumps(data, indent=2) + "\n")
    else:
        out.write(render_timeline(head, facts))


def _interrupted(settings: Settings, here: _Here) -> int:
    """Ctrl-C while a command advanced a run: the run stays as recorded (a call cut off is made
    again by whoever continues it). Say the run, what was recorded, and the command that continues
    it; exit :data:`EXIT_INTERRUPTED`."""
    run_id = here.run_id
    assert run_id is not None

    async def read() -> RunHead:
        opened = await open_run_store(settings)
        try:
            return await opened.store.load(run_id)
        finally:
            with anyio.CancelScope(shield=True):
                await opened.store.close()

    try:
        head: RunHead | None = _run_async(read)
    except (ConstructError, OSError):
        head = None
    resume = continue_command(run_id, here.flags)
    write = sys.stderr.write
    if head is None or head.status.kind == "active":
        status = head.status.value if head is not None else "as recorded"
        write(f"\ninterrupted: run {run_id} is left {status}; nobody drives it now.\n")
        if head is not None:
            write(f"recorded: {_recorded(head)}\n")
        write(f"continue it: {resume}\n")
    else:
        write(
            f"\ninterrupted: run {run_id} is {head.status.value}; "
            f"`construct-mcp runs status {run_id} {here.flags}` shows it.\n"
        )
    return EXIT_INTERRUPTED


def _recorded(head: RunHead) -> str:
    """What the run's record holds of its tasks, in a line (a call cut off is said as such)."""
    said = []
    for task in head.tasks:
        if task.status == TaskStatus.DONE:
            said.append(f"{task.task_id} done")
        elif task.status == TaskStatus.RUNNING:
            said.append(f"{task.task_id}'s call was cut off (it is made again when the run continues)")
        elif task.status.is_terminal:
            said.append(f"{task.task_id} {task.status.value}")
    return "; ".join(said) or "the run's start, no task's output yet"


# ------------------------------------------------------------------------------------------------
# migrate


async def _migrate(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    try:
        from stores import migrate
    except ImportError as exc:  # pragma: no cover - present in every release
        raise UsageError(f"migrations are not available in this installation ({exc})") from None
    report = await migrate(store_url(settings), check_only=args.check, home=settings.home)
    if args.json:
        out.write(
            json.dumps(
                {
                    "store": report.store,
                    "backend": report.backend,
                    "from_version": report.from_version,
                    "to_version": report.to_version,
                    "head_version": report.head_version,
                    "applied": list(report.applied),
                    "up_to_date": report.up_to_date,
                },
                indent=2,
            )
            + "\n"
        )
    else:
        out.write(report.summary() + "\n")
    return EXIT_OK


# ------------------------------------------------------------------------------------------------
# main


def _run_async(fn: Callable[[], Awaitable[_T]]) -> _T:
    async def main() -> _T:
        return await fn()

    return anyio.run(main)


def run(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The CLI; returns the exit status instead of exiting (tests call this)."""
    out = out if out is not None else sys.stdout
    try:
        args = _parse(build_parser(), argv)
    except SystemExit as exc:  # argparse: --help or --version (0) or a usage error (2)
        return int(exc.code or 0)
    try:
        if args.command == "serve":
            # Imported here: the MCP SDK is slow to import and only serve needs it.
            from server.app import ConstructApp

            # On stdio, a person's terminal (a host program run by hand passes its own stderr on)
            # gets warnings and errors only unless asked; a host application keeps the whole log.
            quiet = args.transport == "stdio" and _on_a_terminal(sys.stderr)
            settings = _settings(args, default_log_level="WARNING" if quiet else None)
            ConstructApp(settings).serve(args.transport, args.host, args.port)
            return EXIT_OK
        if args.command == "runs":
            settings = _settings(args, default_log_level="WARNING")
            here = _here(args, settings, out)
            try:
                return _run_async(lambda: _runs(args, settings, here))
            except KeyboardInterrupt:
                if here.run_id is None:
                    raise
                return _interrupted(settings, here)
        if args.command == "migrate":
            settings = _settings(args, default_log_level="WARNING")
            return _run_async(lambda: _migrate(args, settings, out))
        if args.command == "demo":
            return _demo(args, out)
    except ConfigError as exc:
        sys.stderr.write(f"construct-mcp: configuration error: {exc}\n")
        return EXIT_USAGE
    except UsageError as exc:
        _write_usage_error(exc)
        return EXIT_USAGE
    except ConstructError as exc:
        sys.stderr.write(f"{exc.code}: {_said(exc, args)}\n")
        _write_notes(exc)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseExceptionGroup as group:
        # A task group wrapped the error; the person at the terminal needs the error, not the group.
        leaf = _construct_error(group)
        if leaf is None:
            raise
        if isinstance(leaf, UsageError):
            _write_usage_error(leaf)
            return EXIT_USAGE
        sys.stderr.write(f"{leaf.code}: {_said(leaf, args)}\n")
        _write_notes(leaf)
        return EXIT_USAGE if isinstance(leaf, ConfigError) else EXIT_FAILED
    args.command_parser.error(f"unknown command {args.command!r}")  # pragma: no cover - exits 2
    return EXIT_USAGE  # pragma: no cover


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    """``demo``: its store and home checked here, where a usage error can still be said."""
    from server.cli.demo import run_demo

    if args.store is not None and parse_store_spec(args.store, home=Path.cwd()).backend == "memory":
        raise UsageError(
            "the demo kills its server and starts another on the same store, and the memory "
            "store keeps nothing across processes: use filesystem, sqlite or a postgresql:// URL"
        )
    # Absolute: the demo's servers are given it as CONSTRUCT_HOME, which must be.
    home = args.home.absolute() if args.home is not None else None
    if home is not None:
        check_home(home, "command line", "--home")
    configure_logging("WARNING")
    return _run_async(lambda: run_demo(home=home, store=args.store, keep=args.keep, out=out))


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``argv`` parsed; a usage problem exits 2 with the usage of the (sub-)command it is about: an
    unknown flag with the closest flag that command has, a command left out with the help that
    lists the commands (``construct-mcp`` alone, ``construct-mcp runs``)."""
    args, unknown = parser.parse_known_args(argv)
    command: argparse.ArgumentParser = args.command_parser
    if unknown:
        flags = set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", command.format_usage()))
        hints = "".join(did_you_mean(arg.split("=", 1)[0], flags) for arg in unknown if arg.startswith("-"))
        command.error(f"unrecognized arguments: {' '.join(unknown)}{hints}")
    if args.command is None or (args.command == "runs" and args.runs_command is None):
        # Usage error (exit 2, help on stderr) as argparse treats a missing required argument; the
        # help, not argparse's bare usage line, because it lists the commands to choose from.
        command.print_help(sys.stderr)
        command.exit(EXIT_USAGE)
    return args


def _said(exc: ConstructError, args: argparse.Namespace) -> str:
    """``exc``'s message in the CLI's words. A store named with ``--store`` that cannot be opened
    is said as unreachable, with what to check: the CLI, not the person, turned the fallback off
    (see :func:`_settings`), so the stores' "store_fallback is off" would send them to a setting
    they never set."""
    message = cli_message(exc)
    if isinstance(exc, StoreUnavailable) and _no_fallback_for_named_store(args):
        message = message.replace("; store_fallback is off", "")
        message += (
            "; check that the database is up and that the URL's host, port, user and database are "
            "right (the CLI uses the store --store names, never another)"
        )
    return message


def _no_fallback_for_named_store(args: argparse.Namespace) -> bool:
    """Whether :func:`_settings` turned the fallback off for this command line."""
    return args.command not in ("serve", "demo") and getattr(args, "store", None) is not None


def _write_usage_error(exc: UsageError) -> None:
    if exc.error is None:
        sys.stderr.write(f"construct-mcp: {exc}\n")
    else:
        sys.stderr.write(f"{exc.error.code}: {cli_message(exc.error)}\n")
    _write_notes(exc)


def _write_notes(exc: BaseException) -> None:
    """The notes added to an error on its way out (which store was opened), after its line."""
    for note in getattr(exc, "__notes__", ()):
        sys.stderr.write(f"{note}\n")


def _construct_error(group: BaseExceptionGroup[BaseException]) -> ConstructError | UsageError | None:
    for exc in group.exceptions:
        if isinstance(exc, (ConstructError, UsageError)):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _construct_error(exc)
            if found is not None:
                return found
    return None


def main() -> None:
    """Console-script entry point (``construct-mcp``)."""
    logging.captureWarnings(True)
    # When the reader goes away mid-output, the command has done its work: it exits 0, as a
    # command that printed everything does (the reader read what it wanted).
    code = EXIT_OK
    try:
        code = run()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``construct-mcp runs status R | head -1``): not an error worth a
        # traceback, nor a failure. What is still buffered goes nowhere, quietly: without this the
        # interpreter's last flush fails again and prints "Exception ignored ... BrokenPipeError".
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(code)

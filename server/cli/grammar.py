"""The command line's grammar: the commands, their arguments and flags (``build_parser``), and
the exit statuses ``--help`` lists. What each command does is :mod:`server.cli.main`'s."""

from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path

from orchestration.core import RunStatus
from server.cli.audit_command import add_audit_parser
from server.cli.budget_flags import add_budget_flags, add_usage_flags
from server.cli.fork import add_fork_parser
from server.cli.live import add_live_parsers
from server.cli.retention_commands import add_retention_parsers
from server.cli.upgrade import add_upgrade_parser, add_versions_parser

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
#: ``runs start|resume|approve|fork`` did what was asked, and the run it advanced ended failed,
#: rejected or cancelled: a script that chains commands must not take that for success
EXIT_RUN_ENDED_UNSUCCESSFULLY = 3
#: The exit statuses, as ``--help`` lists them.
EXIT_STATUSES = f"""exit status:
  {EXIT_OK}  success
  {EXIT_FAILED}  the command failed: one line "code: message" on stderr says why and what to run next
  {EXIT_USAGE}  a usage or configuration error (a bad flag, or FILE: TABLE.FIELD: problem)
  {EXIT_RUN_ENDED_UNSUCCESSFULLY}  runs start|resume|approve|fork: the run ended failed, rejected or cancelled
"""

#: Ctrl-C (128 + SIGINT), as a shell reports it.
EXIT_INTERRUPTED = 130


# ------------------------------------------------------------------------------------------------
# Parsing


def _common(parser: argparse.ArgumentParser, *, store: bool = True) -> None:
    parser.add_argument(
        "--home", type=Path, help="state directory (default: $CONSTRUCT_HOME or ~/.construct)"
    )
    parser.add_argument(
        "--config", type=Path, help="config file (default: <home>/construct.toml if it exists)"
    )
    if store:
        parser.add_argument(
            "--store",
            help="memory | filesystem | sqlite | postgres | file:///dir | sqlite:///f.db | postgresql://...",
        )
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _view_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a command that prints a run: ``--json``, and ``--show-prompt``."""
    _json_flag(parser)
    parser.add_argument(
        "--show-prompt",
        action="store_true",
        help="print a host task's prompt here too (it is always written to a file whose path is printed)",
    )


def _advancing_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a command that drives a run here: those of :func:`_view_flags`, and ``--quiet``."""
    _view_flags(parser)
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="print no progress while the run is driven (the run id, each task's start and end, the "
        "streamed text): only the run at the end",
    )


def version() -> str:
    """This installation's version (its package metadata), as ``--version`` prints it."""
    try:
        return importlib.metadata.version("construct-mcp")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source tree not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``serve``, ``runs ACTION``, ``migrate`` and ``demo``, each command's
    arguments added by its own function below, in the order ``--help`` lists them.

    Each parser sets the default ``command_parser`` to itself, so a parsed namespace names the
    innermost (sub-)command given: a usage problem found after parsing (an unknown flag, a command
    left out) is said with that command's usage."""
    parser = argparse.ArgumentParser(
        prog="construct-mcp",
        description="An MCP server that runs durable specialist chains.",
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    # Not required: without a command the help is printed (listing the commands), not a bare usage line.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _serve_arguments(sub.add_parser("serve", help="run the MCP server (stdio by default)"))
    runs_actions = _runs_actions(
        sub.add_parser(
            "runs",
            help="start, inspect and advance runs directly on the store",
            epilog=EXIT_STATUSES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    _migrate_arguments(sub.add_parser("migrate", help="apply (or --check) the SQL stores' schema migrations"))
    _demo_arguments(sub.add_parser("demo", help="run the crash-and-resume demo (no API key, no database)"))
    parser.set_defaults(command_parser=parser)
    for command in sub.choices.values():
        command.set_defaults(command_parser=command)
    for action in runs_actions.values():
        action.set_defaults(command_parser=action)
    return parser


def _serve_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--transport", choices=["stdio", "sse", "streamable-http"], default="stdio")
    serve.add_argument(
        "--host", default="127.0.0.1", help="HTTP transports: bind address (default 127.0.0.1)"
    )
    serve.add_argument("--port", type=int, default=8000, help="HTTP transports: port (default 8000)")
    _common(serve)


def _runs_actions(runs: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``runs``' actions: a run's life (start, status, resume, approve, cancel), the listing and
    the timeline here; following one live (``tail``, ``watch``), ``fork``, ``audit``, and ``export``,
    ``import`` and ``prune`` from their own modules. Returns the actions' parsers by name."""
    # Not required: `runs` alone prints its help (listing the actions), like the bare command.
    actions = runs.add_subparsers(dest="runs_command", metavar="ACTION")
    _start_arguments(actions.add_parser("start", help="start a chain on a request"))

    status = actions.add_parser("status", help="show a run")
    status.add_argument("run_id")
    status.add_argument("--full", action="store_true", help="show every task's whole output")
    _common(status)
    _view_flags(status)

    _resume_arguments(
        actions.add_parser("resume", help="record a host task's output, or continue an interrupted run")
    )
    _approve_arguments(
        actions.add_parser("approve", help="approve (or --reject, or --revise) the gate a run waits at")
    )

    cancel = actions.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id")
    cancel.add_argument("--reason")
    _common(cancel)
    _json_flag(cancel)

    listing = actions.add_parser("list", help="list runs, newest first")
    listing.add_argument("--status", action="append", choices=[s.value for s in RunStatus], default=[])
    listing.add_argument("--limit", type=_list_limit, default=20, help="runs per page, 1-500 (default 20)")
    listing.add_argument("--cursor")
    listing.add_argument(
        "--behind", action="store_true", help="only live runs on an older version of their chain"
    )
    _common(listing)
    _json_flag(listing)

    timeline = actions.add_parser("timeline", help="print a run's recorded facts in order")
    timeline.add_argument("run_id")
    _common(timeline)
    _json_flag(timeline)
    add_live_parsers(actions, _common, _json_flag)
    add_fork_parser(actions, _common, _advancing_flags)
    add_upgrade_parser(actions, _common)
    add_versions_parser(actions, _common)
    add_audit_parser(actions, _common)
    add_retention_parsers(actions, _common, _json_flag)
    return actions.choices


def _list_limit(value: str) -> int:
    """``--limit`` of ``runs list``: a usage error in the flag's name when out of range."""
    try:
        limit = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {value!r}") from None
    if not 1 <= limit <= 500:
        raise argparse.ArgumentTypeError(f"must be between 1 and 500, not {limit}")
    return limit


def _start_arguments(start: argparse.ArgumentParser) -> None:
    start.add_argument("request", help="what the chain should work on ('-' reads it from stdin)")
    chain = start.add_mutually_exclusive_group()
    chain.add_argument(
        "--chain", help="a chain name (default: default), or specialist names separated by commas"
    )
    chain.add_argument("--specialists", help="specialist names separated by commas (one is enough)")
    start.add_argument("--approve-before", action="append", default=[], metavar="STEP", help="gate a step")
    start.add_argument("--idempotency-key")
    start.add_argument("--worker-backend", choices=["inline", "provider"])
    start.add_argument("--provider", choices=["anthropic", "openrouter", "openai"])
    start.add_argument("--model")
    start.add_argument("--timeout-seconds", type=float, help="a time limit for the whole run")
    start.add_argument("--task-timeout-seconds", type=float, help="a time limit for each task")
    add_budget_flags(start)
    _common(start)
    _advancing_flags(start)


def _resume_arguments(resume: argparse.ArgumentParser) -> None:
    resume.add_argument("run_id")
    resume.add_argument("--task-id", help="the task the output answers (required with an output)")
    given = resume.add_mutually_exclusive_group()
    given.add_argument("--output", help="the task's output")
    given.add_argument("--output-file", help="read the task's output from a file ('-': stdin)")
    resume.add_argument(
        "--detach-children", action="store_true", help="complete it although its child runs are live"
    )
    add_usage_flags(resume)
    _common(resume)
    _advancing_flags(resume)


def _approve_arguments(approve: argparse.ArgumentParser) -> None:
    approve.add_argument("run_id")
    decided = approve.add_mutually_exclusive_group()
    decided.add_argument("--reject", action="store_true", help="reject instead of approving")
    decided.add_argument(
        "--revise",
        action="store_true",
        help="send the work the gate shows back: its step runs again with --comment in its prompt",
    )
    approve.add_argument("--gate-id", help="the gate decided (required; the run view names it)")
    approve.add_argument("--comment")
    approve.add_argument(
        "--approver", help="who decided, for the record (default: the OS user); recorded as claimed"
    )
    approve.add_argument("--raise-tokens", type=int, metavar="N", help="a budget gate: add N tokens")
    approve.add_argument("--raise-usd", type=float, metavar="X", help="a budget gate: add X dollars")
    _common(approve)
    _advancing_flags(approve)


def _migrate_arguments(migrate: argparse.ArgumentParser) -> None:
    migrate.add_argument("--check", action="store_true", help="only check; exit 1 if a migration is pending")
    _common(migrate)
    _json_flag(migrate)


def _demo_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--home", type=Path, help="state directory for the demo (default: a fresh temp dir)")
    demo.add_argument("--store", help="store for the demo server (default: filesystem under the demo home)")
    demo.add_argument("--keep", action="store_true", help="keep the temporary demo home")

"""``runs audit``: who did what, when, read from the runs' facts (:mod:`server.views.audit`).

::

    construct-mcp runs audit [RUN_ID] [--since ISO-8601] [--by IDENTITY] [--limit N] [--json]

Without RUN_ID, every run in the store. One line per action, oldest first: time (UTC), run,
action, who (``-``: nobody recorded), ``verified`` / ``claimed`` / ``system``, and the channel
where recorded. ``--since`` keeps the actions at or after a time (a date, or a date and time;
without a zone, UTC); ``--by`` those of one identity or name, exactly as recorded; ``--limit`` the
newest N of them. ``--json``: a list of objects with the same fields (``at``, ``run_id``, ``seq``,
``action``, ``by``, ``verified``, ``channel``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TextIO

from orchestration.engine import Runtime
from server.cli.subcommands import Subcommands
from server.views.audit import read_audit, render_audit

AddOptions = Callable[[argparse.ArgumentParser], None]


def _since(value: str) -> datetime:
    """``--since``: an ISO-8601 date or date and time; without a zone, UTC."""
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO-8601 time (2026-12-06 or 2026-12-06T09:30:00Z)"
        ) from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def _limit(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number")
    return number


def add_audit_parser(runs_sub: Subcommands, common: AddOptions) -> None:
    """Add ``audit`` to the ``runs`` sub-commands."""
    audit = runs_sub.add_parser("audit", help="list who did what, when, on one run or every run")
    audit.add_argument("run_id", nargs="?", help="one run (default: every run)")
    audit.add_argument("--since", type=_since, metavar="ISO-8601", help="only actions at or after this time")
    audit.add_argument("--by", metavar="IDENTITY", help="only actions of this identity (or name claimed)")
    audit.add_argument("--limit", type=_limit, metavar="N", help="only the newest N actions")
    audit.add_argument("--json", action="store_true", help="print JSON")
    common(audit)


async def run_audit(runtime: Runtime, args: argparse.Namespace, out: TextIO) -> int:
    """Print the actions ``args`` choose."""
    entries = await read_audit(runtime, args.run_id, args.since, args.by, args.limit)
    if args.json:
        out.write(json.dumps([e.as_json() for e in entries], indent=2) + "\n")
    else:
        out.write(render_audit(entries))
    return 0

"""``runs fork``: a new run from another run's recorded work, redone from one of its tasks (the
rule: :mod:`orchestration.ops.forking`).

::

    construct-mcp runs fork RUN_ID --from TASK [--request TEXT|-] [--chain NAME | --specialists a[,b]]
                            [--approve-before STEP]... [--idempotency-key K] [--json]

``--from`` names a task instance as ``runs status`` shows it (``engineer``: the step's first visit;
``engineer~2``: its second). Without ``--approve-before`` the new run gates the steps the source
gated. Like ``runs start``, the command then drives the new run in this process until it settles,
and prints its view (``forked from`` and the copied tasks marked).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from orchestration.core import RunHead
from orchestration.engine import Runtime
from orchestration.ops import ForkRequest, fork_run
from server.cli.subcommands import Subcommands

#: Adds the shared options (--home, --config, --store, --log-level) to a parser.
AddOptions = Callable[[argparse.ArgumentParser], None]


def add_fork_parser(
    runs_sub: Subcommands,
    common: AddOptions,
    output_flags: AddOptions,
) -> None:
    """Add ``fork`` to the ``runs`` sub-commands (``output_flags``: those of a command that drives
    a run and prints it: ``--json``, ``--show-prompt``, ``--quiet``)."""
    fork = runs_sub.add_parser(
        "fork", help="start a new run that reuses a run's recorded work and redoes it from a task"
    )
    fork.add_argument("run_id")
    fork.add_argument(
        "--from", dest="from_task", required=True, help="the task instance to redo from (e.g. engineer~2)"
    )
    fork.add_argument("--request", help="a new request ('-' reads stdin; default: the run's)")
    fork.add_argument("--chain", help="another chain name (default: the run's, as configured now)")
    fork.add_argument("--specialists", help="another chain, as specialists run in order: a,b,c")
    fork.add_argument(
        "--approve-before",
        action="append",
        metavar="STEP",
        help="a step to gate (repeatable; default: the steps the run gated)",
    )
    fork.add_argument("--idempotency-key")
    common(fork)
    output_flags(fork)


async def run_fork(runtime: Runtime, args: argparse.Namespace) -> RunHead:
    """Create the fork ``args`` describe; returns the new run's head (not yet driven)."""
    chain: str | tuple[str, ...] | None = args.chain
    if args.specialists is not None:
        chain = tuple(part.strip() for part in args.specialists.split(",") if part.strip())
    head, _created = await fork_run(
        runtime,
        ForkRequest(
            run_id=args.run_id,
            from_task=args.from_task,
            request=sys.stdin.read() if args.request == "-" else args.request,
            chain=chain,
            approve_before=None if args.approve_before is None else tuple(args.approve_before),
            idempotency_key=args.idempotency_key,
        ),
    )
    return head

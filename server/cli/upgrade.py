"""``runs upgrade``: move a live run, or every live run of a chain, to its chain as the
configuration has it now, where nothing recorded would change meaning (the rule:
:mod:`orchestration.core.upgrades`; the chain's ``upgrade`` policy must not be ``pinned``).

::

    construct-mcp runs upgrade RUN_ID [--dry-run] [--json]
    construct-mcp runs upgrade --chain NAME --all [--dry-run] [--json]

A dry run changes nothing and says what would. A run that cannot move stays as it is, and the
command says why (exit 1 for one run; for ``--all``, the count and each run's reason).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TextIO

from orchestration.core import CannotMove
from orchestration.engine import Runtime, Upgrade
from orchestration.ops import roll_out
from server.cli.subcommands import Subcommands
from server.cli.usage import UsageError

AddOptions = Callable[[argparse.ArgumentParser], None]


def add_upgrade_parser(runs_sub: Subcommands, common: AddOptions) -> None:
    """Add ``upgrade`` to the ``runs`` sub-commands."""
    upgrade = runs_sub.add_parser(
        "upgrade", help="move a live run (or all of a chain's) to its chain's current version"
    )
    upgrade.add_argument("run_id", nargs="?", help="the run to move (or --chain NAME --all)")
    upgrade.add_argument("--chain", help="with --all: every live run of this chain")
    upgrade.add_argument("--all", action="store_true", help="with --chain: every live run of it")
    upgrade.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")
    upgrade.add_argument("--json", action="store_true", help="print JSON")
    common(upgrade)


async def run_upgrade(runtime: Runtime, args: argparse.Namespace, out: TextIO) -> int:
    """Do what ``args`` ask; the exit status (1: the one run asked for cannot move)."""
    if args.run_id is not None and (args.all or args.chain is not None):
        raise UsageError("give a RUN_ID, or --chain NAME --all, not both")
    if args.run_id is None:
        if not (args.all and args.chain):
            raise UsageError("name a run (RUN_ID), or every live run of a chain (--chain NAME --all)")
        rollout = await roll_out(runtime, args.chain, dry_run=args.dry_run, by=None)
        if args.json:
            data = {"counts": dict(rollout.counts), "blocked": rollout.blocked, "seconds": rollout.seconds}
            out.write(json.dumps(data, indent=2) + "\n")
            return 0
        out.write(f"live runs of chain {args.chain}: {rollout.said()} (in {rollout.seconds:.1f} s)\n")
        for run_id, why in rollout.blocked.items():
            out.write(f"  {run_id} stays: {why}\n")
        if args.dry_run and rollout.counts["would_move"]:
            out.write(f"next: construct-mcp runs upgrade --chain {args.chain} --all\n")
        return 0
    done = await runtime.upgrade(args.run_id, dry_run=args.dry_run, reason="runs upgrade")
    if args.json:
        out.write(json.dumps(_data(done), indent=2) + "\n")
    else:
        out.write(_said(done, args.dry_run) + "\n")
    return 1 if isinstance(done.verdict, CannotMove) else 0


def _data(done: Upgrade) -> dict[str, object]:
    verdict = done.verdict
    data: dict[str, object] = {
        "run_id": done.head.run_id,
        "moved": done.moved,
        "from_version": done.from_hash[:12],
        "to_version": done.to_hash[:12],
    }
    if isinstance(verdict, CannotMove):
        return data | {"refused": verdict.code, "step": verdict.step, "reason": verdict.reason}
    return data | {
        "added": list(verdict.added),
        "removed": list(verdict.removed),
        "changed": list(verdict.changed),
        "replaced_tasks": list(verdict.replaced),
        "gates_asked_again": list(verdict.reasked),
    }


def _said(done: Upgrade, dry_run: bool) -> str:
    run_id = done.head.run_id
    verdict = done.verdict
    if isinstance(verdict, CannotMove):
        return f"run {run_id} stays on its chain: {verdict.reason}"
    if done.from_hash == done.to_hash:
        return f"run {run_id} is on its chain's current version ({done.to_hash[:12]}): nothing to do"
    changes = [
        f"{what}: {', '.join(names)}"
        for what, names in (
            ("steps added", verdict.added),
            ("steps removed", verdict.removed),
            ("steps changed", verdict.changed),
            ("host tasks replaced", verdict.replaced),
            ("gates asked again", verdict.reasked),
        )
        if names
    ]
    moved = "would move" if dry_run else "moved"
    line = f"run {run_id} {moved} to version {done.to_hash[:12]} of its chain (from {done.from_hash[:12]})"
    line += "".join(f"\n  {change}" for change in changes)
    if dry_run:
        line += f"\nnext: construct-mcp runs upgrade {run_id}"
    return line

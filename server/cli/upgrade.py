"""``runs upgrade``: move a live run, or every live run of a chain, to its chain as the
configuration has it now, where nothing recorded would change meaning (the rule:
:mod:`orchestration.core.upgrades`; the chain's ``upgrade`` policy must not be ``pinned``).

::

    construct-mcp runs upgrade RUN_ID [--to VERSION] [--dry-run] [--json]
    construct-mcp runs upgrade --chain NAME --all [--to VERSION] [--dry-run] [--json]

``--to`` names a kept version of the chain (``3`` or ``v3``; ``runs versions NAME`` lists them);
without it, the configuration's current version.

A dry run changes nothing and says what would. A run that cannot move stays as it is, and the
command says why (exit 1 for one run; for ``--all``, the count and each run's reason).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable
from typing import TextIO

from orchestration.core import CannotMove
from orchestration.engine import Runtime, Upgrade, named, parse_version
from orchestration.ops import live_runs, roll_out
from server.cli.subcommands import Subcommands
from server.cli.usage import UsageError
from server.identity import cli_user

AddOptions = Callable[[argparse.ArgumentParser], None]


def add_upgrade_parser(runs_sub: Subcommands, common: AddOptions) -> None:
    """Add ``upgrade`` to the ``runs`` sub-commands."""
    upgrade = runs_sub.add_parser(
        "upgrade", help="move a live run (or all of a chain's) to its chain's current version"
    )
    upgrade.add_argument("run_id", nargs="?", help="the run to move (or --chain NAME --all)")
    upgrade.add_argument("--chain", help="with --all: every live run of this chain")
    upgrade.add_argument("--all", action="store_true", help="with --chain: every live run of it")
    upgrade.add_argument(
        "--to", default="current", metavar="VERSION", help="a kept version (v3) instead of the current one"
    )
    upgrade.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")
    upgrade.add_argument("--json", action="store_true", help="print JSON")
    common(upgrade)


def add_versions_parser(runs_sub: Subcommands, common: AddOptions) -> None:
    """Add ``versions`` to the ``runs`` sub-commands."""
    versions = runs_sub.add_parser("versions", help="list the kept versions of a chain")
    versions.add_argument("chain", help="the chain's name")
    versions.add_argument("--json", action="store_true", help="print JSON")
    common(versions)


async def run_versions(runtime: Runtime, args: argparse.Namespace, out: TextIO) -> int:
    """List the kept versions of chain ``args.chain``, oldest first, marking the configuration's
    current one (its configuration is kept as a version first)."""
    kept = runtime.versions
    if not kept.kept:
        raise UsageError(f"this store ({runtime.store.name}) keeps no chain versions")
    await kept.seen_in_configuration()
    found = await kept.of_name(args.chain, fresh=True)
    current = (
        runtime.catalog.resolve(args.chain).content_hash() if args.chain in runtime.catalog.chains else None
    )
    on: Counter[int] = Counter()
    async for head in live_runs(runtime, args.chain):
        version = await kept.of_run(head.chain)
        if version is not None:
            on[version.ordinal] += 1
    if args.json:
        rows = [
            {
                "version": v.ordinal,
                "hash": v.chain_hash,
                "label": v.label,
                "source": v.source,
                "first_seen": v.first_seen.isoformat(),
                "current": v.chain_hash == current,
                "live_runs": on[v.ordinal],
            }
            for v in found
        ]
        out.write(json.dumps(rows, indent=2) + "\n")
        return 0
    if not found:
        out.write(f"no version of chain {args.chain} is kept in this store\n")
    for v in found:
        label = "" if v.label is None else f"  {v.label}"
        mark = "  (current)" if v.chain_hash == current else ""
        seen = f"{v.first_seen:%Y-%m-%d %H:%M}Z"
        runs = f"{on[v.ordinal]} live run" + ("" if on[v.ordinal] == 1 else "s")
        out.write(f"v{v.ordinal:<4} {v.chain_hash[:12]}  {seen}  {runs:<14} from {v.source}{label}{mark}\n")
    return 0


async def run_upgrade(runtime: Runtime, args: argparse.Namespace, out: TextIO) -> int:
    """Do what ``args`` ask; the exit status (1: the one run asked for cannot move)."""
    if args.run_id is not None and (args.all or args.chain is not None):
        raise UsageError("give a RUN_ID, or --chain NAME --all, not both")
    try:
        to = parse_version(args.to)
    except ValueError:
        raise UsageError(f"--to is 'current' or a version such as v3, not {args.to!r}") from None
    if args.run_id is None:
        if not (args.all and args.chain):
            raise UsageError("name a run (RUN_ID), or every live run of a chain (--chain NAME --all)")
        rollout = await roll_out(runtime, args.chain, dry_run=args.dry_run, by=cli_user(), to=to)
        if args.json:
            data = {"counts": dict(rollout.counts), "blocked": rollout.blocked, "seconds": rollout.seconds}
            out.write(json.dumps(data, indent=2) + "\n")
            return 0
        out.write(f"live runs of chain {args.chain}: {rollout.said()} (in {rollout.seconds:.1f} s)\n")
        for run_id, why in rollout.blocked.items():
            out.write(f"  {run_id} stays: {why}\n")
        if args.dry_run and rollout.counts["would_move"]:
            also = "" if to is None else f" --to v{to}"
            out.write(f"next: construct-mcp runs upgrade --chain {args.chain} --all{also}\n")
        return 0
    done = await runtime.upgrade(args.run_id, to, dry_run=args.dry_run, by=cli_user(), reason="runs upgrade")
    names = (await named(runtime.versions, done.from_chain), await named(runtime.versions, done.to_chain))
    if args.json:
        out.write(json.dumps(_data(done, names), indent=2) + "\n")
    else:
        out.write(_said(done, names, args.dry_run, args.to) + "\n")
    return 1 if isinstance(done.verdict, CannotMove) else 0


def _data(done: Upgrade, names: tuple[str, str]) -> dict[str, object]:
    verdict = done.verdict
    data: dict[str, object] = {
        "run_id": done.head.run_id,
        "moved": done.moved,
        "from_version": names[0],
        "to_version": names[1],
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


def _said(done: Upgrade, names: tuple[str, str], dry_run: bool, to: str) -> str:
    run_id = done.head.run_id
    verdict = done.verdict
    if isinstance(verdict, CannotMove):
        return f"run {run_id} stays on its chain: {verdict.reason}"
    if done.from_hash == done.to_hash:
        which = "current version" if to == "current" else "version asked for"
        return f"run {run_id} is on its chain's {which} ({names[1]}): nothing to do"
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
    line = f"run {run_id} {moved} to version {names[1]} of its chain (from {names[0]})"
    line += "".join(f"\n  {change}" for change in changes)
    if dry_run:
        line += f"\nnext: construct-mcp runs upgrade {run_id}" + ("" if to == "current" else f" --to {to}")
    return line

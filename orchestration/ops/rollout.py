"""A chain change rolled out to the live runs: which runs are behind their chain as the
configuration has it now, and moving many of them at once (each move is
:meth:`~orchestration.engine.runtime.Runtime.upgrade`'s, one write per run)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from orchestration.core import CannotMove, RunHead, RunStatus
from orchestration.engine import Runtime
from orchestration.errors import ConstructError

#: the statuses of a run that may still move (a terminal run never does)
LIVE = frozenset(s for s in RunStatus if not s.is_terminal)


@dataclass
class Rollout:
    """What a rollout found or did, by verdict (``moved``, ``would_move``, ``current``,
    ``blocked``, ``not_now``, ``pinned``, ``unknown_chain``), and why each blocked run stays."""

    counts: Counter[str] = field(default_factory=Counter)
    blocked: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def behind(self) -> int:
        """How many live runs were on another version than their chain's current one."""
        return sum(n for verdict, n in self.counts.items() if verdict != "current")

    def said(self) -> str:
        """One line for a log or a terminal."""
        shown = ", ".join(f"{n} {verdict.replace('_', ' ')}" for verdict, n in sorted(self.counts.items()))
        return shown or "no live runs"


async def live_runs(runtime: Runtime, chain: str | None = None) -> AsyncIterator[RunHead]:
    """Every live run (of chain ``chain`` when given), newest first."""
    cursor: str | None = None
    while True:
        page = await runtime.list_runs(LIVE, 500, cursor)
        for head in page.runs:
            if chain is None or head.chain.name == chain:
                yield head
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


async def behind(runtime: Runtime, limit: int | None = None) -> list[RunHead]:
    """The live runs on another version than their chain's current one, newest first (at most
    ``limit``); a run whose chain the configuration no longer has is behind too."""
    found: list[RunHead] = []
    current: dict[str, str | None] = {}
    async for head in live_runs(runtime):
        if head.chain_hash not in current:
            try:
                current[head.chain_hash] = runtime.catalog.resolve_again(head.chain).content_hash()
            except ConstructError:
                current[head.chain_hash] = None
        if current[head.chain_hash] != head.chain_hash:
            found.append(head)
            if limit is not None and len(found) >= limit:
                break
    return found


async def roll_out(
    runtime: Runtime,
    chain: str | None = None,
    *,
    dry_run: bool,
    by: str | None = None,
    to: int | None = None,
) -> Rollout:
    """Move every live run (of ``chain``) to its chain's current version (or to kept version
    ``to`` of it) where it may move; with ``dry_run``, only count what would happen."""
    rollout = Rollout()
    started = runtime.clock.now()
    current: dict[str, str] = {}  # a run's chain version -> its chain's current version
    async for head in live_runs(runtime, chain):
        try:
            if to is None and head.chain_hash not in current:
                current[head.chain_hash] = runtime.catalog.resolve_again(head.chain).content_hash()
            if to is None and current[head.chain_hash] == head.chain_hash:
                rollout.counts["current"] += 1  # read nothing more
                continue
            done = await runtime.upgrade(head.run_id, to, dry_run=dry_run, by=by, reason="rollout")
        except ConstructError as exc:  # the chain was removed from the configuration, the run pruned
            rollout.counts[exc.code] += 1
            continue
        verdict = done.verdict
        if isinstance(verdict, CannotMove):
            kind = {"upgrade_blocked": "blocked", "pinned": "pinned"}.get(verdict.code, "not_now")
            rollout.counts[kind] += 1
            if kind == "blocked":
                rollout.blocked[head.run_id] = verdict.reason
        elif done.moved:
            rollout.counts["moved"] += 1
        else:
            rollout.counts["current" if done.current else "would_move"] += 1
    rollout.seconds = (runtime.clock.now() - started).total_seconds()
    return rollout


async def at_startup(runtime: Runtime) -> Rollout:
    """What a server finds when it starts: how many live runs are behind their chain's current
    version and how many cannot move (a dry run), having moved those of ``at_boundary`` chains
    that can (:meth:`~orchestration.engine.runtime.Runtime.upgrade_if_due`). The configuration's
    chains are kept as versions first (on a store that keeps them)."""
    await runtime.versions.seen_in_configuration()
    if runtime.catalog.moves_at_boundary:
        async for head in live_runs(runtime):
            await runtime.upgrade_if_due(head.run_id, head)
    return await roll_out(runtime, dry_run=True)


__all__ = ["LIVE", "Rollout", "at_startup", "behind", "live_runs", "roll_out"]

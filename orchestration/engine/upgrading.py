"""Moving a live run to another version of its chain: one ``chain_upgraded`` fact, written on the
host's path (one compare-and-swap, with what follows at once: a host task prepared on the new
chain, a gate asked again), or a verdict that says why not. The rules are
:mod:`orchestration.core.upgrades`'."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from orchestration.chains.catalog import Catalog, carried
from orchestration.core.facts import ChainUpgraded
from orchestration.core.models import ChainSnapshot, RunHead
from orchestration.core.upgrades import CannotMove, UpgradePlan, plan_upgrade
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.chain_versions import ChainVersions
from orchestration.engine.host_writes import HostServices, held_at, write_with_follow_up
from orchestration.errors import ConstructError, VersionConflict

log = logging.getLogger("construct.runtime")

#: the chain a run is to run on, given its head (the configuration's current version of its chain,
#: or a version named)
ChainOf = Callable[[RunHead], ChainSnapshot]


@dataclass(frozen=True, slots=True)
class Upgrade:
    """What an upgrade found or did: the run's head (after the move when it ``moved``), the chain
    versions (content hashes) it was on and was asked onto, and the verdict."""

    head: RunHead
    from_hash: str
    to_hash: str
    verdict: UpgradePlan | CannotMove
    moved: bool
    #: the chains themselves: the run's before, and the one it was asked onto
    from_chain: ChainSnapshot
    to_chain: ChainSnapshot

    @property
    def current(self) -> bool:
        """Whether the run is on the chain asked for (already, or now)."""
        return self.head.chain_hash == self.to_hash


async def upgrade_run(
    services: HostServices,
    run_id: str,
    chain_of: ChainOf,
    allowed: Callable[[RunHead], CannotMove | None],
    *,
    dry_run: bool,
    by: str | None = None,
    verified: bool = False,
    reason: str | None = None,
) -> Upgrade:
    """Move ``run_id`` to ``chain_of(head)`` (the chain it is to run on, given the run as it is),
    unless ``dry_run`` or ``allowed(head)`` says why not (its chain's policy); a run on that chain
    already is left as it is (a repeat records nothing)."""
    while True:
        head = await services.store.load(run_id)
        new = chain_of(head)
        to_hash = new.content_hash()
        if to_hash == head.chain_hash:
            return Upgrade(head, head.chain_hash, to_hash, _unchanged(), False, head.chain, new)
        verdict = allowed(head) or plan_upgrade(head, new)
        if dry_run or isinstance(verdict, CannotMove):
            return Upgrade(head, head.chain_hash, to_hash, verdict, False, head.chain, new)
        fact = ChainUpgraded(
            seq=head.last_seq + 1,
            at=services.clock.now(),
            from_hash=head.chain_hash,
            to_hash=to_hash,
            chain=new,
            by=by,
            verified=verified,
            reason=reason,
        )
        held = await held_at(services, head, services.memory.last(run_id))
        try:
            written = await write_with_follow_up(services, head, [fact], held)
        except VersionConflict:
            continue
        return Upgrade(written.head, head.chain_hash, to_hash, verdict, True, head.chain, new)


class UpgradeServices(HostServices, Protocol):
    """What moving a run needs beyond the host's path: the configuration and the kept versions."""

    catalog: Catalog
    versions: ChainVersions


async def chain_asked(services: UpgradeServices, run_id: str, to: ChainSnapshot | int | None) -> ChainOf:
    """The chain a run is to move to, given its head: ``to`` as given; a kept version's number of
    the run's chain; or (None) its chain as the configuration has it now; the last two with the
    options the run was started with."""
    if isinstance(to, ChainSnapshot):
        return lambda _: to
    if to is None:
        return lambda head: services.catalog.resolve_again(head.chain)
    head = await services.store.load(run_id)
    version = await services.versions.numbered(head.chain.name, to)
    return lambda head: carried(head.chain, version.chain)


def policy_allows(catalog: Catalog) -> Callable[[RunHead], CannotMove | None]:
    """Whether the configuration lets a run move: not when its chain is ``pinned``."""

    def allowed(head: RunHead) -> CannotMove | None:
        if catalog.upgrade_policy(head.chain) != "pinned":
            return None
        name = head.chain.name
        return CannotMove(
            "pinned",
            None,
            f"chain {name!r} is pinned: its runs stay on the version they started with (set upgrade = "
            f'"manual" or "at_boundary" in [chains.{name}] to move them)',
        )

    return allowed


async def move_if_due(
    services: HostServices, catalog: Catalog, run_id: str, head: RunHead | None
) -> RunHead | None:
    """:meth:`~orchestration.engine.runtime.Runtime.upgrade_if_due` (which see)."""
    try:
        head = head or await services.store.load(run_id)
        if (
            head.status.is_terminal
            or head.status == RunStatus.RUNNING
            or catalog.upgrade_policy(head.chain) != "at_boundary"
        ):
            return head
        current = catalog.resolve_again(head.chain)
        if current.content_hash() == head.chain_hash:
            return head
        done = await upgrade_run(
            services, run_id, lambda _: current, _any_run, dry_run=False, by="policy", reason="at_boundary"
        )
    except ConstructError as exc:
        log.warning(
            "run %s was not moved to its chain's current version: %s",
            run_id,
            exc,
            extra={"action": "upgrade_failed", "run_id": run_id},
        )
        return head
    if isinstance(done.verdict, CannotMove):
        log.info(
            "run %s stays on its chain: %s",
            run_id,
            done.verdict.reason,
            extra={"action": "upgrade_blocked", "run_id": run_id},
        )
    return done.head


def _any_run(_: RunHead) -> CannotMove | None:
    return None


def _unchanged() -> UpgradePlan:
    return UpgradePlan(added=(), removed=(), changed=(), replaced=(), reasked=())


__all__ = [
    "ChainOf",
    "Upgrade",
    "UpgradeServices",
    "chain_asked",
    "move_if_due",
    "policy_allows",
    "upgrade_run",
]

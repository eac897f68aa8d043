"""Moving a live run to another version of its chain: one ``chain_upgraded`` fact, written on the
host's path (one compare-and-swap, with what follows at once: a host task prepared on the new
chain, a gate asked again), or a verdict that says why not. The rules are
:mod:`orchestration.core.upgrades`'."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestration.core.facts import ChainUpgraded
from orchestration.core.models import ChainSnapshot, RunHead
from orchestration.core.upgrades import CannotMove, UpgradePlan, plan_upgrade
from orchestration.engine.host_writes import HostServices, held_at, write_with_follow_up
from orchestration.errors import VersionConflict

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
            return Upgrade(head, head.chain_hash, to_hash, _unchanged(), False)
        verdict = allowed(head) or plan_upgrade(head, new)
        if dry_run or isinstance(verdict, CannotMove):
            return Upgrade(head, head.chain_hash, to_hash, verdict, False)
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
        return Upgrade(written.head, head.chain_hash, to_hash, verdict, True)


def _unchanged() -> UpgradePlan:
    return UpgradePlan(added=(), removed=(), changed=(), replaced=(), reasked=())


__all__ = ["ChainOf", "Upgrade", "upgrade_run"]

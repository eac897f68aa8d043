"""A run's A2A push notification configs, as facts: ``push_configured`` sets one (or replaces the
one of its id), ``push_config_deleted`` removes one; the head lists the ids of those in force
(``push_configs``), so a reader checks the head, and reads the log only for a run that has some.

Each is one external write (compare-and-swap, no lease, as a cancel is): a drive that holds the
run's lease meanwhile loses its compare-and-swap, reads again and decides the same (these facts
change nothing a decision reads). A run that ended takes none (nothing is appended after a
terminal fact): setting one is ``invalid_state``; removing one from an ended run records nothing
(nothing is sent for it any more but a restart's re-delivery, see
:mod:`server.a2a.push_notifier`). What the facts hold is the caller's business: the secrets in
them come sealed (:mod:`server.a2a.push_keys`).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestration.core.facts import Fact, PushConfigDeleted, PushConfigured
from orchestration.core.models import RunHead
from orchestration.engine.host_writes import HostServices, record
from orchestration.errors import InvalidState, TooLarge, VersionConflict


async def set_push_config(
    services: HostServices, run_id: str, config: PushConfigured, most: int
) -> tuple[RunHead, PushConfigured]:
    """Record ``config`` (its ``seq`` and ``at`` are set here) on the run ``run_id``, which may
    have at most ``most`` configs (``too_large`` past it; replacing one of the same id counts
    once). Returns the stored head and the fact recorded."""
    while True:
        head = await services.store.load(run_id)
        if head.status.is_terminal:
            raise InvalidState(
                f"task {run_id} has ended ({head.status.value}): it sends no more notifications"
            )
        if config.config_id not in head.push_configs and len(head.push_configs) >= most:
            raise TooLarge(
                f"task {run_id} has {len(head.push_configs)} push notification configs, the most a task "
                f"may have; delete one first"
            )
        fact = config.model_copy(update={"seq": head.last_seq + 1, "at": services.clock.now()})
        try:
            stored, _ = await record(services, head, [fact])
        except VersionConflict:
            continue
        return stored, fact


async def delete_push_config(services: HostServices, run_id: str, config_id: str, by: str | None) -> RunHead:
    """Remove the config ``config_id`` of the run ``run_id``. Idempotent: a config the run does
    not have (or no more), or a run that ended, records nothing."""
    while True:
        head = await services.store.load(run_id)
        if config_id not in head.push_configs or head.status.is_terminal:
            return head
        fact = PushConfigDeleted(seq=head.last_seq + 1, at=services.clock.now(), config_id=config_id, by=by)
        try:
            stored, _ = await record(services, head, [fact])
        except VersionConflict:
            continue
        return stored


def push_configs_in(head: RunHead, facts: Sequence[Fact]) -> list[PushConfigured]:
    """The configs in force of ``head``'s run, in the order they were first set, from its log
    ``facts``: the last ``push_configured`` of each id the head lists."""
    latest: dict[str, PushConfigured] = {}
    for fact in facts:
        if isinstance(fact, PushConfigured) and fact.config_id in head.push_configs:
            latest[fact.config_id] = fact
    return [latest[i] for i in head.push_configs if i in latest]

"""Whether anyone drives a run: a run whose driver died is shown as what it is.

A run is driven by whichever process holds its lease (a server's dispatcher, or a ``runs`` command
that drives it in its own process), renewed every third of its time to live while the process
works on the run. A process that dies (a ``kill``, a closed laptop, Ctrl-C) leaves the run's
status as it was, active, and its lease to expire, or released on the way out. Nothing in the run's
record changes: only the lease says that nobody drives the run any more.

**The rule.** A run is *unattended* when its status is active — ``running``, or ``queued`` and due
(no ``not_before`` in the future: a run waiting for a retry time waits on purpose) — and no
unexpired lease is held on it: a ``running`` run whose lease was released (a driver lets a run go
while it is running only when it stops: Ctrl-C, a server shutting down) at once, since its last
write; a lease that expired, :data:`GRACE_SECONDS` after its expiry; a ``queued`` run with no lease,
:data:`GRACE_SECONDS` after its last write. The grace is what a server's dispatcher takes to claim
a run that is due (a newly queued run, a lease that just lapsed): on a store a server serves, a run
is unattended for moments at most; on a store nobody serves, until ``construct-mcp runs resume
RUN_ID`` (or a server started on the store) continues it.

The lease is read with the store's optional ``ReadsLeases`` ability; a store without it says
nothing (:func:`unattended` is given no lease and answers ``None`` only when it cannot tell).
"""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from pydantic import BaseModel, Field

from orchestration.core import RunHead, RunStatus
from orchestration.store import Lease, ReadsLeases, RunStore
from server.views.outline import View

#: a view with an ``unattended`` field (the run view, a run's summary in a list)
_Shown = TypeVar("_Shown", bound=BaseModel)

#: How long a due run may be without a lease before it counts as unattended (see the module docstring).
GRACE_SECONDS = 5.0


class Unattended(View):
    """Nobody drives the run (see :mod:`server.views.attendance`): since when, and what continues it."""

    since: datetime = Field(description="Since when nobody drives it: its lease's expiry, or its last write.")
    lease_expired: bool = Field(
        description="true: its driver's lease expired at since; false: it was let go (since: its last write)."
    )
    continue_with: str = Field(description="The command that continues it (or start a server on its store).")


def continue_command(run_id: str, where: str = "") -> str:
    """The one command that continues a run nobody drives; ``where``: the flags that name its store
    (``--home DIR``), as the reader's command line had them."""
    return f"construct-mcp runs resume {run_id}{' ' + where if where else ''}"


def unattended(
    head: RunHead,
    lease: Lease | None,
    now: datetime,
    where: str = "",
    grace_seconds: float = GRACE_SECONDS,
) -> Unattended | None:
    """:class:`Unattended` when the rule of the module docstring says nobody drives ``head`` (its
    lease as the store holds it: ``lease``), else None."""
    if head.status == RunStatus.QUEUED:
        if head.not_before is not None and head.not_before > now:
            return None
    elif head.status != RunStatus.RUNNING:
        return None
    if lease is not None and lease.expires_at > now:
        return None
    since = lease.expires_at if lease is not None else head.updated_at
    released_while_running = lease is None and head.status == RunStatus.RUNNING
    if not released_while_running and (now - since).total_seconds() < grace_seconds:
        return None
    return Unattended(
        since=since, lease_expired=lease is not None, continue_with=continue_command(head.run_id, where)
    )


async def attendance(store: RunStore, head: RunHead, now: datetime, where: str = "") -> Unattended | None:
    """:func:`unattended` with the run's lease read from ``store`` (None when the store cannot
    read leases, or the run is not active: no read then)."""
    if head.status not in (RunStatus.RUNNING, RunStatus.QUEUED) or not isinstance(store, ReadsLeases):
        return None
    return unattended(head, await store.lease_of(head.run_id), now, where)


async def attended(shown: _Shown, head: RunHead, store: RunStore, now: datetime, where: str = "") -> _Shown:
    """``shown`` (a view of ``head`` with an ``unattended`` field) saying whether anyone drives the
    run (:func:`attendance`): a copy with ``unattended`` set when nobody does."""
    nobody = await attendance(store, head, now, where)
    return shown if nobody is None else shown.model_copy(update={"unattended": nobody})


def said(run: Unattended) -> str:
    """What a person reads: nobody drives it, since when, the command that continues it."""
    at = f"{run.since:%Y-%m-%d %H:%M:%S}Z"
    when = (
        f"since {at}, when the lease of the process that drove it expired"
        if run.lease_expired
        else f"the process that drove it stopped (last write {at})"
    )
    return (
        f"nobody is driving this run: {when}; continue it with `{run.continue_with}` "
        "(or start a server on its store)"
    )


__all__ = ["GRACE_SECONDS", "Unattended", "attendance", "attended", "continue_command", "said", "unattended"]

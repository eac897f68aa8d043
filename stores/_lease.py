"""Lease helpers every adapter shares: the ``LeaseLost`` error and the argument check of a fenced
append (see the ``RunStore`` docstring: a lease is a fence)."""

from __future__ import annotations

from datetime import datetime

from orchestration.errors import InvalidArgument, LeaseLost
from orchestration.store import Lease


def lease_lost(lease: Lease) -> LeaseLost:
    """The error for a renewal, or a fenced append, whose lease a later claim replaced (or that was
    released): the caller stops and leaves the run to whoever holds it now."""
    return LeaseLost(
        f"the lease on run {lease.run_id} claimed by {lease.owner} is no longer held: the run was "
        "claimed again or the lease released; this worker leaves the run to the current holder"
    )


def check_fence(run_id: str, lease: Lease | None) -> None:
    """Reject a fenced append whose lease is for another run, before anything is read or written."""
    if lease is not None and lease.run_id != run_id:
        raise InvalidArgument(f"the lease passed to an append on run {run_id} is for run {lease.run_id}")


def check_aware(now: datetime) -> None:
    """Reject a naive ``now``: lease expiry is judged with the caller's (injected, aware) clock."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise InvalidArgument("now must be a timezone-aware datetime (use the injected clock)")

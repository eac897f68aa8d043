"""How a remote construct-mcp run is polled while an agent step follows it (in a drive, or while the
run is ``awaiting_agent``): :class:`PollPacing` backs off after an answer that came at once without
the run having ended, so a paused remote run is not asked hundreds of times a second, and turns a
status it cannot understand, past ``unknown_status_seconds``, into ``agent_protocol``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestration.workers.agent_calls import AgentEndpoint

#: the run statuses of a construct-mcp (the vocabulary of :mod:`orchestration.core.vocabulary`)
TERMINAL_STATUSES = frozenset({"completed", "completed_with_failures", "failed", "cancelled", "rejected"})
COMPLETED_STATUSES = frozenset({"completed", "completed_with_failures"})
ACTIVE_STATUSES = frozenset({"queued", "running"})
PAUSED_STATUSES = frozenset({"awaiting_approval", "awaiting_host", "awaiting_children", "awaiting_agent"})
KNOWN_STATUSES = TERMINAL_STATUSES | ACTIVE_STATUSES | PAUSED_STATUSES


def status_of(view: dict[str, Any]) -> str | None:
    """The status a ``run_status`` answer names, or None when it names none (or not as text)."""
    status = view.get("status")
    return status if isinstance(status, str) else None


@dataclass
class PollPacing:
    """The pace of one follower's polls: after an answer that came at once without the run having
    ended, a jittered exponential backoff from ``first_seconds`` up to ``cap_seconds`` ("equal
    jitter": each delay drawn from the upper half of its nominal value), reset by an answer that
    shows the run working. Times are monotonic seconds given by the caller; ``rng`` draws the
    jitter (uniform in [0, 1))."""

    first_seconds: float
    cap_seconds: float
    unknown_limit_seconds: float
    rng: Callable[[], float]
    #: consecutive answers that did not show the run working
    idle: int = 0
    #: since when every answer had a status this code does not know (None: the last one had one)
    unknown_since: float | None = field(default=None)

    @classmethod
    def for_endpoint(cls, endpoint: AgentEndpoint, rng: Callable[[], float]) -> PollPacing:
        """The pacing of a follower of a remote run on ``endpoint``."""
        return cls(
            endpoint.paused_poll_seconds, endpoint.poll_cap_seconds, endpoint.unknown_status_seconds, rng
        )

    def after(self, status: str | None, wait_seconds: float, answered_in: float, now: float) -> float:
        """Seconds to sleep before the next poll, after an answer naming ``status`` (None: none
        could be read) that came ``answered_in`` seconds after a poll that could wait
        ``wait_seconds``. 0 after an answer that shows the run at work; a terminal status is the
        caller's to act on (0)."""
        if status in TERMINAL_STATUSES:
            return 0.0
        if status not in KNOWN_STATUSES:
            if self.unknown_since is None:
                self.unknown_since = now
        else:
            self.unknown_since = None
            if status in ACTIVE_STATUSES and answered_in >= wait_seconds * 0.9:
                self.idle = 0  # a long poll that waited its time: ask again at once
                return 0.0
        return self._delay()

    def stalled(self, now: float) -> bool:
        """Whether answers this code cannot understand have lasted past the bound."""
        return self.unknown_since is not None and now - self.unknown_since >= self.unknown_limit_seconds

    def _delay(self) -> float:
        first = max(self.first_seconds, 0.001)
        nominal = min(max(self.cap_seconds, first), first * (1 << min(self.idle, 32)))
        self.idle += 1
        return nominal / 2 + self.rng() * nominal / 2


def protocol_message(agent: str, remote_run_id: str, status: str | None, seconds: float) -> str:
    """The message of an ``agent_protocol`` failure."""
    what = f"status {status[:80]!r}" if status is not None else "answers it could not read"
    return (
        f"agent {agent}: remote run {remote_run_id} answered with {what} for {seconds:g} s; "
        "that is no construct-mcp run status (is the agent a construct-mcp of a compatible version?)"
    )


__all__ = [
    "ACTIVE_STATUSES",
    "COMPLETED_STATUSES",
    "KNOWN_STATUSES",
    "PAUSED_STATUSES",
    "TERMINAL_STATUSES",
    "PollPacing",
    "protocol_message",
    "status_of",
]

"""Who did what, when: the actions recorded on runs, read from their facts (``runs audit``).

An action is a fact that records something someone (or the server's own rules) asked for: a run
started or forked, a host task's output handed in, a gate decided, a run cancelled, a run moved to
another version of its chain. Each names who asked as recorded: a verified identity (an HTTP token's
or OAuth subject, ``verified``), a name only claimed (the CLI's user, an ``approver`` argument), the
server's own rules (``expiry`` deciding a gate, ``policy`` moving a run), or nobody (``by`` None: a
local caller that gave no name). Facts a fork copied from its source are not the fork's actions:
they are listed with the source run. What happens because of an action (a task's completion, a
route, a run's end) is not listed; ``runs timeline`` shows every fact of a run.

Nothing secret is read or shown: facts hold identities, never tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from orchestration.core import (
    ApprovalDecided,
    ChainUpgraded,
    Fact,
    HostOutputSubmitted,
    RunCancelled,
    RunCreated,
    RunHead,
)
from orchestration.engine import Runtime
from server.views.outline import View

#: the runs read per page while every run is audited
PAGE_SIZE = 500
#: what a decision on a gate did, in the words of a line
_DECIDED = {"approve": "approved", "reject": "rejected", "revise": "sent back for revision", "fail": "failed"}
#: who an action names when the server's own rules took it (recorded as such, never verified)
SYSTEM = frozenset({"expiry", "policy"})


class AuditEntry(View):
    """One action on one run: when, what, and who asked for it, as recorded."""

    at: datetime
    run_id: str
    #: the fact that records it (``runs timeline RUN_ID`` shows it as ``#seq``)
    seq: int
    action: str
    #: who asked: an identity, a name claimed, ``expiry`` or ``policy``; None: nobody recorded
    by: str | None
    #: whether ``by`` is an identity the server verified (an HTTP token's, or OAuth's)
    verified: bool
    #: how the request came in (``http``, ``stdio``, ``cli``, ``web``, ``elicitation``,
    #: ``expiry``), where the fact records it
    channel: str | None

    @property
    def how(self) -> str:
        """``verified``, ``claimed``, ``system`` (expiry, policy), or ``-`` when nobody is named."""
        if self.verified:
            return "verified"
        if self.by in SYSTEM:
            return "system"
        return "claimed" if self.by is not None else "-"

    def as_json(self) -> dict[str, object]:
        return self.model_dump(mode="json") | {"at": _when(self.at)}


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: what one action says: its words, who asked, whether verified, the channel
_Said = tuple[str, str | None, bool, str | None]


def _created(fact: RunCreated) -> _Said:
    # ``started_by`` is recorded only when verified (an HTTP identity; a child run inherits its
    # parent's): a local start names nobody.
    if fact.forked_from is not None:
        action = f"forked from {fact.forked_from.run_id} at {fact.forked_from.task_id}"
    elif fact.parent is not None:
        action = f"started as a child of {fact.parent.run_id} ({fact.parent.task_id})"
    elif fact.delegation is not None:
        action = f"started by an agent step elsewhere (hop {fact.delegation.hops})"
    else:
        action = f"started (chain {fact.chain.name})"
    return action, fact.started_by, fact.started_by is not None, None


def _decided(fact: ApprovalDecided) -> _Said:
    action = f"gate {fact.gate_id} {_DECIDED.get(fact.decision, fact.decision)}"
    if fact.budget_raise is not None:
        action += " (budget raised)"
    by = fact.approver if fact.approver is not None or fact.channel != "expiry" else "expiry"
    return action, by, fact.verified, fact.channel


def _handed_in(fact: HostOutputSubmitted) -> _Said:
    return f"output handed in for {fact.task_id}", fact.by, fact.verified, fact.channel


def _cancelled(fact: RunCancelled) -> _Said:
    action = "cancelled" + (f": {fact.reason}" if fact.reason else "")
    return action, fact.cancelled_by, fact.verified, fact.channel


def _upgraded(fact: ChainUpgraded) -> _Said:
    action = f"moved to chain version {fact.to_hash[:12]} (from {fact.from_hash[:12]})"
    return action, fact.by, fact.verified, None


#: the facts that record an action, and what each says (by class: no fact type subclasses another)
_ACTIONS: dict[type[Any], Callable[[Any], _Said]] = {
    RunCreated: _created,
    HostOutputSubmitted: _handed_in,
    ApprovalDecided: _decided,
    RunCancelled: _cancelled,
    ChainUpgraded: _upgraded,
}


def entry_of(run_id: str, fact: Fact) -> AuditEntry | None:
    """The action ``fact`` of run ``run_id`` records, or None for a fact that records none (or a
    fork's copy of its source's fact)."""
    said = _ACTIONS.get(type(fact))
    if said is None or fact.copied_from is not None:
        return None
    action, by, verified, channel = said(fact)
    return AuditEntry(
        at=fact.at, run_id=run_id, seq=fact.seq, action=action, by=by, verified=verified, channel=channel
    )


def entries_of(run_id: str, facts: Iterable[Fact]) -> list[AuditEntry]:
    """The actions among one run's ``facts``, in the order recorded."""
    return [entry for fact in facts if (entry := entry_of(run_id, fact)) is not None]


def chosen(
    entries: Iterable[AuditEntry],
    since: datetime | None = None,
    by: str | None = None,
    limit: int | None = None,
) -> list[AuditEntry]:
    """``entries`` at or after ``since`` and by ``by`` (exactly as recorded), oldest first; with
    ``limit``, only the newest ``limit`` of them (still oldest first)."""
    kept = sorted(
        (e for e in entries if (since is None or e.at >= since) and (by is None or e.by == by)),
        key=lambda e: (e.at, e.run_id, e.seq),
    )
    return kept[-limit:] if limit is not None else kept


async def _heads(runtime: Runtime, run_id: str | None) -> list[RunHead]:
    if run_id is not None:
        return [await runtime.status(run_id)]
    heads: list[RunHead] = []
    cursor: str | None = None
    while True:
        page = await runtime.list_runs(None, PAGE_SIZE, cursor)
        heads.extend(page.runs)
        if page.next_cursor is None:
            return heads
        cursor = page.next_cursor


async def read_audit(
    runtime: Runtime,
    run_id: str | None = None,
    since: datetime | None = None,
    by: str | None = None,
    limit: int | None = None,
) -> list[AuditEntry]:
    """The actions on run ``run_id`` (None: every run in the store, listed newest first), chosen
    as :func:`chosen` says. A run last written before ``since`` is not read."""
    entries: list[AuditEntry] = []
    for head in await _heads(runtime, run_id):
        if since is not None and head.updated_at < since:
            continue
        entries.extend(entries_of(head.run_id, await runtime.read_facts(head.run_id)))
    return chosen(entries, since, by, limit)


def render_audit(entries: Sequence[AuditEntry]) -> str:
    """One line per action: time (UTC), run, action, who (``-``: nobody recorded), how (verified,
    claimed, system), and the channel where recorded."""
    if not entries:
        return "no recorded action matches\n"
    width = max(len(e.action) for e in entries)
    lines = [
        f"{_when(e.at)}  {e.run_id}  {e.action:<{width}}  {e.by or '-'}  {e.how}"
        + (f"  {e.channel}" if e.channel else "")
        for e in entries
    ]
    return "\n".join(lines) + "\n"

"""The run list's answers (``runs_list``, ``runs list``, the run pages): a summary per run — its
status, chain, the start of its request and what it waits for — rather than a whole view."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from orchestration.core import RunHead, RunStatus, TaskStatus
from orchestration.store import RunPage
from server.views.attendance import Unattended
from server.views.outline import Outlined, View
from server.views.run_view import request_preview, status_kind_of


class RunSummary(View):
    run_id: str
    status: RunStatus
    status_kind: Literal["active", "paused", "terminal"]
    chain: str
    request_preview: str
    waiting_for: str | None = Field(
        default=None, description="What the run needs from outside, if anything (a host task, a gate)."
    )
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    #: set by a reader that read the run's lease (server.views.attendance): nobody drives the run
    unattended: Unattended | None = Field(default=None, exclude_if=lambda v: v is None)


class RunsPage(Outlined):
    #: set by the runs_list tool when more runs follow (server.views.fitted_pages): the call for them
    next_action: dict[str, Any] = Field(default_factory=dict, exclude_if=lambda v: not v)
    runs: list[RunSummary] = Field(
        description="Newest first: run_id, status, chain, request_preview, waiting_for."
    )
    next_cursor: str | None = Field(
        default=None, description="Pass as cursor to get the next page; null on the last page."
    )


def waiting_for(head: RunHead) -> str | None:
    """What a paused run waits for, in a few words: every task awaiting the host's output and
    every gate awaiting a decision (a parallel run's branches may wait at once)."""
    if head.status == RunStatus.AWAITING_CHILDREN:
        return "child runs"
    if head.status == RunStatus.AWAITING_AGENT:
        return "an agent's remote run"
    if head.status not in (RunStatus.AWAITING_HOST, RunStatus.AWAITING_APPROVAL):
        return None
    tasks = [t.task_id for t in head.tasks if t.status == TaskStatus.AWAITING_HOST]
    gates = [g.gate_id for g in head.gates if g.status == "requested"]
    said = []
    if tasks:
        said.append(f"host output for task{'s' if len(tasks) > 1 else ''} {_named(tasks)}")
    if gates:
        said.append(f"approval of gate{'s' if len(gates) > 1 else ''} {_named(gates)}")
    if head.status == RunStatus.AWAITING_APPROVAL:
        said.reverse()
    return "; ".join(said) or ("host output" if head.status == RunStatus.AWAITING_HOST else "approval")


#: ``waiting_for`` names at most this many tasks (and gates): a run's summary stays small however
#: many branches wait at once
NAMED_IDS = 5


def _named(ids: list[str]) -> str:
    """``ids`` joined, at most :data:`NAMED_IDS` of them, then how many more (``run_status`` has all)."""
    if len(ids) <= NAMED_IDS:
        return ", ".join(ids)
    return f"{', '.join(ids[:NAMED_IDS])} and {len(ids) - NAMED_IDS} more (run_status shows them)"


def run_summary(head: RunHead) -> RunSummary:
    preview = request_preview(head.request)
    return RunSummary(
        run_id=head.run_id,
        status=head.status,
        status_kind=status_kind_of(head.status),
        chain=head.chain.name,
        request_preview=preview,
        waiting_for=waiting_for(head),
        created_at=head.created_at,
        updated_at=head.updated_at,
        finished_at=head.finished_at,
    )


def runs_page(page: RunPage | Sequence[RunHead], next_cursor: str | None = None) -> RunsPage:
    if isinstance(page, RunPage):
        return RunsPage(runs=[run_summary(h) for h in page.runs], next_cursor=page.next_cursor)
    return RunsPage(runs=[run_summary(h) for h in page], next_cursor=next_cursor)

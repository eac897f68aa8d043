"""The MCP tool ``orchestrate_upgrade``: move a live run to its chain as the configuration has it
now (or to another kept version of it, ``to``), where nothing recorded would be reinterpreted
(the rule: :mod:`orchestration.core.upgrades`).
A dry run by default: the answer is the verdict and what would change."""

from __future__ import annotations

from typing import Annotated, Literal

from mcp.types import CallToolResult
from pydantic import BaseModel, Field

from orchestration.core import CannotMove
from orchestration.engine import Upgrade, named, parse_version
from orchestration.errors import InvalidArgument, InvalidState, UpgradeBlocked, quoted
from server.mcp.answering import ToolContext, answer, caller_for, services_of

Verdict = Literal["moved", "would_move", "current", "blocked", "not_now", "pinned"]


#: the verdict of each refusal's code (``invalid_state`` otherwise: ``not_now``)
_REFUSED: dict[str, Verdict] = {"upgrade_blocked": "blocked", "pinned": "pinned"}


class UpgradeAnswer(BaseModel):
    """What ``orchestrate_upgrade`` found or did."""

    run_id: str
    #: ``moved``; ``would_move`` (a dry run); ``current`` (on that chain already); ``blocked``
    #: (recorded work would be reinterpreted: ``blocked_step``, ``reason``); ``not_now`` (an attempt
    #: is in flight, or the run ended); ``pinned`` (its chain's runs stay on their version)
    verdict: Verdict
    from_version: str
    to_version: str
    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list)
    replaced_tasks: list[str] = Field(default_factory=list)
    gates_asked_again: list[str] = Field(default_factory=list)
    blocked_step: str | None = None
    reason: str | None = None
    next: str


async def orchestrate_upgrade(
    ctx: ToolContext,
    run_id: Annotated[str, Field(max_length=80)],
    dry_run: Annotated[bool, Field(description="false: move it.")] = True,
    to: Annotated[str, Field(max_length=12, description="current, or v3")] = "current",
) -> CallToolResult:
    """Move a live run to another version of its chain if nothing recorded changes meaning."""

    async def work() -> UpgradeAnswer:
        caller = await caller_for(ctx, "orchestrate_upgrade", run_id)
        runtime = services_of(ctx).runtime
        by = caller.identity if caller.verified else None
        number = _version_asked(to)
        done = await runtime.upgrade(run_id, number, dry_run=dry_run, by=by, verified=caller.verified)
        said = (await named(runtime.versions, done.from_chain), await named(runtime.versions, done.to_chain))
        return _answer(run_id, done, dry_run).model_copy(update=dict(zip(_VERSIONS, said, strict=True)))

    return await answer("orchestrate_upgrade", work, services_of(ctx))


_VERSIONS = ("from_version", "to_version")


def _version_asked(to: str) -> int | None:
    """``to`` as a version number (None: the current one); ``invalid_argument`` otherwise."""
    try:
        return parse_version(to)
    except ValueError:
        raise InvalidArgument(f"to is 'current' or a version such as 'v3', not {quoted(to)}") from None


def _answer(run_id: str, done: Upgrade, dry_run: bool) -> UpgradeAnswer:
    """The answer for what ``runtime.upgrade`` found or did; a move refused for real is an error."""
    verdict = done.verdict
    versions = UpgradeAnswer(
        run_id=done.head.run_id,
        verdict="current",
        from_version=done.from_hash[:12],
        to_version=done.to_hash[:12],
        next="nothing to do",
    )
    if isinstance(verdict, CannotMove):
        if not dry_run:
            error = UpgradeBlocked if verdict.code == "upgrade_blocked" else InvalidState
            raise error(f"run {run_id} stays on its chain: {verdict.reason}")
        kind = _REFUSED.get(verdict.code, "not_now")
        said = "it stays on its chain; fork it from an earlier task, or cancel it"
        update = {"verdict": kind, "blocked_step": verdict.step, "reason": verdict.reason, "next": said}
        return versions.model_copy(update=update)
    if done.moved:
        kind, said = "moved", f"run_status {{'run_id': '{run_id}'}} shows what it needs now"
    elif done.from_hash == done.to_hash:
        return versions
    else:
        kind, said = "would_move", "call again with dry_run false to move it"
    return versions.model_copy(
        update={
            "verdict": kind,
            "added": list(verdict.added),
            "removed": list(verdict.removed),
            "changed": list(verdict.changed),
            "replaced_tasks": list(verdict.replaced),
            "gates_asked_again": list(verdict.reasked),
            "next": said,
        }
    )

"""The MCP tool ``orchestrate_fork``: a new run from another run's recorded work, redone from one
of its tasks (the rule: :mod:`orchestration.ops.forking`). Published by
:func:`server.mcp.publishing.build_tools`; it answers with the new run's
:class:`~server.views.run_view.RunView` (``forked_from`` names the source,
copied tasks carry ``copied_from``) and needs the ``operate`` role, like ``orchestrate_start``, and,
since the fork copies the source's request and outputs, that the caller may read the source's content
(:meth:`~server.identity.Caller.check_content`: the ``read`` role, or to have started it).

Compact on purpose (``tools/list`` has a byte budget: ``tests/unit/server/test_answer_sizes.py``):
``chain`` is a chain name only; a chain given as a list of specialists is kept by default, and
another list can be given with the CLI (``runs fork --specialists``)."""

from __future__ import annotations

from typing import Annotated

from mcp.types import CallToolResult, InputRequiredResult
from pydantic import Field

from orchestration.core import Limits
from orchestration.ops import ForkRequest, fork_run
from server.mcp.answering import (
    DEFAULT_WAIT_SECONDS,
    MAX_WAIT_SECONDS,
    ToolContext,
    answer_or_ask,
    caller_for,
    services_of,
    settle_asking,
)
from server.views.run_view import RunView

LIMITS = Limits()
Name = Annotated[str, Field(max_length=LIMITS.max_name_chars)]


async def orchestrate_fork(
    ctx: ToolContext,
    run_id: Annotated[str, Field(max_length=80)],
    from_task: Annotated[
        str,
        Field(
            min_length=1,
            max_length=LIMITS.max_id_chars,
            description="The task to redo from, e.g. 'engineer~2'.",
        ),
    ],
    request: Annotated[str | None, Field(description="Default: the run's.")] = None,
    chain: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=LIMITS.max_name_chars,
            description="A chain name (default: the run's).",
        ),
    ] = None,
    approve_before: Annotated[
        list[Name] | None,
        Field(max_length=LIMITS.max_list_items, description="Default: the run's."),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=LIMITS.max_idempotency_key_chars,
            description="The same key returns the same fork.",
        ),
    ] = None,
    wait_seconds: Annotated[
        float,
        Field(ge=0, le=MAX_WAIT_SECONDS, allow_inf_nan=False, description="As orchestrate_start's."),
    ] = DEFAULT_WAIT_SECONDS,
) -> CallToolResult | InputRequiredResult:
    """A new run that copies a run's outputs before from_task and runs from there (e.g. retry a
    failed run from its failed task)."""

    async def work() -> RunView | InputRequiredResult:
        caller = await caller_for(ctx, "orchestrate_fork", run_id)
        services = services_of(ctx)
        caller.check_content(await services.runtime.status(run_id), "orchestrate_fork")  # it copies them
        fork = ForkRequest(
            run_id=run_id,
            from_task=from_task,
            request=request,
            chain=chain,
            approve_before=None if approve_before is None else tuple(approve_before),
            idempotency_key=idempotency_key,
            started_by=caller.identity if caller.verified else None,
        )
        head, created = await fork_run(services.runtime, fork)
        caller.check_run(head)
        if created:
            services.dispatcher.wake(head.run_id)
        return await settle_asking(ctx, caller, head, wait_seconds, retry_safe=idempotency_key is not None)

    return await answer_or_ask("orchestrate_fork", work, services_of(ctx))

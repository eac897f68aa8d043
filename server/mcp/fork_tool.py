"""The MCP tool ``orchestrate_fork``: a new run from another run's recorded work, redone from one of its
tasks (the rule: :mod:`orchestration.ops.forking`). It needs the ``operate`` role and may copy only
content the caller may read; its arguments are few because ``tools/list`` has a byte budget.
"""

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
            description="Same key: same fork.",
        ),
    ] = None,
    wait_seconds: Annotated[
        float,
        Field(ge=0, le=MAX_WAIT_SECONDS, allow_inf_nan=False, description="As orchestrate_start's."),
    ] = DEFAULT_WAIT_SECONDS,
) -> CallToolResult | InputRequiredResult:
    """A new run that copies a run's outputs before from_task and runs from there (e.g. retry a
    failed task)."""

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

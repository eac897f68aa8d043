"""How the tools are published: each tool function of :mod:`server.mcp.tools` (and
``orchestrate_fork``) with its title, its hints and the arguments whose absence it explains, made a
strict tool (:class:`~server.mcp.arguments.StrictTool`: its docstring as its description, its text
arguments taken verbatim, its input schema bounded by the configured limits), in the order hosts
list them."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult, InputRequiredResult, ToolAnnotations

from orchestration.core import Limits
from orchestration.errors import ConstructError
from server.mcp.answering import ToolContext, caller_for, services_of
from server.mcp.arguments import MissingHint, StrictTool, strict_schema, verbatim_text
from server.mcp.fork_tool import orchestrate_fork
from server.mcp.tools import (
    LIMITS,
    orchestrate_approve,
    orchestrate_cancel,
    orchestrate_resume,
    orchestrate_start,
    run_events,
    run_status,
    runs_list,
    task_prompt,
)
from server.mcp.upgrade_tool import orchestrate_upgrade


def build_tools(limits: Limits = LIMITS) -> list[Tool]:
    """The tools, strict (see :class:`StrictTool`), for ``MCPServer(tools=...)``, in the order
    :data:`_PUBLISHED` lists them. ``limits`` are the server's configured size limits, published as
    the ``maxLength`` of ``request`` and ``output`` (over one is ``too_large``, from the runtime)
    and of ``cursor``."""
    return [_strict_tool(published, limits) for published in _PUBLISHED]


@dataclass(frozen=True, slots=True)
class _Publish:
    """How a tool function is published: its title, its hints, and the hint for each argument
    whose absence the tool explains itself (see :class:`StrictTool`)."""

    fn: Callable[..., Awaitable[CallToolResult | InputRequiredResult]]
    title: str
    annotations: ToolAnnotations
    missing: Mapping[str, MissingHint] = field(default_factory=dict)


def _strict_tool(published: _Publish, limits: Limits) -> StrictTool:
    """``published.fn`` as a strict tool: its docstring as its description, its text arguments
    taken verbatim, its input schema bounded by ``limits``."""
    fn = published.fn
    # cleandoc: the SDK would otherwise hand hosts the docstring with its source indentation.
    description = inspect.cleandoc(fn.__doc__ or "")
    tool = StrictTool.from_function(
        fn,
        title=published.title,
        description=description,
        # a copy: each list of tools has its own, as when they were made at each call
        annotations=published.annotations.model_copy(),
    )
    assert isinstance(tool, StrictTool)  # from_function builds its own class
    tool.missing = dict(published.missing)
    tool.fn_metadata = verbatim_text(tool.fn_metadata)
    tool.parameters = strict_schema(tool.parameters, limits)
    return tool


async def _missing_gate_id(ctx: ToolContext, arguments: Mapping[str, Any]) -> ConstructError:
    run_id = str(arguments["run_id"])
    try:
        # The hint names the run's gates: only to a caller who may decide them.
        await caller_for(ctx, "orchestrate_approve", run_id)
    except ConstructError as exc:
        return exc
    return await services_of(ctx).runtime.missing_gate_id(run_id)


# openWorldHint is false on every tool, though the tools that change a run can reach a model provider
# or a remote agent (a start, fork, resume, approval or upgrade lets the run go on to such a step; a
# cancel or a rejection cancels agent steps' remote runs): Codex CLI asks for approval before a
# call of a tool that is open-world and not read-only, and under `codex exec`'s approval policy
# `never` refuses it ("MCP tool call requires approval, but approval policy is never"), so a chain
# could not even start there. What the hint would say is in each tool's description and the docs.
#: the tools :func:`build_tools` publishes, in this order
_PUBLISHED = (
    _Publish(
        orchestrate_start,
        "Start a specialist chain",
        ToolAnnotations(destructive_hint=False, open_world_hint=False),
    ),
    _Publish(
        orchestrate_fork,
        "Fork a run from a task",
        ToolAnnotations(destructive_hint=False, open_world_hint=False),
    ),
    _Publish(
        orchestrate_resume,
        "Hand in a task's output",
        ToolAnnotations(destructive_hint=False, idempotent_hint=True, open_world_hint=False),
    ),
    _Publish(
        task_prompt,
        "Read a task's prompt in parts",
        ToolAnnotations(read_only_hint=True, open_world_hint=False),
    ),
    _Publish(
        orchestrate_approve,
        "Decide a gate",
        ToolAnnotations(destructive_hint=False, idempotent_hint=True, open_world_hint=False),
        missing={"gate_id": _missing_gate_id},
    ),
    _Publish(
        run_status,
        "Show a run",
        ToolAnnotations(read_only_hint=True, open_world_hint=False),
    ),
    _Publish(
        orchestrate_cancel,
        "Cancel a run",
        ToolAnnotations(destructive_hint=True, idempotent_hint=True, open_world_hint=False),
    ),
    _Publish(
        orchestrate_upgrade,
        "Upgrade a run",
        ToolAnnotations(destructive_hint=False, idempotent_hint=True, open_world_hint=False),
    ),
    _Publish(runs_list, "List runs", ToolAnnotations(read_only_hint=True, open_world_hint=False)),
    _Publish(
        run_events,
        "Follow a run's events",
        ToolAnnotations(read_only_hint=True, open_world_hint=False),
    ),
)


__all__ = ["build_tools"]

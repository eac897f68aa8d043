"""Runs as MCP resources: ``run://{run_id}`` (the compact view as JSON, the one worth subscribing to),
``run://{run_id}/tasks/{task_id}/output``, ``run://{run_id}/events``, ``run://{run_id}/export``, and a
``resources/list`` of the :data:`RECENT_RUNS` newest runs the caller may read (docs/hosts.md). The
handshake-era ``resources/subscribe`` is registered here, since ``MCPServer`` has no handler for it;
who hears what is :mod:`server.mcp.subscriptions`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, NamedTuple

import mcp_types as types
from mcp.server import MCPServer
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError

from orchestration.core import RunHead, TaskStatus, validate_run_id
from orchestration.errors import ConstructError, Forbidden, InvalidArgument, InvalidState, RunNotFound
from orchestration.ops import RunExport, export_lines
from server.identity import caller_of
from server.mcp.services import Services, run_uri
from server.mcp.subscriptions import (
    LegacySubscribers,
    RunSubscriptions,
    as_protocol_error,
    check_subscribable,
    check_subscriber,
)
from server.mcp.tool_hints import tool_error_text
from server.sdk import set_request_handler
from server.views.compact import answer_data, answer_text
from server.views.events import newest_events
from server.views.listing import waiting_for
from server.views.run_view import check_task_id

ResourceContext = Context[Services, Any]
#: How many runs ``resources/list`` shows (the newest); runs_list pages through all of them.
RECENT_RUNS = 20
#: How much of a run's request its resource name shows.
NAME_PREVIEW_CHARS = 60


async def _readable(ctx: ResourceContext, run_id: str) -> RunHead:
    """The run ``run_id``, once it is checked that the caller may read it (``forbidden``)."""
    caller = caller_of(ctx.request_context.request)
    caller.require("read", "reading a run resource")
    head = await ctx.request_context.lifespan_context.runtime.status(validate_run_id(run_id))
    caller.check_run(head)
    return head


def _resource_error(exc: ConstructError) -> Exception:
    """How a resource read reports an error: ``forbidden`` as a coded JSON-RPC error; what names no
    readable run, task or output (a bad or unknown id, an output not there yet) as "not found";
    anything else as a resource error. Each message starts with the error's stable code."""
    if isinstance(exc, Forbidden):
        return as_protocol_error(exc)
    said = tool_error_text(exc)
    if isinstance(exc, RunNotFound | InvalidArgument | InvalidState):
        return ResourceNotFoundError(said)
    return ResourceError(said)


async def read_run(run_id: str, ctx: ResourceContext) -> str:
    """A run: status, next_action, tasks with output previews, gates and warnings (the compact
    run_status view)."""
    services: Services = ctx.request_context.lifespan_context
    try:
        caller = caller_of(ctx.request_context.request)
        view = await services.view(run_id, await _readable(ctx, run_id), caller=caller)
    except ConstructError as exc:
        raise _resource_error(exc) from None
    return answer_text(answer_data(view))


async def read_task_output(run_id: str, task_id: str, ctx: ResourceContext) -> str:
    """One task's whole output, verbatim (the view's ``output_uri``)."""
    services: Services = ctx.request_context.lifespan_context
    try:
        head = await _readable(ctx, run_id)
        task = check_task_id(head, task_id)
        if task.status != TaskStatus.DONE or task.output_seq is None:
            raise InvalidState(
                f"task {task.task_id!r} of run {head.run_id} has no output: it is {task.status.value}"
            )
        outputs = await services.runtime.outputs(head, [task.task_id])
    except ConstructError as exc:
        raise _resource_error(exc) from None
    return outputs[task.task_id]


async def read_run_events(run_id: str, ctx: ResourceContext) -> str:
    """The run's newest events (at most :data:`~server.views.events.RESOURCE_EVENTS`), as the
    ``run_events`` tool pages them: read on with ``run_events(after_seq=next_after_seq)``."""
    services: Services = ctx.request_context.lifespan_context
    try:
        page = await newest_events(services.runtime, await _readable(ctx, run_id))
    except ConstructError as exc:
        raise _resource_error(exc) from None
    return page.model_dump_json()


async def read_run_export(run_id: str, ctx: ResourceContext) -> str:
    """The whole run, every output in full, as ``runs export`` writes it: a header with its hashes,
    the head, every fact (JSON Lines). Read it to archive or move a run, not to follow one."""
    runtime = ctx.request_context.lifespan_context.runtime
    try:
        run = RunExport(*await runtime.read_log((await _readable(ctx, run_id)).run_id))
    except ConstructError as exc:
        raise _resource_error(exc) from None
    return "".join(
        f"{line}\n" for line in export_lines(run, source=runtime.store_name, at=runtime.clock.now())
    )


def run_resource(head: RunHead) -> types.Resource:
    """A run as ``resources/list`` shows it: ``run://<id>``, named by its chain, status and request."""
    name = f"{head.chain.name} · {head.status.value} · {_flat_preview(head.request)}"
    waiting = waiting_for(head)
    return types.Resource(
        uri=run_uri(head.run_id),
        name=name,
        title=name,
        description=f"Run {head.run_id}"
        + (f", waiting for {waiting}" if waiting else "")
        + ". Attach it to pick the run up: its next_action says what to do.",
        mime_type="application/json",
    )


def _flat_preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= NAME_PREVIEW_CHARS else flat[: NAME_PREVIEW_CHARS - 1] + "…"


class _Template(NamedTuple):
    uri: str
    name: str
    title: str
    description: str
    mime_type: str
    read: Callable[..., Awaitable[str]]


#: The run resources, in the order ``resources/templates/list`` gives them.
_TEMPLATES = (
    _Template(
        "run://{run_id}",
        "run",
        "A construct-mcp run",
        "The run's status, next action, tasks, gates and warnings (JSON); subscribe for updates.",
        "application/json",
        read_run,
    ),
    _Template(
        "run://{run_id}/tasks/{task_id}/output",
        "task_output",
        "A task's output",
        "One task's whole output, verbatim (a run view's tasks[].output_uri).",
        "text/plain",
        read_task_output,
    ),
    _Template(
        "run://{run_id}/events",
        "run_events",
        "A run's newest events",
        "The run's newest events (JSON, as run_events pages them); read on with run_events.",
        "application/json",
        read_run_events,
    ),
    _Template(
        "run://{run_id}/export",
        "run_export",
        "A run's export",
        "The whole run as JSON Lines (header, head, every fact): runs import restores it.",
        "application/jsonl",
        read_run_export,
    ),
)


def register_resources(
    server: MCPServer[Services], legacy: LegacySubscribers, subscriptions: RunSubscriptions
) -> None:
    """Register the run resources on ``server``, and the handlers that list the newest runs and
    that subscribe handshake-era clients (``legacy``) to them (``subscriptions`` polls what they
    subscribe to)."""
    for t in _TEMPLATES:
        server.resource(t.uri, name=t.name, title=t.title, description=t.description, mime_type=t.mime_type)(
            t.read
        )
    # MCPServer exposes no hook for the handshake-era subscribe methods, nor lists resources that
    # change (its list is of resources registered up front); its low-level server does (server.sdk).
    set_request_handler(
        server, "resources/list", types.PaginatedRequestParams, partial(_list_resources, server)
    )
    set_request_handler(
        server,
        "resources/subscribe",
        types.SubscribeRequestParams,
        partial(_subscribe, legacy, subscriptions),
    )
    set_request_handler(
        server, "resources/unsubscribe", types.UnsubscribeRequestParams, partial(_unsubscribe, legacy)
    )


async def _subscribe(
    legacy: LegacySubscribers,
    subscriptions: RunSubscriptions,
    ctx: ServerRequestContext[Services, Any],
    params: types.SubscribeRequestParams,
) -> types.EmptyResult:
    """``resources/subscribe``: remember the session for ``notifications/resources/updated`` and
    poll the run for changes other processes make."""
    uri = str(params.uri)
    try:
        caller = caller_of(ctx.request)
        caller.require("read", "subscribing to a run resource")
        await check_subscriber(caller, [uri] if check_subscribable(uri) else [], subscriptions.load)
        legacy.add(uri, ctx.session, caller)  # run:// URIs only, capped, ends with the session
    except ConstructError as exc:
        raise as_protocol_error(exc) from None
    await subscriptions.add([uri], listening=False)
    return types.EmptyResult()


async def _unsubscribe(
    legacy: LegacySubscribers,
    ctx: ServerRequestContext[Services, Any],
    params: types.UnsubscribeRequestParams,
) -> types.EmptyResult:
    """``resources/unsubscribe``: forget the session for that URI."""
    legacy.remove(str(params.uri), ctx.session)
    return types.EmptyResult()


async def _list_resources(
    server: MCPServer[Services],
    ctx: ServerRequestContext[Services, Any],
    params: types.PaginatedRequestParams | None,
) -> types.ListResourcesResult:
    """``resources/list``: the resources registered up front, then the :data:`RECENT_RUNS` newest
    runs the caller may read (none without the ``read`` role)."""
    static = await server.list_resources()
    caller = caller_of(ctx.request)
    if "read" not in caller.roles:
        return types.ListResourcesResult(resources=static)
    try:
        page = await ctx.lifespan_context.runtime.list_runs(None, RECENT_RUNS)
    except ConstructError as exc:
        raise as_protocol_error(exc) from None
    runs = [run_resource(head) for head in page.runs if caller.may_see(head)]
    return types.ListResourcesResult(resources=[*static, *runs])

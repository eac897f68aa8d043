"""Runs as MCP resources: ``run://{run_id}`` is the run's :class:`~server.views.RunView` as JSON
(the compact view the tools answer with), and ``run://{run_id}/tasks/{task_id}/output`` is one
task's whole output, verbatim, as ``text/plain`` (the URI each view gives as ``output_uri``). An
output never changes once recorded, so only ``run://{run_id}`` is worth subscribing to.

Subscribers hear about every change this process writes to the run (the runtime calls
:meth:`~server.services.Services.publish_change` after each write):

* 2026-07-28 clients open ``subscriptions/listen`` with the run's URI; the SDK serves it from the
  subscription bus the app gives the server.
* Handshake-era clients send ``resources/subscribe``; ``MCPServer`` has no handler for it, so one
  is registered on its low-level server here, remembering the client's session so that
  ``notifications/resources/updated`` can be sent on it (only ``run://<run id>``, at most
  ``CONSTRUCT_MAX_SUBSCRIPTIONS`` per session, forgotten when the session ends: see
  :mod:`server.watch`).

Changes made by *other* processes on the same store (the CLI, another server) are announced too,
within about one poll interval: :class:`~server.watch.RunSubscriptions` polls the subscribed runs.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server import MCPServer
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError

from orchestration.errors import ConstructError, InvalidArgument, InvalidState, RunNotFound
from orchestration.ids import validate_run_id
from orchestration.vocabulary import TaskStatus
from server.services import Services
from server.views import check_task_id
from server.watch import LegacySubscribers, RunSubscriptions, as_protocol_error

ResourceContext = Context[Services, Any]


async def read_run(run_id: str, ctx: ResourceContext) -> str:
    """A run: status, next_action, tasks with output previews, gates and warnings (the compact
    run_status view)."""
    services: Services = ctx.request_context.lifespan_context
    try:
        view = await services.view(run_id)
    except (RunNotFound, InvalidArgument) as exc:
        raise ResourceNotFoundError(f"{exc.code}: {exc.message}") from None
    except ConstructError as exc:
        raise ResourceError(f"{exc.code}: {exc.message}") from None
    return view.model_dump_json()


async def read_task_output(run_id: str, task_id: str, ctx: ResourceContext) -> str:
    """One task's whole output, verbatim (the view's ``output_uri``)."""
    services: Services = ctx.request_context.lifespan_context
    try:
        head = await services.runtime.status(validate_run_id(run_id))
        task = check_task_id(head, task_id)
        if task.status != TaskStatus.DONE or task.output_seq is None:
            raise InvalidState(
                f"task {task.task_id!r} of run {head.run_id} has no output: it is {task.status.value}"
            )
        outputs = await services.runtime.outputs(head, [task.task_id])
    except (RunNotFound, InvalidArgument, InvalidState) as exc:
        raise ResourceNotFoundError(f"{exc.code}: {exc.message}") from None
    except ConstructError as exc:
        raise ResourceError(f"{exc.code}: {exc.message}") from None
    return outputs[task.task_id]


def register_resources(
    server: MCPServer[Services], legacy: LegacySubscribers, subscriptions: RunSubscriptions
) -> None:
    server.resource(
        "run://{run_id}",
        name="run",
        title="A construct-mcp run",
        description="The run's status, next action, tasks, gates and warnings (JSON); subscribe for updates.",
        mime_type="application/json",
    )(read_run)
    server.resource(
        "run://{run_id}/tasks/{task_id}/output",
        name="task_output",
        title="A task's output",
        description="One task's whole output, verbatim (a run view's tasks[].output_uri).",
        mime_type="text/plain",
    )(read_task_output)

    async def subscribe(
        ctx: ServerRequestContext[Services, Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        try:
            legacy.add(str(params.uri), ctx.session)  # run:// URIs only, capped, ends with the session
        except ConstructError as exc:
            raise as_protocol_error(exc) from None
        await subscriptions.add([str(params.uri)], listening=False)
        return types.EmptyResult()

    async def unsubscribe(
        ctx: ServerRequestContext[Services, Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        legacy.remove(str(params.uri), ctx.session)
        return types.EmptyResult()

    # MCPServer exposes no hook for the handshake-era subscribe methods; its low-level server does.
    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)

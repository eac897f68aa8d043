"""A task-aware MCP client for the tests, built from the SDK's client: it declares
``io.modelcontextprotocol/tasks`` (SEP-2663) in its capabilities, accepts a ``CreateTaskResult``
(``resultType: "task"``) from ``tools/call`` and sends ``tasks/get``, ``tasks/update`` and
``tasks/cancel`` as raw requests (the SDK does not ship the extension). A plain ``Client`` declares
nothing and gets today's answers.

Every answer is checked against the extension's own JSON Schema (:func:`conforms`):
``tests/conformance/ext-tasks.schema.json`` is ``schema/draft/schema.json`` of
``modelcontextprotocol/ext-tasks`` at commit ``e4345978be1f602f1fc48d89051e8559dd5302a6``
(Apache-2.0), unchanged."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal

import jsonschema  # type: ignore[import-untyped]  # ships no type information
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.types import (
    CallToolResult,
    Request,
    RequestParams,
    Result,
    SubscriptionFilter,
    SubscriptionsListenRequest,
    SubscriptionsListenRequestParams,
)
from pydantic import ConfigDict

EXTENSION_ID = "io.modelcontextprotocol/tasks"
SCHEMA = Path(__file__).resolve().parents[1] / "conformance" / "ext-tasks.schema.json"


@cache
def _validator(definition: str) -> Any:
    defs = json.loads(SCHEMA.read_text("utf-8"))["$defs"]
    return jsonschema.Draft202012Validator({"$defs": defs, "$ref": f"#/$defs/{definition}"})


def conforms(definition: str, message: dict[str, Any]) -> dict[str, Any]:
    """``message``, once it is checked to be a valid ``definition`` of the extension's schema
    (``GetTaskResult``, ``CreateTaskResult``, ...)."""
    errors = [e.message for e in _validator(definition).iter_errors(message)]
    assert not errors, (definition, errors[:3], message)
    return message


class CreatedTask(Result):
    """A ``CreateTaskResult``: the task's seed state (other fields kept as they came)."""

    model_config = ConfigDict(extra="allow")

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None


class _Answer(Result):
    """Any result, its fields kept as they came (``tasks/*`` answers)."""

    model_config = ConfigDict(extra="allow")


class _TaskParams(RequestParams):
    task_id: str


class _UpdateParams(RequestParams):
    task_id: str
    input_responses: dict[str, Any]


class _Get(Request[_TaskParams, Literal["tasks/get"]]):
    # Streamable HTTP: Mcp-Name carries the task id (SEP-2663, "Routing Headers").
    name_param: ClassVar[str | None] = "taskId"
    method: Literal["tasks/get"] = "tasks/get"
    params: _TaskParams


class _Cancel(Request[_TaskParams, Literal["tasks/cancel"]]):
    name_param: ClassVar[str | None] = "taskId"
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: _TaskParams


class _Update(Request[_UpdateParams, Literal["tasks/update"]]):
    name_param: ClassVar[str | None] = "taskId"
    method: Literal["tasks/update"] = "tasks/update"
    params: _UpdateParams


async def _resolve(task: CreatedTask, ctx: ClaimContext) -> CallToolResult:
    raise AssertionError(f"the tests take task {task.task_id} with allow_claimed=True")


class TasksClient(ClientExtension):
    """Declares the extension and claims the ``task`` result shape."""

    identifier = EXTENSION_ID

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=CreatedTask, resolve=_resolve),)


async def start_task(client: Client, tool: str, **arguments: Any) -> CreatedTask | CallToolResult:
    """Call ``tool``; a task-aware client may get a task back."""
    result = await client.session.call_tool(tool, arguments, allow_input_required=False, allow_claimed=True)
    assert isinstance(result, CreatedTask | CallToolResult), result
    if isinstance(result, CreatedTask):
        conforms("CreateTaskResult", result.model_dump(by_alias=True, mode="json"))
    return result


async def _send(client: Client, request: _Get | _Update | _Cancel, definition: str) -> dict[str, Any]:
    answer = await client.session.send_request(request, _Answer)
    return conforms(definition, answer.model_dump(by_alias=True, mode="json"))


async def get_task(client: Client, task_id: str) -> dict[str, Any]:
    """``tasks/get``: the task as the server answers it (wire keys)."""
    return await _send(client, _Get(params=_TaskParams(task_id=task_id)), "GetTaskResult")


async def update_task(client: Client, task_id: str, responses: dict[str, Any]) -> dict[str, Any]:
    """``tasks/update`` with ``inputResponses``: the (empty) acknowledgement."""
    request = _Update(params=_UpdateParams(task_id=task_id, input_responses=responses))
    return await _send(client, request, "UpdateTaskResult")


async def cancel_task(client: Client, task_id: str) -> dict[str, Any]:
    """``tasks/cancel``: the (empty) acknowledgement."""
    return await _send(client, _Cancel(params=_TaskParams(task_id=task_id)), "CancelTaskResult")


async def listen_for_tasks(client: Client, task_ids: list[str]) -> dict[str, Any]:
    """``subscriptions/listen`` asking for ``notifications/tasks`` of ``task_ids`` (the SDK's
    ``listen`` has no ``taskIds``): answers when the stream ends, or raises the refusal."""
    notifications = SubscriptionFilter.model_validate({"taskIds": task_ids})
    request = SubscriptionsListenRequest(params=SubscriptionsListenRequestParams(notifications=notifications))
    answer = await client.session.send_request(request, _Answer)
    return answer.model_dump(by_alias=True, mode="json")

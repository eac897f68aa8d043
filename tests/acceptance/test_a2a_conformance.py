"""The A2A 1.0 specification's MUSTs for the methods this server serves, checked on the wire: raw
JSON-RPC over HTTP (no SDK between, to hide or forgive a mistake) against a real server process.

These stand in for the official A2A TCK (``a2aproject/a2a-tck``), which is published on no package
registry (neither PyPI nor npm has it), so it cannot be pinned and installed here. Each test names
the sections of the specification it holds: the agent card (§8, §4.4), the JSON-RPC envelope and
error codes (§9.5, §5.4), capability refusals (§3.3.4: push notifications and the extended card
are not offered), a task that has ended (§3.1.1, §3.1.5, §3.1.6), message and context ids (§3.4),
the SSE stream (§9.4.2, §3.1.2), ``A2A-Version`` (§3.6) and ``ListTasks`` (§3.1.4).

Known gaps, not checked: ``ListTasks`` (§3.1.4) pages the runs newest *started* first, as the
stores list them, where the specification says newest *status* first; and its ``totalSize`` counts
the tasks of the page, not all the tasks that match (the stores count nothing, and each run is
filtered by who may read it). Both need the stores' listing to change."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.acceptance.test_a2a_face import ALICE, TOKENS, served

pytestmark = pytest.mark.slow

V1 = {"A2A-Version": "1.0"}
STREAM = {**V1, "Accept": "text/event-stream"}
TERMINAL = {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"}
INTERRUPTED = {"TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED"}
EVENTS = {"task", "message", "statusUpdate", "artifactUpdate"}


class Rpc:
    """JSON-RPC calls to ``/a2a``, each answer checked as a JSON-RPC 2.0 response to its request."""

    def __init__(self, http: httpx.AsyncClient, base: str) -> None:
        self.http = http
        self.url = f"{base}/a2a"
        self._ids = 0

    async def post(self, body: Any, headers: dict[str, str] | None = None, url: str | None = None) -> Any:
        """POST ``body`` (a string is sent as it is): the parsed answer, HTTP 200 JSON."""
        content = body if isinstance(body, str) else json.dumps(body)
        sent = {"Content-Type": "application/json", **(V1 if headers is None else headers)}
        answer = await self.http.post(url or self.url, content=content, headers=sent)
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("application/json"), answer.headers
        return answer.json()

    async def call(
        self, method: str, params: Any = None, headers: dict[str, str] | None = None, url: str | None = None
    ) -> dict[str, Any]:
        self._ids += 1
        request_id = f"req-{self._ids}"
        request = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            request["params"] = params
        answer = await self.post(request, headers, url)
        envelope(answer, request_id)
        assert isinstance(answer, dict)
        return answer

    async def result(self, method: str, params: Any = None, headers: dict[str, str] | None = None) -> Any:
        answer = await self.call(method, params, headers)
        assert "result" in answer, answer
        return answer["result"]

    async def error(
        self, code: int, method: str, params: Any = None, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        answer = await self.call(method, params, headers)
        return error_of(answer, code)


def envelope(answer: Any, request_id: Any) -> None:
    """§9.3/§9.5: a JSON-RPC 2.0 response with the request's id and a result or an error."""
    assert isinstance(answer, dict) and answer.get("jsonrpc") == "2.0", answer
    assert answer.get("id") == request_id, answer
    assert ("result" in answer) != ("error" in answer), answer


def error_of(answer: dict[str, Any], code: int) -> dict[str, Any]:
    """§9.5: the error object: the code, a message, and details as ``@type``-tagged objects."""
    assert "error" in answer, answer
    error = answer["error"]
    assert isinstance(error, dict) and error["code"] == code, answer
    assert isinstance(error["message"], str) and error["message"], answer
    if "data" in error:
        assert isinstance(error["data"], list), answer
        assert all(isinstance(d, dict) and d.get("@type") for d in error["data"]), answer
    return error


def user_message(text: str, message_id: str, **fields: Any) -> dict[str, Any]:
    return {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}], **fields}


async def start(
    rpc: Rpc, text: str, message_id: str, *, at_once: bool = False, **fields: Any
) -> dict[str, Any]:
    """A task started by a message (``SendMessage``; blocking unless ``at_once``)."""
    params: dict[str, Any] = {"message": user_message(text, message_id, **fields)}
    if at_once:
        params["configuration"] = {"returnImmediately": True}
    result = await rpc.result("SendMessage", params)
    assert set(result) == {"task"}, result
    task: dict[str, Any] = result["task"]
    return task


def questions(task: dict[str, Any]) -> list[dict[str, Any]]:
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", task
    data = [p["data"] for p in task["status"]["message"]["parts"] if "data" in p]
    return list(data[0]["questions"])


def reply_to(task: dict[str, Any], message_id: str, **fields: Any) -> dict[str, Any]:
    """The message answering the task's first question (a host task's output, a gate's approval)."""
    asked = questions(task)[0]
    if asked["kind"] == "host_task":
        text, metadata = f"[conformance] {asked['task_id']}", {"task_id": asked["task_id"]}
    else:
        text, metadata = "Approved.", {"gate_id": asked["gate_id"], "decision": "approve"}
    fields = {"taskId": task["id"], "contextId": task["contextId"], **fields}
    return user_message(text, message_id, metadata=metadata, **fields)


async def to_the_end(rpc: Rpc, task: dict[str, Any], prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The task once every question is answered (``SendMessage``), and the last reply sent."""
    sent: dict[str, Any] = {}
    for n in range(10):
        if task["status"]["state"] != "TASK_STATE_INPUT_REQUIRED":
            return task, sent
        sent = reply_to(task, f"{prefix}-{n}")
        task = (await rpc.result("SendMessage", {"message": sent}))["task"]
    raise AssertionError(f"more than 10 questions: {task}")


async def sse(
    http: httpx.AsyncClient, url: str, method: str, params: Any, request_id: Any
) -> tuple[httpx.Response, list[Any]]:
    """A streaming call: the response and the JSON of each event's data, read until it closes."""
    request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    async with http.stream("POST", url, json=request, headers=STREAM) as answer:
        body = (await answer.aread()).decode()
    if not answer.headers["content-type"].startswith("text/event-stream"):
        return answer, [json.loads(body)]
    events = []
    for block in re.split(r"\r?\n\r?\n", body):
        data = [line[5:].removeprefix(" ") for line in block.splitlines() if line.startswith("data:")]
        if data:
            events.append(json.loads("\n".join(data)))
    return answer, events


def state_of(event: dict[str, Any]) -> str | None:
    result = event["result"]
    found = result.get("task") or result.get("statusUpdate")
    return None if found is None else str(found["status"]["state"])


@asynccontextmanager
async def conversation(tmp_path: Any, config: str = "", token: str | None = None) -> AsyncIterator[Rpc]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with served(tmp_path, config) as base, httpx.AsyncClient(headers=headers, timeout=90) as http:
        yield Rpc(http, base)


def keys_of(value: Any) -> set[str]:
    """Every key of every object in ``value`` (maps whose keys are names are skipped by the caller)."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys_of(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys_of(v)}
    return set()


async def test_the_agent_card_and_authentication(tmp_path: Any) -> None:
    """§8.2 the well-known path, §4.4 and a2a.proto's REQUIRED fields, §5.5 camelCase, §3.3.4 the
    capabilities, §7 the bearer scheme declared and every request without it refused."""
    async with conversation(tmp_path, TOKENS) as rpc:
        base = rpc.url.removesuffix("/a2a")
        answer = await rpc.http.get(f"{base}/.well-known/agent-card.json")
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
        card = answer.json()
        for field in ("name", "description", "version"):
            assert isinstance(card[field], str) and card[field], field
        assert card["defaultInputModes"] and card["defaultOutputModes"]
        assert card["provider"]["url"] and card["provider"]["organization"]
        [interface] = card["supportedInterfaces"]
        assert interface == {"url": rpc.url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        assert card["skills"]
        for skill in card["skills"]:
            assert skill["id"] and skill["name"] and skill["description"] and skill["tags"], skill
        assert card["capabilities"]["streaming"] is True
        assert card["capabilities"]["pushNotifications"] is False
        assert not card["capabilities"].get("extendedAgentCard")
        named = set(card.get("securitySchemes", {}))
        assert named == {"bearer"}
        assert card["securitySchemes"]["bearer"] == {"httpAuthSecurityScheme": {"scheme": "Bearer"}}
        assert [set(r["schemes"]) for r in card["securityRequirements"]] == [named]
        assert not {k for k in keys_of(card) - named if "_" in k}, "JSON field names are camelCase"

        request = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "run-none"}}
        for token in (None, "not-a-token"):
            headers = {**V1} if token is None else {**V1, "Authorization": f"Bearer {token}"}
            refused = await rpc.http.post(rpc.url, json=request, headers=headers)
            assert refused.status_code == 401, refused.text
            assert refused.headers["www-authenticate"].startswith("Bearer")
        alice = {**V1, "Authorization": f"Bearer {ALICE}"}
        allowed = await rpc.http.post(rpc.url, json=request, headers=alice)
        error_of(allowed.json(), -32001)


async def test_the_json_rpc_envelope_errors(tmp_path: Any) -> None:
    """§9.5's standard codes: -32700 parse error (id null), -32600 invalid request, -32601 method
    not found, -32602 invalid params; each error's details are ``@type``-tagged objects."""
    async with conversation(tmp_path) as rpc:
        parse = await rpc.post("{not json")
        envelope(parse, None)
        error_of(parse, -32700)
        no_method = await rpc.post({"jsonrpc": "2.0", "id": 3})
        envelope(no_method, 3)
        error_of(no_method, -32600)
        old = await rpc.post({"jsonrpc": "1.0", "id": 4, "method": "GetTask", "params": {"id": "run-x"}})
        envelope(old, 4)
        error_of(old, -32600)
        error_of(await rpc.post([]), -32600)
        await rpc.error(-32601, "NoSuchMethod", {})
        await rpc.error(-32602, "GetTask", {"id": 5})
        await rpc.error(-32602, "GetTask", {})
        await rpc.error(-32602, "CancelTask", {})
        await rpc.error(-32602, "SendMessage", {})
        await rpc.error(-32602, "SendMessage", {"message": {"role": "ROLE_USER", "parts": [{"text": "x"}]}})
        await rpc.error(-32602, "SendMessage", {"message": user_message("", "m-empty")})
        await rpc.error(-32602, "SendMessage", {"message": {**user_message("x", "m-no-parts"), "parts": []}})


async def test_the_a2a_error_codes_and_what_is_not_offered(tmp_path: Any) -> None:
    """§5.4's codes: -32001 for a task that does not exist, whatever the method; §3.3.4: -32003 for
    every push-notification method (the card says pushNotifications false) and -32004 for the
    extended card (the card does not declare it)."""
    async with conversation(tmp_path) as rpc:
        await rpc.error(-32001, "GetTask", {"id": "run-nope"})
        await rpc.error(-32001, "GetTask", {"id": "NOT A RUN ID!"})
        await rpc.error(-32001, "CancelTask", {"id": "run-nope"})
        await rpc.error(-32001, "SendMessage", {"message": user_message("x", "m-1", taskId="run-nope")})
        for method in ("SubscribeToTask", "SendStreamingMessage"):
            params: Any = {"id": "run-nope"}
            if method == "SendStreamingMessage":
                params = {"message": user_message("x", "m-2", taskId="run-nope")}
            _, [event] = await sse(rpc.http, rpc.url, method, params, f"s-{method}")
            envelope(event, f"s-{method}")
            error_of(event, -32001)
        config = {"taskId": "run-nope", "url": "http://127.0.0.1:9/hook"}
        await rpc.error(-32003, "CreateTaskPushNotificationConfig", config)
        await rpc.error(-32003, "GetTaskPushNotificationConfig", {"taskId": "run-nope", "id": "c"})
        await rpc.error(-32003, "ListTaskPushNotificationConfigs", {"taskId": "run-nope"})
        await rpc.error(-32003, "DeleteTaskPushNotificationConfig", {"taskId": "run-nope", "id": "c"})
        await rpc.error(-32004, "GetExtendedAgentCard", {})


async def test_a_task_that_has_ended_never_changes(tmp_path: Any) -> None:
    """§3.1.5: CancelTask of a completed task is -32002 TaskNotCancelable; §3.1.1/§3.1.6: a message
    to an ended task and SubscribeToTask are -32004 UnsupportedOperation; its state and artifacts
    never change. §3.3.1: a resent message (same messageId) may be answered as the first was, and
    a cancel asked again has the same effect."""
    async with conversation(tmp_path) as rpc:
        task = await start(rpc, "Add a health endpoint.", "m-1")
        task, last = await to_the_end(rpc, task, "r")
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        assert {a["artifactId"] for a in task["artifacts"]} == {"architect", "engineer", "reviewer"}
        seen = await rpc.result("GetTask", {"id": task["id"]})
        assert seen == task

        await rpc.error(-32002, "CancelTask", {"id": task["id"]})
        await rpc.error(-32004, "SubscribeToTask", {"id": task["id"]})
        later = {**last, "messageId": "r-later", "parts": [{"text": "another output"}]}
        await rpc.error(-32004, "SendMessage", {"message": later})
        bare = user_message("More, please.", "r-bare", taskId=task["id"], contextId=task["contextId"])
        await rpc.error(-32004, "SendMessage", {"message": bare})
        _, [streamed] = await sse(rpc.http, rpc.url, "SendStreamingMessage", {"message": bare}, "s-1")
        error_of(streamed, -32004)
        again = await rpc.result("SendMessage", {"message": last})
        assert again["task"] == task, "a resent reply answers as the first did"
        assert await rpc.result("GetTask", {"id": task["id"]}) == task

        other = await start(rpc, "Another one.", "m-2", at_once=True)
        cancelled = await rpc.result("CancelTask", {"id": other["id"]})
        assert cancelled["id"] == other["id"] and cancelled["status"]["state"] == "TASK_STATE_CANCELED"
        # §3.3.1: a cancel is idempotent: asked again, the same canceled task
        assert await rpc.result("CancelTask", {"id": other["id"]}) == cancelled
        answer = user_message("x", "r-x", taskId=other["id"], metadata={"task_id": "architect"})
        await rpc.error(-32004, "SendMessage", {"message": answer})
        assert await rpc.result("GetTask", {"id": other["id"]}) == cancelled


async def test_message_and_context_ids(tmp_path: Any) -> None:
    """§3.4.1: a contextId given is kept, one generated is returned; §3.4.2: a task id per task;
    §3.4.3: a reply whose contextId is not its task's is refused, one with only the taskId takes
    the task's; §4.1.4 the status message's ids and role; §5.6.1 timestamps in UTC."""
    async with conversation(tmp_path) as rpc:
        task = await start(rpc, "Add a health endpoint.", "m-1", contextId="ctx-conf")
        assert task["id"] and task["contextId"] == "ctx-conf"
        status = task["status"]["message"]
        assert status["messageId"] and status["role"] == "ROLE_AGENT"
        assert status["taskId"] == task["id"] and status["contextId"] == "ctx-conf"
        assert task["status"]["timestamp"].endswith("Z")
        assert datetime.fromisoformat(task["status"]["timestamp"]).utcoffset() is not None
        resent = await start(rpc, "Add a health endpoint.", "m-1", contextId="ctx-conf")
        assert resent["id"] == task["id"], "the same message is the same task"
        own = await start(rpc, "Another.", "m-2", at_once=True)
        assert own["id"] != task["id"] and own["contextId"], "a generated contextId is returned"

        stranger = reply_to(task, "r-0", contextId="ctx-other")
        await rpc.error(-32602, "SendMessage", {"message": stranger})
        assert await rpc.result("GetTask", {"id": task["id"]}) == task, "a refused reply changes nothing"
        inferred = reply_to(task, "r-1")
        del inferred["contextId"]
        moved = (await rpc.result("SendMessage", {"message": inferred}))["task"]
        assert moved["contextId"] == "ctx-conf" and moved["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert moved["status"]["message"]["messageId"] != status["messageId"]
        assert [a["artifactId"] for a in moved["artifacts"]] == ["architect"]


async def test_a_stream_is_server_sent_json_rpc_responses(tmp_path: Any) -> None:
    """§9.4.2: ``text/event-stream`` whose events are each a JSON-RPC response with the request's
    id; §3.1.2: it begins with the task, carries status and artifact updates of that task, and
    ends once the task is interrupted or ended; §3.1.6: SubscribeToTask begins with the task."""
    async with conversation(tmp_path) as rpc:
        params: dict[str, Any] = {"message": user_message("Stream it.", "m-1", contextId="ctx-s")}
        finals = []
        for n in range(10):
            request_id = f"stream-{n}"
            answer, events = await sse(rpc.http, rpc.url, "SendStreamingMessage", params, request_id)
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("text/event-stream")
            assert events, "a stream carries at least the task"
            for event in events:
                envelope(event, request_id)
                assert len(event["result"]) == 1 and set(event["result"]) <= EVENTS, event
            first = events[0]["result"]["task"]
            for event in events[1:]:
                update = event["result"].get("statusUpdate") or event["result"]["artifactUpdate"]
                assert update["taskId"] == first["id"] and update["contextId"] == "ctx-s", event
            states = [s for s in map(state_of, events) if s is not None]
            assert not set(states[:-1]) & (TERMINAL | INTERRUPTED), "the stream ends at the first stop"
            finals.append(states[-1])
            if states[-1] in TERMINAL:
                break
            if n == 0:  # subscribing to the interrupted task: the task first, as it is now
                _, subscribed = await sse(rpc.http, rpc.url, "SubscribeToTask", {"id": first["id"]}, "sub")
                envelope(subscribed[0], "sub")
                assert subscribed[0]["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
            task = await rpc.result("GetTask", {"id": first["id"]})
            params = {"message": reply_to(task, f"r-{n}")}
        assert finals == [*["TASK_STATE_INPUT_REQUIRED"] * 3, "TASK_STATE_COMPLETED"]


async def test_the_a2a_version_service_parameter(tmp_path: Any) -> None:
    """§3.6.2: a request is served on the version it names (Major.Minor; a patch is not considered;
    as a header, any case, or a query parameter); an empty one means 0.3; a version not served is
    -32009 VersionNotSupported."""
    async with conversation(tmp_path) as rpc:
        task = await start(rpc, "Versions.", "m-1", at_once=True)
        got = {"id": task["id"]}
        for headers in ({"A2A-Version": "1.0"}, {"a2a-version": "1.0"}, {"A2A-Version": "1.0.2"}):
            assert (await rpc.result("GetTask", got, headers))["id"] == task["id"], headers
        by_query = await rpc.call("GetTask", got, {}, url=f"{rpc.url}?A2A-Version=1.0")
        assert by_query["result"]["id"] == task["id"], by_query
        refused = await rpc.error(-32009, "GetTask", got, {"A2A-Version": "0.5"})
        assert "0.5" in refused["message"]
        await rpc.error(-32009, "GetTask", got, {})  # no version: 0.3, which has no GetTask
        for headers in ({}, {"A2A-Version": "0.3"}):  # the 0.3 names, on 0.3's wire format
            old = await rpc.result("tasks/get", got, headers)
            assert old["id"] == task["id"] and old["kind"] == "task", old
            assert old["status"]["state"] == "input-required", old


async def test_list_tasks(tmp_path: Any) -> None:
    """§3.1.4: nextPageToken always present (empty on the last page), artifacts left out unless
    asked for, cursor pages, the contextId, status and statusTimestampAfter filters; pageSize
    outside 1..100, a negative historyLength or a foreign pageToken is -32602."""
    async with conversation(tmp_path) as rpc:
        mine = [(await start(rpc, f"Listed {n}.", f"m-{n}", contextId="ctx-list")) for n in range(3)]
        other = await start(rpc, "Elsewhere.", "m-other")  # blocking: settled before the cancel
        cancelled = await rpc.result("CancelTask", {"id": mine[1]["id"]})

        listed = await rpc.result("ListTasks", {})
        assert listed["nextPageToken"] == "" and listed["pageSize"] == 50
        assert listed["totalSize"] >= len(listed["tasks"]) == 4
        assert all("artifacts" not in t for t in listed["tasks"])

        pages: list[str] = []
        token = ""
        while True:
            params = {"pageSize": 3} | ({"pageToken": token} if token else {})
            page = await rpc.result("ListTasks", params)
            assert page["pageSize"] == 3 and len(page["tasks"]) <= 3 and "nextPageToken" in page
            pages.extend(t["id"] for t in page["tasks"])
            token = page["nextPageToken"]
            if not token:
                break
        assert pages == [t["id"] for t in listed["tasks"]]

        in_context = await rpc.result("ListTasks", {"contextId": "ctx-list"})
        assert {t["id"] for t in in_context["tasks"]} == {t["id"] for t in mine}
        assert other["id"] not in {t["id"] for t in in_context["tasks"]}
        stopped = await rpc.result("ListTasks", {"status": "TASK_STATE_CANCELED"})
        assert [t["id"] for t in stopped["tasks"]] == [cancelled["id"]]
        since = cancelled["status"]["timestamp"]
        recent = await rpc.result("ListTasks", {"statusTimestampAfter": since})
        assert [t["id"] for t in recent["tasks"]] == [cancelled["id"]]
        future = await rpc.result("ListTasks", {"statusTimestampAfter": "2999-01-01T00:00:00Z"})
        assert future["tasks"] == []
        with_artifacts = await rpc.result("ListTasks", {"includeArtifacts": True, "contextId": "ctx-list"})
        assert len(with_artifacts["tasks"]) == 3

        for bad in ({"pageSize": 0}, {"pageSize": -1}, {"pageSize": 101}, {"historyLength": -1}):
            await rpc.error(-32602, "ListTasks", bad)
        await rpc.error(-32602, "ListTasks", {"pageToken": "not-a-token-this-server-gave"})

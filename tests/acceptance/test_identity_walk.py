"""Every endpoint, with every kind of identity, against a run another identity owns (issue 22:
findings 7, 8 and 13, over a real Streamable HTTP server).

The run is ``owner``'s (an identity limited to its own runs), waiting at a gate after a host task
whose request and output carry markers. Each identity kind — every role, ``read`` only,
``operate`` only, ``approve`` only, the owner, another identity limited to its own runs, and no
token — walks every tool, resource template and prompt the server lists (a tool, template or
prompt the tables below do not cover fails the test), the subscriptions of both protocol eras,
the MCP Task methods (``tasks/*``) and the run page endpoints (``/runs``, ``/runs/api/*``), each
against a fresh run of the owner's. The rule checked for each answer:

* a call the identity's roles (and ``own_runs_only``) allow is answered (a success, or a coded
  error about the run's state such as ``invalid_state``); any other is refused with a coded
  ``forbidden``, a not-found (``run_not_found``, "Task not found") or ``401``;
* no answer to an identity that may not read the run's content (``read`` and allowed to see the
  run, or its owner) carries any of it: neither the request nor the output (previews and prompts
  included);
* an idempotency key the owner used is another key for anyone else: their start is a run of their
  own, and no answer names the owner's run.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning

from server.mcp.tasks import TasksExtension
from tests.acceptance.harness import call, play_host, text_of
from tests.acceptance.task_client import TasksClient, cancel_task, get_task, update_task
from tests.acceptance.test_mcp_http import http_server

pytestmark = pytest.mark.slow

SECRET_REQUEST = "walk-secret-request-5e1d0a"
SECRET_OUTPUT = "walk-secret-output-c7a9f3"
SECRETS = (SECRET_REQUEST, SECRET_OUTPUT)
GATE = "before:writer"
ALL = ("read", "operate", "approve")


@dataclass(frozen=True)
class Kind:
    """An identity kind: its token's roles and limit (None: no token at all)."""

    name: str
    roles: tuple[str, ...]
    own_runs_only: bool = False

    @property
    def token(self) -> str | None:
        return None if self.name == "anonymous" else f"{self.name}-token-8d2c4e6f1a3b5c7d"

    @property
    def may_see(self) -> bool:
        """Whether the owner's run is one this identity may see (``own_runs_only``)."""
        return not self.own_runs_only or self.name == "owner"

    @property
    def reads_content(self) -> bool:
        return ("read" in self.roles and self.may_see) or self.name == "owner"


KINDS = (
    Kind("full", ALL),
    Kind("reader", ("read",)),
    Kind("operator", ("operate",)),
    Kind("approver", ("approve",)),
    Kind("owner", ALL, own_runs_only=True),
    Kind("other", ALL, own_runs_only=True),
    Kind("anonymous", ()),
)

CONFIG = "".join(
    f'[tokens.{k.name}]\ntoken = "{k.token}"\nroles = {json.dumps(list(k.roles))}\n'
    + ("own_runs_only = true\n" if k.own_runs_only else "")
    for k in KINDS
    if k.token is not None
)


@dataclass(frozen=True)
class Need:
    """What an endpoint needs: a role (None: only a valid token), whether it acts on the owner's
    run (then ``own_runs_only`` applies), and whether it copies the run's content (a fork)."""

    role: str | None
    on_run: bool = True
    content: bool = False
    #: False: answered without a token too (the pages themselves, which hold no data)
    token: bool = True

    def allows(self, kind: Kind) -> bool:
        if not self.token:
            return True
        if kind.token is None:
            return False
        if self.role is not None and self.role not in kind.roles:
            return False
        if self.on_run and not kind.may_see:
            return False
        return not self.content or kind.reads_content


#: Each tool: what it needs, and its arguments against the run (``{run}``), in the order walked:
#: reads first, then what changes the run, cancel last.
TOOLS: dict[str, tuple[Need, dict[str, Any]]] = {
    "run_status": (Need("read"), {"run_id": "{run}", "detail": "full"}),
    "run_events": (Need("read"), {"run_id": "{run}"}),
    # the task waits at a gate, not for the host: an identity that may read it gets invalid_state
    "task_prompt": (Need("read", content=True), {"run_id": "{run}", "task_id": "writer"}),
    "runs_list": (Need("read", on_run=False), {}),
    "orchestrate_start": (
        Need("operate", on_run=False),
        {"request": "another request", "chain": ["writer"], "idempotency_key": "{key}", "wait_seconds": 0},
    ),
    "orchestrate_fork": (
        Need("operate", content=True),
        {"run_id": "{run}", "from_task": "writer", "idempotency_key": "{key}", "wait_seconds": 0},
    ),
    "orchestrate_resume": (
        Need("operate"),
        {"run_id": "{run}", "task_id": "writer", "output": "early", "wait_seconds": 0},
    ),
    "orchestrate_approve": (
        Need("approve"),
        {"run_id": "{run}", "gate_id": GATE, "decision": "approve", "wait_seconds": 5},
    ),
    "orchestrate_upgrade": (Need("operate"), {"run_id": "{run}"}),  # a dry run: changes nothing
    "orchestrate_cancel": (Need("operate"), {"run_id": "{run}", "reason": "walked"}),
}
#: Each resource template, and what reading it needs.
TEMPLATES: dict[str, Need] = {
    "run://{run_id}": Need("read"),
    "run://{run_id}/tasks/{task_id}/output": Need("read"),
    "run://{run_id}/events": Need("read"),
    "run://{run_id}/export": Need("read"),
}
#: The MCP Task methods, and what each needs.
TASK_METHODS: dict[str, Need] = {
    "tasks/get": Need("read"),
    "tasks/update": Need("approve"),
    "tasks/cancel": Need("operate"),
}
#: The run page endpoints: (method, path under /runs, body) and what each needs.
PAGES: dict[tuple[str, str], Need] = {
    ("GET", ""): Need(None, on_run=False, token=False),
    ("GET", "/{run}"): Need(None, on_run=False, token=False),
    ("GET", "/api/session"): Need(None, on_run=False),
    ("GET", "/api/runs"): Need("read", on_run=False),
    ("GET", "/api/runs/{run}"): Need("read"),
    ("GET", "/api/runs/{run}?task_id=architect"): Need("read"),
    ("POST", "/api/runs/{run}/gates/" + GATE): Need("approve"),
}
#: a prompt needs only a valid token
PROMPT = Need(None, on_run=False)
SUBSCRIBE = Need("read")

#: What a refusal starts with (a tool's text, a JSON-RPC error's message, a page's error code).
REFUSALS = ("forbidden", "run_not_found", "unauthorized", "Failed to retrieve task: Task not found")


@dataclass
class Answer:
    """What one call got: refused (a coded refusal) or not, and every byte of its answer."""

    endpoint: str
    refused: bool
    text: str


@dataclass
class Walk:
    """The answers one identity kind got."""

    kind: Kind
    run_id: str
    answers: list[Answer]
    #: what broke the rule (reported together at the end, outside the clients' task groups)
    broken: list[str]

    @property
    def key(self) -> str:
        """The idempotency key the owner started the run with, which this walk sends too."""
        return f"walk-key-{self.kind.name}"

    def fill(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return {name: fill(value, self.run_id, self.key) for name, value in arguments.items()}

    def add(self, endpoint: str, refused: bool, text: str) -> None:
        self.answers.append(Answer(endpoint, refused, text))

    async def expect(self, endpoint: str, need: Need, answer: Awaitable[tuple[bool, str]]) -> None:
        """Record the answer to one call (``answer``), checking that it is refused exactly when
        ``need`` does not allow this identity kind."""
        refused, text = await answer
        self.add(endpoint, refused, text)
        if refused == need.allows(self.kind):
            self.broken.append(f"{self.kind.name} {endpoint}: refused={refused}: {text[:300]}")

    def check(self, allowed: bool, what: str) -> None:
        if not allowed:
            self.broken.append(f"{self.kind.name}: {what}")

    def check_content(self) -> None:
        """No answer to an identity that may not read the run's content carries any of it."""
        if self.kind.reads_content:
            return
        for answer in self.answers:
            shown = [secret for secret in SECRETS if secret in answer.text]
            self.check(not shown, f"{answer.endpoint} shows {shown}: {answer.text[:300]}")


def refusal(text: str) -> bool:
    return text.startswith(REFUSALS)


def fill(value: Any, run_id: str, key: str) -> Any:
    return value.replace("{run}", run_id).replace("{key}", key) if isinstance(value, str) else value


@asynccontextmanager
async def clients(port: int, kind: Kind) -> AsyncIterator[tuple[Client, Client, Client]]:
    """A plain client, a task-aware one and a handshake-era one, with ``kind``'s token."""
    headers = {"Authorization": f"Bearer {kind.token}"}
    url = f"http://127.0.0.1:{port}/mcp"
    async with AsyncExitStack() as stack:
        http = [await stack.enter_async_context(httpx2.AsyncClient(headers=headers)) for _ in range(3)]
        plain = await stack.enter_async_context(Client(streamable_http_client(url, http_client=http[0])))
        aware = await stack.enter_async_context(
            Client(streamable_http_client(url, http_client=http[1]), extensions=[TasksClient()])
        )
        legacy = await stack.enter_async_context(
            Client(streamable_http_client(url, http_client=http[2]), mode="legacy")
        )
        yield plain, aware, legacy


async def owners_run(owner: Client, key: str) -> str:
    """A fresh run of the owner's, started with ``key``, waiting at its gate after a host task, with
    the markers in its request and the task's output."""
    view = await call(
        owner,
        "orchestrate_start",
        request=f"Plan it. {SECRET_REQUEST}",
        chain=["architect", "writer"],
        approve_before=["writer"],
        idempotency_key=key,
    )
    view = await play_host(owner, view, lambda task: f"The plan: {SECRET_OUTPUT}")
    assert view["status"] == "awaiting_approval", view
    return str(view["run_id"])


async def tool_call(client: Client, name: str, arguments: dict[str, Any]) -> tuple[bool, str]:
    result = await client.call_tool(name, arguments)
    text = text_of(result) + json.dumps(result.structured_content or {})
    return (result.is_error and refusal(text_of(result))), text


async def protocol_call(request: Awaitable[Any]) -> tuple[bool, str]:
    try:
        answer = await request
    except MCPError as exc:
        return refusal(exc.error.message), exc.error.message
    return False, json.dumps(
        answer if isinstance(answer, dict) else answer.model_dump(mode="json"), default=str
    )


async def walk_mcp(walk: Walk, plain: Client, aware: Client, legacy: Client) -> None:
    run_id = walk.run_id
    for tool in (await plain.list_tools()).tools:
        assert tool.name in TOOLS, f"tool {tool.name} is not in the walk's table"
    templates = (await plain.list_resource_templates()).resource_templates
    for template in templates:
        assert template.uri_template in TEMPLATES, (
            f"template {template.uri_template} is not in the walk's table"
        )
    for template in templates:
        uri = template.uri_template.format(run_id=run_id, task_id="architect")
        await walk.expect(uri, TEMPLATES[template.uri_template], protocol_call(plain.read_resource(uri)))
    listed = json.dumps((await plain.list_resources()).model_dump(mode="json"))
    walk.add("resources/list", False, listed)
    if not (walk.kind.may_see and "read" in walk.kind.roles):
        walk.check(run_id not in listed, "resources/list lists the run")
    for prompt in (await plain.list_prompts()).prompts:
        name = prompt.name
        await walk.expect(
            f"prompts/get {name}",
            PROMPT,
            protocol_call(plain.get_prompt(name, {"request": "hello"})),
        )
    uri = f"run://{run_id}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        await walk.expect("resources/subscribe", SUBSCRIBE, protocol_call(legacy.subscribe_resource(uri)))
    await walk.expect("subscriptions/listen", SUBSCRIBE, listen_once(plain, uri))
    await walk.expect("tasks/get", TASK_METHODS["tasks/get"], protocol_call(get_task(aware, run_id)))
    for name in TOOLS:
        if name in ("orchestrate_approve", "orchestrate_cancel"):
            continue
        need, arguments = TOOLS[name]
        await walk.expect(name, need, tool_call(plain, name, walk.fill(arguments)))
        if name == "orchestrate_start" and walk.kind.name != "owner":
            # The owner's key is another key for anyone else: never the owner's run.
            said = walk.answers[-1].text
            walk.check(
                run_id not in said, f"orchestrate_start with the owner's key names the run: {said[:300]}"
            )


async def listen_once(client: Client, uri: str) -> tuple[bool, str]:
    try:
        async with client.listen(resource_subscriptions=[uri]):
            pass
    except MCPError as exc:
        return refusal(exc.error.message), exc.error.message
    return False, "listening"


async def walk_pages(walk: Walk, port: int) -> None:
    """The pages and their endpoints, the gate decided last (before the tools decide it again)."""
    headers = {} if walk.kind.token is None else {"Authorization": f"Bearer {walk.kind.token}"}
    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}/runs", headers=headers) as http:
        for (method, path), need in PAGES.items():
            body = {"decision": "approve"} if method == "POST" else None
            await walk.expect(
                f"{method} /runs{path}",
                need,
                page_call(http, method, fill(path, walk.run_id, walk.key), body),
            )


async def page_call(http: httpx2.AsyncClient, method: str, path: str, body: Any) -> tuple[bool, str]:
    answer = await http.request(method, path, json=body)
    coded = answer.headers.get("content-type", "").startswith("application/json")
    error = answer.json().get("error") if coded and answer.status_code >= 400 else None
    return answer.status_code in (401, 403, 404) and error in REFUSALS, answer.text


async def walk_changes(walk: Walk, plain: Client, aware: Client) -> None:
    """What changes the run: decide the gate (page, tool, task), then cancel (task, tool)."""
    run_id = walk.run_id
    need, arguments = TOOLS["orchestrate_approve"]
    await walk.expect(
        "orchestrate_approve", need, tool_call(plain, "orchestrate_approve", walk.fill(arguments))
    )
    answer = {"gate:" + GATE: {"action": "accept", "content": {"decision": "approve"}}}
    await walk.expect(
        "tasks/update",
        TASK_METHODS["tasks/update"],
        protocol_call(update_task(aware, run_id, answer)),
    )
    await walk.expect("tasks/cancel", TASK_METHODS["tasks/cancel"], protocol_call(cancel_task(aware, run_id)))
    need, arguments = TOOLS["orchestrate_cancel"]
    await walk.expect(
        "orchestrate_cancel", need, tool_call(plain, "orchestrate_cancel", walk.fill(arguments))
    )


async def walk_anonymous(walk: Walk, port: int, full: Client) -> None:
    """Without a token, every MCP request is ``401`` before it reaches anything."""
    names = [t.name for t in (await full.list_tools()).tools]
    methods = ["tools/list", "resources/list", "resources/templates/list", "prompts/list", *TASK_METHODS]
    requests = [{"method": m, "params": {"taskId": walk.run_id}} for m in methods]
    requests += [
        {"method": "tools/call", "params": {"name": n, "arguments": walk.fill(TOOLS[n][1])}} for n in names
    ]
    requests += [{"method": "resources/read", "params": {"uri": f"run://{walk.run_id}"}}]
    requests += [{"method": "resources/subscribe", "params": {"uri": f"run://{walk.run_id}"}}]
    async with httpx2.AsyncClient() as http:
        for n, request in enumerate(requests):
            answer = await http.post(
                f"http://127.0.0.1:{port}/mcp",
                json={"jsonrpc": "2.0", "id": n, **request},
                headers={"Accept": "application/json, text/event-stream"},
            )
            walk.check(answer.status_code == 401, f"{request['method']} answered {answer.status_code}")
            walk.add(str(request["method"]), True, answer.text)


async def test_every_endpoint_with_every_identity_kind(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(CONFIG)
    assert {m.method for m in TasksExtension().methods()} == set(TASK_METHODS), "a task method is not walked"
    by_name = {k.name: k for k in KINDS}
    broken: list[str] = []
    async with (
        http_server(tmp_path, "streamable-http") as port,
        clients(port, by_name["owner"]) as (owner, _, _),
        clients(port, by_name["full"]) as (full, _, _),
    ):
        for kind in KINDS:
            walk = Walk(kind, "", [], broken)
            walk.run_id = await owners_run(owner, walk.key)
            if kind.token is None:
                await walk_anonymous(walk, port, full)
                await walk_pages(walk, port)
            else:
                async with clients(port, kind) as (plain, aware, legacy):
                    await walk_mcp(walk, plain, aware, legacy)
                    await walk_pages(walk, port)
                    await walk_changes(walk, plain, aware)
            walk.check_content()
    assert not broken, "\n".join(broken)

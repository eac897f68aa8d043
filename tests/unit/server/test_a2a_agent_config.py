"""A2A agent steps, statically: ``protocol = "a2a"`` tables, the ``message`` of the steps that name
them (checked at load as any agent step's templates), the attempt rule for a resent message, and
what the A2A client makes of a task without a peer (state names, outputs, error classes)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2AClientError, A2AClientTimeoutError
from a2a.helpers import new_data_part
from a2a.types import Artifact, GetTaskRequest, Part, Task, TaskNotFoundError, TaskState, TaskStatus
from google.protobuf.json_format import ParseError  # type: ignore[import-untyped]

from orchestration.chains.catalog import Catalog
from orchestration.core.agent_steps import agent_attempt, message_id
from orchestration.core.models import AgentStep, AttemptRecord, TypedError
from orchestration.core.models import TaskState as RunTaskState
from orchestration.errors import ConfigError
from orchestration.workers import AgentEndpoint, AgentsByProtocol, agent_workers
from orchestration.workers._redact import Redactor
from orchestration.workers.a2a_agents import A2AWorker, classify, connect_a2a, output_text
from orchestration.workers.agent_answers import AgentFailure
from orchestration.workers.mcp_agents import AgentWorker
from server.settings.agents import agent_endpoints
from server.settings.config import load_settings

AGENTS = {"peer": {"protocol": "a2a", "url": "http://127.0.0.1:9", "token_env": "PEER_TOKEN"}}
STEP = {"name": "review", "agent": "peer", "message": "Review {request}\n\n{outputs.architect}"}


def load(step: dict[str, Any], agents: dict[str, Any] = AGENTS) -> Catalog:
    raw = {"agents": agents, "chains": {"delegated": {"steps": ["architect", step, "writer"]}}}
    return Catalog.builtin().extended(raw, "construct.toml", Path("."))


def test_a_message_step_is_loaded_as_a_message_send() -> None:
    step = load(STEP).resolve("delegated").step("review")
    assert step.agent == AgentStep(
        agent="peer", tool="message/send", arguments={"message": "Review {request}\n\n{outputs.architect}"}
    )
    assert step.agent.sends_messages and step.agent.follows_runs


@pytest.mark.parametrize(
    ("step", "agents", "field", "words"),
    [
        ({**STEP, "message": None}, AGENTS, "message", "give the message"),
        ({**STEP, "tool": "orchestrate_start"}, AGENTS, "tool", "not tool"),
        ({**STEP, "arguments": {"a": "b"}}, AGENTS, "arguments", "not arguments"),
        ({**STEP, "output_step": "writer"}, AGENTS, "output_step", "not output_step"),
        ({**STEP, "message": "{outputs.nothing}"}, AGENTS, "message", "no step 'nothing'"),
        ({**STEP, "message": "{reqest}"}, AGENTS, "message", "unknown placeholder"),
        (STEP, {"peer": {"url": "http://h/mcp"}}, "message", "is an MCP agent"),
        ({**STEP, "message": None, "tool": "message/send"}, {"peer": {"url": "http://h/mcp"}}, "tool", "A2A"),
        ({"specialist": "engineer", "message": "x"}, AGENTS, "message", "name its agent"),
    ],
)
def test_a_bad_message_step_is_refused_at_load(
    step: dict[str, Any], agents: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load({k: v for k, v in step.items() if v is not None}, agents)
    assert caught.value.field == f"chains.delegated.steps[1].{field}" and words in caught.value.problem


def test_an_a2a_table_needs_a_url_and_becomes_an_a2a_endpoint(tmp_path: Path) -> None:
    file = tmp_path / "construct.toml"
    file.write_text('[agents.peer]\nprotocol = "a2a"\ncommand = ["x"]\n')
    with pytest.raises(ConfigError, match="needs url"):
        load_settings(env={}, home=tmp_path)
    file.write_text('[agents.peer]\nprotocol = "grpc"\nurl = "http://h"\n')
    with pytest.raises(ConfigError, match="protocol"):
        load_settings(env={}, home=tmp_path)
    file.write_text('[agents.peer]\nprotocol = "a2a"\nurl = "https://h/agent"\ntoken_env = "PEER_TOKEN"\n')
    endpoint = agent_endpoints(load_settings(env={}, home=tmp_path).agents)["peer"]
    assert (endpoint.protocol, endpoint.url, endpoint.token_env) == ("a2a", "https://h/agent", "PEER_TOKEN")


def test_the_server_routes_each_agent_to_its_protocols_client() -> None:
    endpoints = {
        "peer": AgentEndpoint(name="peer", url="http://h", protocol="a2a"),
        "other": AgentEndpoint(name="other", url="http://h/mcp"),
    }
    agents = agent_workers(endpoints)
    assert isinstance(agents, AgentsByProtocol)
    assert isinstance(agents._for("peer"), A2AWorker) and isinstance(agents._for("other"), AgentWorker)
    assert isinstance(agents._for("unknown"), AgentWorker)


def test_a_server_without_the_a2a_sdk_refuses_an_a2a_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "orchestration.workers.a2a_agents", None)  # as if not installed
    with pytest.raises(ConfigError) as caught:
        agent_workers({"peer": AgentEndpoint(name="peer", url="http://h", protocol="a2a")})
    assert caught.value.field == "agents.peer.protocol" and "construct-mcp[a2a]" in caught.value.problem
    # a server without A2A agents does not need it
    assert isinstance(
        agent_workers({"other": AgentEndpoint(name="other", url="http://h/mcp")}), AgentsByProtocol
    )


T0 = datetime(2026, 1, 1, tzinfo=UTC)
A2A = AgentStep(agent="peer", tool="message/send", arguments={"message": "x"})


def attempt(number: int, outcome: str, error: str | None = None, **extra: Any) -> AttemptRecord:
    return AttemptRecord(
        number=number,
        executor="agent:peer:message/send",
        started_at=T0,
        outcome=outcome,  # type: ignore[arg-type]
        error=None if error is None else TypedError(code=error, message=error),
        **extra,
    )


@pytest.mark.parametrize(
    ("attempts", "expected"),
    [
        ([], (None, None, False)),
        # died after the task was recorded: follow it, nothing is sent again
        ([attempt(1, "running", remote_run_id="t-1")], (1, "t-1", False)),
        # died between sending and recording: the same message again, maybe a second task
        ([attempt(1, "running")], (1, None, True)),
        ([attempt(1, "failed", "agent_unreachable")], (1, None, True)),
        # the task ended failed: a new message
        ([attempt(1, "failed", "agent_run_failed", remote_run_id="t-1")], (None, None, False)),
    ],
)
def test_the_next_attempt_resends_the_same_message_or_follows_the_task(
    attempts: list[AttemptRecord], expected: tuple[int | None, str | None, bool]
) -> None:
    task = RunTaskState(task_id="review", specialist="agent:peer", attempts=tuple(attempts))
    assert agent_attempt(A2A, task) == expected


def test_the_message_id_is_derived_from_the_key() -> None:
    assert message_id("construct:r:review:1") == message_id("construct:r:review:1")
    assert message_id("construct:r:review:1") != message_id("construct:r:review:2")


def _task(*parts: Part, state: TaskState = TaskState.TASK_STATE_COMPLETED) -> Task:
    return Task(
        id="t-1", status=TaskStatus(state=state), artifacts=[Artifact(artifact_id="a", parts=list(parts))]
    )


def test_the_output_joins_text_parts_or_takes_the_last_data_part() -> None:
    data = new_data_part({"verdict": "ok", "score": 3, "ratio": 0.5})
    task = _task(Part(text="one"), data, Part(text="two"))
    assert output_text(task, structured=False) == "one\ntwo"
    assert json.loads(output_text(task, structured=True)) == {"verdict": "ok", "score": 3, "ratio": 0.5}
    assert isinstance(json.loads(output_text(task, structured=True))["score"], int)  # not 3.0
    assert output_text(_task(Part(text="only text")), structured=True) == "only text"


@pytest.mark.parametrize(
    ("exc", "statuses", "code"),
    [
        (A2AClientError("Network communication error: refused"), [], "agent_unreachable"),
        (A2AClientError("HTTP Error 503"), [503], "agent_unreachable"),
        (A2AClientError("HTTP Error 401"), [401], "auth"),
        (A2AClientTimeoutError("Client Request timed out"), [], "timeout"),
        (httpx.ConnectError("refused"), [], "agent_unreachable"),
        (TaskNotFoundError(), [200], "agent_run_failed"),
        (ValueError("no compatible transports found."), [200], "malformed_response"),
        (ParseError("Failed to parse timestamp field"), [200], "malformed_response"),
        (AgentFailure("agent_protocol", "agent peer: odd"), [200], "agent_protocol"),
    ],
)
def test_failures_are_classified(exc: BaseException, statuses: list[int], code: str) -> None:
    error = classify(exc, statuses, Redactor(["s3cret-token-value"]), "peer")
    assert error.code == code and "peer" in error.message


def test_a_classified_message_does_not_show_the_token() -> None:
    error = classify(
        A2AClientError("echoed s3cret-token-value"), [], Redactor(["s3cret-token-value"]), "peer"
    )
    assert "s3cret-token-value" not in error.message


def test_the_docs_example_loads_as_an_a2a_step(tmp_path: Path) -> None:
    chains_md = (Path(__file__).resolve().parents[3] / "docs" / "chains.md").read_text("utf-8")
    section = chains_md.split("#### An A2A agent", 1)[1]
    (tmp_path / "construct.toml").write_text(section.split("```toml\n", 1)[1].split("```", 1)[0])
    settings = load_settings(env={}, home=tmp_path)
    assert agent_endpoints(settings.agents)["summarizer"].protocol == "a2a"
    step = Catalog.load(settings.config_file).resolve("design-and-summarize").step("summary")
    assert step.agent is not None and step.agent.sends_messages
    assert "{outputs.architect}" in step.agent.arguments["message"]


async def test_the_token_goes_only_to_the_configured_origin() -> None:
    """A card that names a JSON-RPC endpoint on another host: the card request carries the token,
    the request to the other host does not."""
    seen: list[tuple[str, str | None]] = []
    card = {
        "name": "elsewhere",
        "description": "d",
        "version": "1",
        "supportedInterfaces": [
            {"protocolBinding": "JSONRPC", "protocolVersion": "1.0", "url": "http://other.example/rpc"}
        ],
        "capabilities": {},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [],
    }

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), request.headers.get("authorization")))
        if request.url.path.endswith("agent-card.json"):
            return httpx.Response(200, json=card)
        task = {"id": "t-1", "status": {"state": "TASK_STATE_WORKING"}}
        return httpx.Response(
            200, json={"jsonrpc": "2.0", "id": json.loads(request.content)["id"], "result": task}
        )

    endpoint = AgentEndpoint(name="peer", url="https://agent.example/a", protocol="a2a", token_env="T")
    statuses: list[int] = []
    async with connect_a2a(endpoint, "tok-123456", statuses, transport=httpx.MockTransport(answer)) as client:
        await client.get_task(GetTaskRequest(id="t-1"))
    assert seen[0] == ("https://agent.example/a/.well-known/agent-card.json", "Bearer tok-123456")
    assert seen[1][0] == "http://other.example/rpc" and seen[1][1] is None

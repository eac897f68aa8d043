"""Asking the user at a gate (MCP elicitation), in process through the official client, on both
protocol eras (``Client(server)``: 2026-07-28, the answer comes back as a retry of the same call;
``mode="legacy"``: ``elicitation/create`` in the middle of the call) and on the filesystem and
SQLite stores."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from mcp import Client, MCPError
from mcp.client.context import ClientRequestContext
from mcp.server.elicitation import render_elicitation_schema
from mcp.types import CallToolResult, ElicitRequestParams, ElicitResult, ErrorData, InputRequiredResult
from pydantic import BaseModel

from orchestration.core.facts import ApprovalDecided, Fact, TaskCompleted
from orchestration.errors import InvalidArgument
from orchestration.store import RunStore
from server.app import ConstructApp
from server.mcp import elicit
from server.mcp.elicit import FORM_KEY, STATE_TTL_SECONDS, AskedGate, GateForm, RevisableGateForm
from server.settings.config import load_settings
from stores import open_store
from tests.acceptance.store_targets import store_target

Mode = Literal["modern", "legacy"]
MODES: list[Mode] = ["modern", "legacy"]


@pytest.fixture(params=["filesystem", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a fresh store of each persistent kind (the tests read its facts back after the
    server is gone, which the memory store cannot do)."""
    async with store_target(request.param, tmp_path / "store") as target:
        yield target.url


DESIGN = "Design: a token bucket per API key.\n" + "d" * 3000

#: One host task (architect), then a gate before the writer.
GATED = {"request": "Add rate limiting", "chain": ["architect", "writer"], "approve_before": ["writer"]}


def _app(home: Path, store: str) -> ConstructApp:
    env = {
        "CONSTRUCT_HOME": str(home),
        "CONSTRUCT_POLL_SECONDS": "0.1",
        "CONSTRUCT_ORCHESTRATION_STORE": store,
    }
    return ConstructApp(load_settings(env=env))


class Answers:
    """An elicitation callback that answers each form with the next scripted result (and keeps
    what it was shown); ``before`` runs first, e.g. to decide the gate elsewhere meanwhile."""

    def __init__(self, *results: ElicitResult) -> None:
        self.results = list(results)
        self.asked: list[ElicitRequestParams] = []
        self.before: Any = None

    async def __call__(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        self.asked.append(params)
        if self.before is not None:
            await self.before()
        return self.results.pop(0)


def approve(comment: str | None = None) -> ElicitResult:
    content: dict[str, str | int | float | bool | list[str] | None] = {"decision": "approve"}
    if comment is not None:
        content["comment"] = comment
    return ElicitResult(action="accept", content=content)


REJECT = ElicitResult(action="accept", content={"decision": "reject", "comment": "not now"})


@asynccontextmanager
async def client_for(app: ConstructApp, mode: Mode, answers: Answers | None) -> AsyncIterator[Client]:
    kwargs: dict[str, Any] = {"elicitation_callback": answers} if answers is not None else {}
    if mode == "legacy":
        kwargs["mode"] = "legacy"
    async with Client(app.build_server(), **kwargs) as client:
        yield client


async def _to_gate(client: Client) -> str:
    """Start the gated chain and hand in the architect's output with a wait: the call that reaches
    the gate. Returns the run id (the answer to that call is the test's business)."""
    started = await client.call_tool("orchestrate_start", {**GATED, "wait_seconds": 5})
    view = started.structured_content
    assert view is not None and view["next_action"]["task_id"] == "architect"
    return str(view["run_id"])


async def _resume(client: Client, run_id: str) -> dict[str, Any]:
    result = await client.call_tool(
        "orchestrate_resume", {"run_id": run_id, "task_id": "architect", "output": DESIGN, "wait_seconds": 5}
    )
    assert not result.is_error, result.content
    view = result.structured_content
    assert isinstance(view, dict)
    return view


async def _facts(home: Path, store: str, run_id: str) -> list[Fact]:
    opened: RunStore = await open_store(store, home=home)
    try:
        return await opened.read_facts(run_id)
    finally:
        await opened.close()


async def _decisions(home: Path, store: str, run_id: str) -> list[ApprovalDecided]:
    return [f for f in await _facts(home, store, run_id) if isinstance(f, ApprovalDecided)]


@pytest.mark.parametrize("mode", MODES)
async def test_a_waiting_call_that_reaches_a_gate_asks_and_records_the_approval(
    tmp_path: Path, mode: Mode, store: str
) -> None:
    answers = Answers(approve("lgtm"))
    async with client_for(_app(tmp_path, store), mode, answers) as client:
        run_id = await _to_gate(client)
        view = await _resume(client, run_id)
    # Asked once, with the gate, what comes next and the output under review (bounded).
    assert len(answers.asked) == 1
    message = answers.asked[0].message
    assert "before:writer" in message and run_id in message
    assert "Approve: the 'writer' step (writer) starts. Reject: the run ends as rejected." in message
    assert "Output under review — architect" in message and DESIGN[:1000] in message
    assert DESIGN not in message and len(message) < 2500
    schema = answers.asked[0].requested_schema  # type: ignore[union-attr]
    # The architect's output can be sent back: the form offers revise.
    assert schema["properties"]["decision"]["enum"] == ["approve", "reject", "revise"]
    assert "Revise: 'architect' runs again with your comment" in message
    assert schema["required"] == ["decision"]
    # The run went on: the writer's host task is the answer's next action.
    assert view["status"] == "awaiting_host"
    assert view["next_action"]["task_id"] == "writer"
    gate = view["gates"][0]
    assert (gate["status"], gate["channel"], gate["comment"], gate.get("verified", False)) == (
        "approved",
        "elicitation",
        "lgtm",
        False,
    )
    assert "warnings" not in view
    facts = await _facts(tmp_path, store, run_id)
    decided = [f for f in facts if isinstance(f, ApprovalDecided)]
    assert [(d.gate_id, d.decision, d.channel, d.approver, d.verified) for d in decided] == [
        ("before:writer", "approve", "elicitation", None, False)
    ]
    # On 2026-07-28 the answer came as a retry of the resume: its output is recorded once.
    assert [f.task_id for f in facts if isinstance(f, TaskCompleted)] == ["architect"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_rejection_in_the_form_rejects_the_run(tmp_path: Path, mode: Mode, store: str) -> None:
    answers = Answers(REJECT)
    async with client_for(_app(tmp_path, store), mode, answers) as client:
        view = await _resume(client, await _to_gate(client))
    assert view["status"] == "rejected"
    assert view["gates"][0]["status"] == "rejected" and view["gates"][0]["channel"] == "elicitation"
    assert view["gates"][0]["comment"] == "not now"


@pytest.mark.parametrize("action", ["decline", "cancel"])
@pytest.mark.parametrize("mode", MODES)
async def test_declining_or_cancelling_leaves_the_gate_pending_and_says_so(
    tmp_path: Path,
    mode: Mode,
    store: str,
    action: Literal["decline", "cancel"],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said = {"decline": "declined", "cancel": "cancelled"}[action]
    answers = Answers(ElicitResult(action=action))
    # Any answer counts as read: this test is about the user's refusal (the host's: below).
    monkeypatch.setattr(elicit, "FORM_READ_SECONDS", 0.0)
    async with client_for(_app(tmp_path, store), mode, answers) as client:
        run_id = await _to_gate(client)
        view = await _resume(client, run_id)
    assert len(answers.asked) == 1, "a declined form is not asked again in the same call"
    assert view["status"] == "awaiting_approval"
    assert view["next_action"]["kind"] == "approve" and view["next_action"]["gate_id"] == "before:writer"
    assert view["gates"][0]["status"] == "requested"
    assert any(
        w.startswith(
            f"elicitation: the user {said} the form for gate before:writer; the gate is still pending"
        )
        for w in view["warnings"]
    ), view["warnings"]
    assert await _decisions(tmp_path, store, run_id) == []


@pytest.mark.parametrize("action", ["decline", "cancel"])
@pytest.mark.parametrize("threshold", [60.0, 0.0])
async def test_a_form_refused_within_moments_is_the_host_s_refusal(
    tmp_path: Path, action: Literal["decline", "cancel"], threshold: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handshake-era host that refuses the form sooner than anybody could read it (Claude Code
    ``-p`` cancels at once, Codex ``exec`` declines): the warning says the host refused it and to
    ask the user; the gate stays pending. The same answer once the threshold has passed (here:
    a threshold of 0 instead of a delay, so the test does not sleep) is the user's."""
    monkeypatch.setattr(elicit, "FORM_READ_SECONDS", threshold)
    said = {"decline": "declined", "cancel": "cancelled"}[action]
    answers = Answers(ElicitResult(action=action))
    async with client_for(_app(tmp_path, "filesystem"), "legacy", answers) as client:
        run_id = await _to_gate(client)
        view = await _resume(client, run_id)
    assert len(answers.asked) == 1
    assert view["next_action"]["kind"] == "approve" and view["gates"][0]["status"] == "requested"
    host = [w for w in view["warnings"] if w.startswith(f"elicitation: the host {said} the form")]
    user = [w for w in view["warnings"] if w.startswith(f"elicitation: the user {said} the form")]
    if threshold > 0:
        assert len(host) == 1 and not user, view["warnings"]
        assert "before anybody could read it" in host[0]
        assert host[0].endswith("ask the user, then call orchestrate_approve with their decision")
    else:
        assert len(user) == 1 and not host, view["warnings"]
    assert await _decisions(tmp_path, "filesystem", run_id) == []


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_without_elicitation_gets_next_action_as_before(tmp_path: Path, mode: Mode) -> None:
    async with client_for(_app(tmp_path, "filesystem"), mode, None) as client:
        run_id = await _to_gate(client)
        view = await _resume(client, run_id)
    assert view["status"] == "awaiting_approval"
    assert view["next_action"] == {
        "kind": "approve",
        "tool": "orchestrate_approve",
        "arguments": {"run_id": run_id, "gate_id": "before:writer", "decision": "approve"},
        "choices": {
            "approve": "go on",
            "reject": "end the run",
            "revise": "redo the work shown, with comment",
        },
        "gate_id": "before:writer",
        "task_id": "writer",
        "position": "before",
        "guards": view["next_action"]["guards"],
        "instruction": "Ask the user, then call tool with arguments, decision: their choice, comment: "
        "optional note. Never decide for them.",
    }
    assert "warnings" not in view


@pytest.mark.parametrize("mode", MODES)
async def test_a_call_that_does_not_wait_does_not_ask(tmp_path: Path, mode: Mode) -> None:
    answers2 = Answers(approve())
    async with client_for(_app(tmp_path, "filesystem"), mode, answers2) as client:
        run_id = await _to_gate(client)
        result = await client.call_tool(
            "orchestrate_resume",
            {"run_id": run_id, "task_id": "architect", "output": DESIGN, "wait_seconds": 0},
        )
        assert result.structured_content is not None
        assert answers2.asked == []
        status = await client.call_tool("run_status", {"run_id": run_id, "wait_seconds": 2})
        assert status.structured_content is not None
        assert status.structured_content["next_action"]["kind"] == "run_host_task", (
            "run_status with a wait asks"
        )
        assert len(answers2.asked) == 1


async def test_a_start_without_idempotency_key_asks_only_on_a_handshake_connection(
    tmp_path: Path, store: str
) -> None:
    first_gated = {
        "request": "Write it",
        "chain": ["writer"],
        "approve_before": ["writer"],
        "wait_seconds": 5,
    }
    modern = Answers(approve())
    async with client_for(_app(tmp_path / "m", store), "modern", modern) as client:
        view = (await client.call_tool("orchestrate_start", first_gated)).structured_content
        assert view is not None and view["next_action"]["kind"] == "approve"
        assert modern.asked == [], "a retried keyless start would start a second run: it does not ask"
    legacy = Answers(approve())
    async with client_for(_app(tmp_path / "l", store), "legacy", legacy) as client:
        view = (await client.call_tool("orchestrate_start", first_gated)).structured_content
        assert view is not None and view["next_action"]["task_id"] == "writer"
        assert len(legacy.asked) == 1


async def test_a_retried_answer_records_one_decision_and_starts_no_second_run(
    tmp_path: Path, store: str
) -> None:
    """2026-07-28: the start (with its key) answers input_required; the client's retry carries the
    answer; the same retry sent twice more (a duplicated answer) records nothing more."""
    args = {
        "request": "Write it",
        "chain": ["writer"],
        "approve_before": ["writer"],
        "idempotency_key": "k-1",
        "wait_seconds": 5,
    }
    answer = {FORM_KEY: approve("go")}
    async with client_for(_app(tmp_path, store), "modern", Answers()) as client:
        first = await client.session.call_tool("orchestrate_start", args, allow_input_required=True)
        assert isinstance(first, InputRequiredResult) and first.request_state is not None
        form = first.input_requests[FORM_KEY]  # type: ignore[index]
        assert "before:writer" in form.params.message  # type: ignore[union-attr]
        views = []
        for _ in range(3):
            retried = await client.session.call_tool(
                "orchestrate_start",
                args,
                input_responses=answer,  # type: ignore[arg-type]
                request_state=first.request_state,
                allow_input_required=True,
            )
            assert isinstance(retried, CallToolResult) and retried.structured_content is not None
            views.append(retried.structured_content)
        runs = (await client.call_tool("runs_list", {})).structured_content
    assert runs is not None and len(runs["runs"]) == 1, "no second run"
    run_id = views[0]["run_id"]
    assert all(v["run_id"] == run_id and v["next_action"]["task_id"] == "writer" for v in views)
    # No note but the one every repeated keyed start carries (the run existed already).
    assert all(w.startswith("existing_run:") for v in views for w in v.get("warnings", []))
    decided = await _decisions(tmp_path, store, run_id)
    assert [(d.decision, d.comment, d.channel) for d in decided] == [("approve", "go", "elicitation")]


async def test_the_automatic_client_retry_drives_a_keyed_start_through_its_gate(tmp_path: Path) -> None:
    answers = Answers(approve())
    args = {"request": "Write it", "chain": ["writer"], "approve_before": ["writer"], "idempotency_key": "k"}
    async with client_for(_app(tmp_path, "sqlite"), "modern", answers) as client:
        view = (await client.call_tool("orchestrate_start", {**args, "wait_seconds": 5})).structured_content
        runs = (await client.call_tool("runs_list", {})).structured_content
    assert view is not None and view["next_action"]["task_id"] == "writer"
    assert len(answers.asked) == 1
    assert runs is not None and len(runs["runs"]) == 1


async def test_a_forged_or_tampered_request_state_is_refused_and_records_nothing(tmp_path: Path) -> None:
    async with client_for(_app(tmp_path, "filesystem"), "modern", Answers()) as client:
        run_id = await _to_gate(client)
        args = {"run_id": run_id, "task_id": "architect", "output": DESIGN, "wait_seconds": 5}
        first = await client.session.call_tool("orchestrate_resume", args, allow_input_required=True)
        assert isinstance(first, InputRequiredResult) and first.request_state is not None
        state = first.request_state
        tampered = state[:-3] + ("AAA" if not state.endswith("AAA") else "BBB")
        for forged in ("forged", tampered):
            with pytest.raises(MCPError, match="Invalid or expired requestState"):
                await client.session.call_tool(
                    "orchestrate_resume",
                    args,
                    input_responses={FORM_KEY: approve()},
                    request_state=forged,
                    allow_input_required=True,
                )
        # The state of one call does not answer another (here: the same run, other arguments).
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await client.session.call_tool(
                "run_status",
                {"run_id": run_id, "wait_seconds": 1},
                input_responses={FORM_KEY: approve()},
                request_state=state,
                allow_input_required=True,
            )
        status = (await client.call_tool("run_status", {"run_id": run_id})).structured_content
    assert status is not None and status["gates"][0]["status"] == "requested"
    assert await _decisions(tmp_path, "filesystem", run_id) == []


async def test_the_gate_state_is_sealed_by_the_sdk_under_a_key_of_the_process_until_it_expires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The state names the run, the gate and the identity asked, but the client sees none of it
    (the SDK seals it); another process's server refuses it, and so does this one once it expired;
    nothing is recorded."""
    app = _app(tmp_path, "filesystem")
    async with client_for(app, "modern", Answers()) as client:
        run_id = await _to_gate(client)
        args = {"run_id": run_id, "task_id": "architect", "output": DESIGN, "wait_seconds": 5}
        first = await client.session.call_tool("orchestrate_resume", args, allow_input_required=True)
        assert isinstance(first, InputRequiredResult) and first.request_state is not None
        state = first.request_state
        assert run_id not in state and "before:writer" not in state
        retry: dict[str, Any] = {
            "input_responses": {FORM_KEY: approve()},
            "request_state": state,
            "allow_input_required": True,
        }
        async with client_for(_app(tmp_path / "other", "filesystem"), "modern", Answers()) as other:
            with pytest.raises(MCPError, match="Invalid or expired requestState"):
                await other.session.call_tool("orchestrate_resume", args, **retry)
        now = time.time()
        with monkeypatch.context() as later:
            later.setattr(time, "time", lambda: now + STATE_TTL_SECONDS + 1)
            with pytest.raises(MCPError, match="Invalid or expired requestState"):
                await client.session.call_tool("orchestrate_resume", args, **retry)
        rejected = [r.getMessage() for r in caplog.records if "requestState rejected" in r.getMessage()]
        assert rejected[-1].endswith(": expired") and len(rejected) == 2
        status = (await client.call_tool("run_status", {"run_id": run_id})).structured_content
    assert status is not None and status["gates"][0]["status"] == "requested"
    assert await _decisions(tmp_path, "filesystem", run_id) == []


def test_the_gate_state_round_trips_and_a_state_of_another_shape_is_refused() -> None:
    asked = AskedGate(run_id="run-a", gate_id="before:writer", identity="bob", notes=("elicitation: x",))
    assert AskedGate.from_state(asked.to_state()) == asked
    assert AskedGate.from_state(AskedGate("run-a", "g", None).to_state()).identity is None
    for bad in ("nonsense", "", "{}", '{"r": "run-a"}', "[1, 2]"):
        with pytest.raises(InvalidArgument, match="not one this server issued"):
            AskedGate.from_state(bad)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("elsewhere", ["approve", "reject"])
async def test_a_late_answer_that_differs_is_a_conflict_and_one_that_agrees_records_nothing(
    tmp_path: Path, mode: Mode, store: str, elsewhere: Literal["approve", "reject"]
) -> None:
    """While the form is open, another server on the same store decides the gate; then the user
    approves in the form."""
    answers = Answers(approve("from the form"))
    async with client_for(_app(tmp_path, store), mode, answers) as client:
        run_id = await _to_gate(client)

        async def decide_elsewhere() -> None:
            async with Client(_app(tmp_path, store).build_server()) as other:
                result = await other.call_tool(
                    "orchestrate_approve",
                    {
                        "run_id": run_id,
                        "gate_id": "before:writer",
                        "decision": elsewhere,
                        "approver": "carol",
                    },
                )
                assert not result.is_error, result.content

        answers.before = decide_elsewhere
        view = await _resume(client, run_id)
    assert len(answers.asked) == 1
    gate = view["gates"][0]
    assert (gate.get("approver"), gate["channel"]) == ("carol", "stdio"), "the first decision stands"
    if elsewhere == "reject":
        assert view["status"] == "rejected"
        assert any(
            w.startswith("conflict: gate before:writer was already rejected by 'carol' via stdio")
            and "(approve) differs and was not recorded" in w
            for w in view["warnings"]
        ), view["warnings"]
    else:
        assert view["next_action"]["task_id"] == "writer"
        assert any(
            w.startswith("elicitation: gate before:writer was already approved by 'carol' via stdio")
            for w in view["warnings"]
        ), view["warnings"]
    decided = await _decisions(tmp_path, store, run_id)
    assert [(d.decision, d.approver, d.channel) for d in decided] == [(elsewhere, "carol", "stdio")]


REVIEWED = """
[chains.reviewed]
steps = [{ specialist = "architect", approve_after = true }, "writer"]
"""


#: Markup for developers that must never reach a form a person reads (Sphinx roles, backticks).
DEVELOPER_MARKUP = re.compile(r":(func|class|meth|mod|data|attr):|`|~orchestration")


def assert_plain_text(asked: ElicitRequestParams) -> None:
    """The form's texts (its message, its title and description, its fields' titles and
    descriptions) are plain sentences for people."""
    schema: dict[str, Any] = getattr(asked, "requested_schema", {})
    texts = [asked.message, schema.get("title", ""), schema.get("description", "")]
    for field in schema.get("properties", {}).values():
        texts += [field.get("title", ""), field.get("description", "")]
    for text in texts:
        assert not DEVELOPER_MARKUP.search(text), text


@pytest.mark.parametrize("form", [GateForm, RevisableGateForm])
def test_each_form_is_titled_and_described_in_plain_sentences(form: type[BaseModel]) -> None:
    """The schema a form is published with (every gate position asks with one of these two)."""
    schema = render_elicitation_schema(form)
    assert schema["title"] and schema["description"]
    texts = [schema["title"], schema["description"]]
    texts += [
        v
        for field in schema["properties"].values()
        for k, v in field.items()
        if k in ("title", "description")
    ]
    for text in texts:
        assert not DEVELOPER_MARKUP.search(text), text


@pytest.mark.parametrize("mode", MODES)
async def test_the_form_of_a_gate_after_a_step_shows_that_steps_output_and_what_follows(
    tmp_path: Path, mode: Mode
) -> None:
    (tmp_path / "construct.toml").write_text(REVIEWED)
    short = "A short design."
    answers = Answers(approve())
    async with client_for(_app(tmp_path, "sqlite"), mode, answers) as client:
        started = await client.call_tool("orchestrate_start", {"request": "Review me", "chain": "reviewed"})
        run_id = (started.structured_content or {})["run_id"]
        result = await client.call_tool(
            "orchestrate_resume",
            {"run_id": run_id, "task_id": "architect", "output": short, "wait_seconds": 5},
        )
    message = answers.asked[0].message
    assert "gate after:architect" in message
    assert "Approve: the chain goes on with 'writer'. Reject: the run ends as rejected." in message
    assert message.endswith(
        f"Output under review — architect (15 characters, all of it; whole at run://{run_id}/tasks/architect/output):"
        f"\n{short}"
    )
    assert (result.structured_content or {})["next_action"]["task_id"] == "writer"
    assert_plain_text(answers.asked[0])


@pytest.mark.parametrize("mode", MODES)
async def test_the_form_of_an_exhausted_loop_shows_its_history(tmp_path: Path, mode: Mode) -> None:
    revise = '{"verdict": "revise", "notes": "not yet"}'
    answers = Answers(approve())
    async with client_for(_app(tmp_path, "filesystem"), mode, answers) as client:
        view = (
            await client.call_tool("orchestrate_start", {"request": "Loop", "chain": "review-loop"})
        ).structured_content
        assert view is not None
        while view["next_action"]["kind"] == "run_host_task":
            task_id = view["next_action"]["task_id"]
            output = revise if task_id.startswith("reviewer") else f"work of {task_id}"
            result = await client.call_tool(
                "orchestrate_resume",
                {"run_id": view["run_id"], "task_id": task_id, "output": output, "wait_seconds": 5},
            )
            view = result.structured_content
            assert view is not None
    assert len(answers.asked) == 1
    message = answers.asked[0].message
    assert "gate exhausted:reviewer~3" in message and "The loop through 'reviewer' is exhausted" in message
    assert "Approve to accept the work as it is (the run completes)" in message
    assert "Output under review — reviewer~3" in message and revise in message
    assert view["status"] == "completed"
    # An exhausted gate cannot be revised: its form offers approve and reject only.
    schema = answers.asked[0].requested_schema  # type: ignore[union-attr]
    assert schema["properties"]["decision"]["enum"] == ["approve", "reject"]
    assert "Revise:" not in message
    assert_plain_text(answers.asked[0])


@pytest.mark.parametrize("mode", MODES)
async def test_a_revise_in_the_form_reruns_the_step_under_review_with_the_comment(
    tmp_path: Path, mode: Mode
) -> None:
    answers = Answers(
        ElicitResult(action="accept", content={"decision": "revise", "comment": "cite sources"})
    )
    async with client_for(_app(tmp_path, "sqlite"), mode, answers) as client:
        view = await _resume(client, await _to_gate(client))
    assert view["next_action"]["kind"] == "run_host_task"
    assert view["next_action"]["task_id"] == "architect~2"
    (asked,) = answers.asked
    assert asked.requested_schema["properties"]["decision"]["enum"] == ["approve", "reject", "revise"]  # type: ignore[union-attr]
    assert_plain_text(asked)
    assert "cite sources" in view["next_action"]["user_prompt"]
    gate = view["gates"][0]
    assert (gate["status"], gate["channel"], gate.get("decisions", [])) == ("revised", "elicitation", [])
    assert [(t["task_id"], t["status"]) for t in view["tasks"]] == [
        ("architect", "done"),
        ("writer", "skipped"),
        ("architect~2", "awaiting_host"),
        ("writer~2", "pending"),
    ]


async def test_on_a_handshake_connection_an_unanswered_form_ends_with_the_wait(tmp_path: Path) -> None:
    never = anyio.Event()

    class Silent(Answers):
        async def __call__(
            self, context: ClientRequestContext, params: ElicitRequestParams
        ) -> ElicitResult | ErrorData:
            self.asked.append(params)
            await never.wait()  # the user walked away
            return approve()

    answers = Silent()
    async with client_for(_app(tmp_path, "filesystem"), "legacy", answers) as client:
        run_id = await _to_gate(client)
        with anyio.fail_after(60):  # a hang guard, not a timing assertion
            result = await client.call_tool(
                "orchestrate_resume",
                {"run_id": run_id, "task_id": "architect", "output": DESIGN, "wait_seconds": 1},
            )
    view = result.structured_content
    assert view is not None and len(answers.asked) == 1
    assert view["status"] == "awaiting_approval" and view["next_action"]["kind"] == "approve"
    assert (
        "elicitation: no answer to the form for gate before:writer within 1 s; the gate is still pending"
        in (view["warnings"])
    )
    assert await _decisions(tmp_path, "filesystem", run_id) == []

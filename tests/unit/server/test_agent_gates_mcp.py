"""Who answers a gate, through the MCP tools in process (issue 21 §3): a scripted autonomous runner
that only ever sends ``next_action``'s ``tool`` and ``arguments`` (it has no user to ask) drives a
chain whose gates the agent decides to its end, loop gates included; on a person's gate its
``approver: "agent"`` is ``forbidden``, and the action tells it to ask the user. Elicitation never
asks for a gate only the agent decides, the MCP Tasks status message does not tell the agent to
find someone else, and no token identity may call itself ``agent``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp.types import ElicitRequestParams, ElicitResult, ErrorData

from orchestration.chains.catalog import Catalog
from orchestration.core import StartRequest
from orchestration.core.vocabulary import RunStatus
from orchestration.engine.runtime import Runtime
from orchestration.errors import ConfigError
from server.app import ConstructApp
from server.mcp.tasks import detailed_task
from server.settings.config import load_settings
from server.views.run_view import run_view
from tests.unit.helpers import make_runtime

#: A reviewer that loops back to the engineer, and asks when the loop is exhausted (one TOML line).
REVIEWER = (
    '{ specialist = "reviewer", output_schema = "verdict", route_on = "verdict", on_exhausted = "ask", '
    'routes = { approve = "end", revise = "engineer", reject = "fail" } }'
)
AUTONOMOUS = f"""
[chains.autonomous]
approvers = ["agent"]
steps = [
  "architect",
  {{ specialist = "engineer", approve_after = true, max_visits = 2 }},
  {REVIEWER},
]
"""
PERSONAL = """
[chains.personal]
steps = ["architect", { specialist = "engineer", approve_after = true }]

[chains.shared]
steps = ["architect", { specialist = "engineer", approve_after = true, approvers = ["agent", "bob"] }]
"""
#: What every reviewer of the runner says: the loop goes round until its bound, then asks.
REVISE = json.dumps({"verdict": "revise", "notes": "once more"})


def _app(home: Path) -> ConstructApp:
    (home / "construct.toml").write_text(AUTONOMOUS + PERSONAL)
    return ConstructApp(load_settings(env={"CONSTRUCT_HOME": str(home), "CONSTRUCT_POLL_SECONDS": "0.1"}))


class Runner:
    """An autonomous runner: it reads only ``next_action`` and sends its call as it is, adding only
    what ``add`` asks for (its model's answer). It never asks anyone: at a gate it sends the
    arguments it is given, with ``approver: "agent"`` when they do not say who decides."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.refused: str | None = None

    async def drive(self, view: dict[str, Any], max_calls: int = 40) -> dict[str, Any]:
        for _ in range(max_calls):
            action = view["next_action"]
            if action["kind"] == "none":
                return view
            arguments = dict(action["arguments"])
            if action["kind"] == "run_host_task":
                typed = action.get("output_schema") is not None
                arguments["output"] = REVISE if typed else f"the work of {action['task_id']}"
            elif action["kind"] == "approve":
                arguments.setdefault("approver", "agent")  # nobody to ask
            if action["kind"] != "wait":
                arguments.setdefault("wait_seconds", 5)
            self.calls.append((action["tool"], arguments))
            result = await self.client.call_tool(action["tool"], arguments)
            if result.is_error:
                text = result.content[0].text  # type: ignore[union-attr]
                assert isinstance(text, str)
                self.refused = text
                return view
            assert isinstance(result.structured_content, dict)
            view = result.structured_content
        raise AssertionError("the runner did not finish")


async def test_an_autonomous_runner_drives_a_chain_whose_gates_the_agent_decides_to_its_end(
    tmp_path: Path,
) -> None:
    async with Client(_app(tmp_path).build_server()) as client:
        runner = Runner(client)
        started = await client.call_tool("orchestrate_start", {"request": "Build it", "chain": "autonomous"})
        assert isinstance(started.structured_content, dict)
        view = await runner.drive(started.structured_content)
    assert runner.refused is None
    assert view["status"] == "completed", view
    decided = [(g["gate_id"], g["status"], g["approver"]) for g in view["gates"]]
    # Each engineer's output, then the exhausted loop: every gate decided by the agent itself.
    assert decided == [
        ("after:engineer", "approved", "agent"),
        ("after:engineer~2", "approved", "agent"),
        ("exhausted:reviewer~2", "approved", "agent"),
    ], decided
    approvals = [a for tool, a in runner.calls if tool == "orchestrate_approve"]
    assert len(approvals) == 3 and all(a["approver"] == "agent" for a in approvals)


async def test_on_a_persons_gate_the_runners_own_decision_is_forbidden(tmp_path: Path) -> None:
    async with Client(_app(tmp_path).build_server()) as client:
        runner = Runner(client)
        started = await client.call_tool("orchestrate_start", {"request": "Build it", "chain": "personal"})
        assert isinstance(started.structured_content, dict)
        view = await runner.drive(started.structured_content)
        action = view["next_action"]
        assert (action["kind"], action["gate_id"]) == ("approve", "after:engineer")
        assert "approver" not in action["arguments"]
        assert (
            action["instruction"].startswith("Ask the user")
            and "Never decide for them" in action["instruction"]
        )
        assert runner.refused is not None
        assert runner.refused.startswith("forbidden")
        assert f"gate after:engineer of run {view['run_id']} is a person's, not the agent's" in runner.refused
        assert "ask the user" in runner.refused
        # Nothing was recorded: the gate still waits for the user's decision.
        status = await client.call_tool("run_status", {"run_id": view["run_id"]})
        assert isinstance(status.structured_content, dict)
        assert status.structured_content["status"] == "awaiting_approval"


async def test_the_approve_action_says_who_decides(tmp_path: Path) -> None:
    async with Client(_app(tmp_path).build_server()) as client:
        actions, shown = {}, {}
        for chain in ("autonomous", "personal", "shared"):
            started = await client.call_tool("orchestrate_start", {"request": "Build it", "chain": chain})
            assert isinstance(started.structured_content, dict)
            run_id = started.structured_content["run_id"]
            done = await client.call_tool(
                "orchestrate_resume",
                {"run_id": run_id, "task_id": "architect", "output": "the design", "wait_seconds": 5},
            )
            view = await client.call_tool(
                "orchestrate_resume",
                {"run_id": run_id, "task_id": "engineer", "output": "the code", "wait_seconds": 5},
            )
            assert not done.is_error and isinstance(view.structured_content, dict), (done, view)
            actions[chain] = view.structured_content["next_action"]
            shown[chain] = view.structured_content["gates"][0].get("approvers")
    # The gate shows its policy, the chain's where its step has none.
    assert shown == {"autonomous": ["agent"], "personal": None, "shared": ["agent", "bob"]}
    mine = actions["autonomous"]
    assert mine["arguments"] == {
        "run_id": mine["arguments"]["run_id"],
        "gate_id": "after:engineer",
        "decision": "approve",
        "approver": "agent",
    }
    assert mine["instruction"] == (
        "You may decide this gate yourself: call tool with arguments (decision: one of choices; "
        "comment: why)."
    )
    assert actions["shared"]["arguments"]["approver"] == "agent"
    assert actions["shared"]["instruction"].endswith("So may bob.")
    theirs = actions["personal"]
    assert "approver" not in theirs["arguments"]
    assert theirs["instruction"] == (
        "Ask the user, then call tool with arguments, decision: their choice, comment: optional note. "
        "Never decide for them."
    )


# ------------------------------------------------------------------------------------ elicitation


class Asked:
    """A client's elicitation callback: records each form, and approves."""

    def __init__(self) -> None:
        self.forms: list[ElicitRequestParams] = []

    async def __call__(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        self.forms.append(params)
        return ElicitResult(action="accept", content={"decision": "approve"})


@pytest.mark.parametrize(("chain", "asked"), [("autonomous", False), ("shared", False), ("personal", True)])
async def test_elicitation_never_asks_the_user_at_a_gate_the_agent_decides(
    tmp_path: Path, chain: str, asked: bool
) -> None:
    """Over stdio nobody is verified: a gate that names bob and the agent is not asked either (the
    form would record nobody); a person's gate is, as before."""
    answers = Asked()
    async with Client(_app(tmp_path).build_server(), elicitation_callback=answers, mode="legacy") as client:
        started = await client.call_tool("orchestrate_start", {"request": "Build it", "chain": chain})
        assert isinstance(started.structured_content, dict)
        run_id = started.structured_content["run_id"]
        for task_id in ("architect", "engineer"):
            result = await client.call_tool(
                "orchestrate_resume",
                {"run_id": run_id, "task_id": task_id, "output": "the work", "wait_seconds": 5},
            )
            assert not result.is_error, result.content
        view = result.structured_content
        assert isinstance(view, dict)
    assert bool(answers.forms) is asked
    if asked:
        assert view["gates"][0]["status"] == "approved"
    else:
        assert view["next_action"]["arguments"]["approver"] == "agent"
        assert view["gates"][0]["status"] == "requested"


# --------------------------------------------------------------------------- tasks and settings


async def _gated_view(runtime: Runtime, chain: str) -> Any:
    head, _ = await runtime.start(StartRequest("Build it", chain=chain))
    while head.status != RunStatus.AWAITING_APPROVAL:
        await runtime.drive(head.run_id)
        head = await runtime.status(head.run_id)
        snap = await runtime.snapshot(head.run_id)
        if snap.host_task is not None:
            await runtime.submit_host_output(head.run_id, snap.host_task.task_id, "the work")
    return run_view(await runtime.snapshot(head.run_id))


async def test_the_tasks_status_message_of_an_agents_gate_says_the_agent_decides(tmp_path: Path) -> None:
    (tmp_path / "construct.toml").write_text(AUTONOMOUS + PERSONAL)
    catalog = Catalog.load(tmp_path / "construct.toml")
    runtime = make_runtime(catalog=catalog)
    view = await _gated_view(runtime, "autonomous")
    call = json.dumps(
        {"run_id": view.run_id, "gate_id": "after:engineer", "decision": "approve", "approver": "agent"}
    )
    message = detailed_task(view)["statusMessage"]
    assert f"you may decide it yourself: call orchestrate_approve with {call}" in message
    assert "someone who may decide it" not in message
    person = detailed_task(await _gated_view(runtime, "personal"))["statusMessage"]
    assert "someone who may decide it calls orchestrate_approve" in person and "yourself" not in person


@pytest.mark.parametrize("name", ["agent", "Agent"])
def test_no_token_identity_may_be_called_agent(tmp_path: Path, name: str) -> None:
    (tmp_path / "construct.toml").write_text(
        f'[tokens.{name}]\ntoken = "a-token-of-24-characters"\nroles = ["approve"]\n'
    )
    with pytest.raises(ConfigError) as raised:
        load_settings(env={}, home=tmp_path).named_tokens()
    assert raised.value.field == "tokens", raised.value
    assert "is reserved" in raised.value.problem and "calling agent" in raised.value.problem

"""Agent steps, statically: the ``[agents]`` tables, the steps that name them, their argument
templates, and the pure rule that says whether an attempt calls or follows an earlier call."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from orchestration.chains.catalog import Catalog
from orchestration.core.agent_steps import agent_attempt, check_template, render_arguments
from orchestration.core.models import AgentStep, AttemptRecord, TaskState, TypedError
from orchestration.errors import ConfigError
from server.settings.agents import agent_endpoints
from server.settings.config import load_settings

T0 = datetime(2026, 1, 1, tzinfo=UTC)

AGENTS = {"reviewer2": {"url": "http://127.0.0.1:9/mcp", "token_env": "REVIEWER2_TOKEN"}}


def chain_with(step: dict[str, Any], agents: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "agents": AGENTS if agents is None else agents,
        "chains": {"delegated": {"steps": ["architect", step, "writer"]}},
    }


def load(raw: dict[str, Any]) -> Catalog:
    return Catalog.builtin().extended(raw, "construct.toml", Path("."))


def refused(raw: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load(raw)
    return caught.value


REVIEW = {
    "name": "review",
    "agent": "reviewer2",
    "tool": "orchestrate_start",
    "arguments": {"chain": "review-loop", "request": "{request}\n\n{outputs.architect}"},
}


def test_an_agent_step_is_loaded_into_the_snapshot() -> None:
    catalog = load(chain_with(REVIEW))
    chain = catalog.resolve("delegated")
    step = chain.step("review")
    assert step.agent == AgentStep(
        agent="reviewer2",
        tool="orchestrate_start",
        arguments={"chain": "review-loop", "request": "{request}\n\n{outputs.architect}"},
    )
    assert step.specialist == "agent:reviewer2"
    # Its specialist is a label: the snapshot carries only the real specialists' personas.
    assert {s.name for s in chain.specialists} == {"architect", "writer"}


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"agent": "nobody"}, "chains.delegated.steps[1].agent", "no [agents.nobody] table"),
        ({"specialist": "engineer"}, "chains.delegated.steps[1].agent", "not both"),
        ({"tool": None}, "chains.delegated.steps[1].tool", "name the tool"),
        ({"provider": "anthropic"}, "chains.delegated.steps[1].agent", "not a provider"),
        (
            {"arguments": {"request": "{reqest}"}},
            "chains.delegated.steps[1].arguments",
            "unknown placeholder",
        ),
        (
            {"arguments": {"request": "{outputs.engineer}"}},
            "chains.delegated.steps[1].arguments",
            "no step 'engineer'",
        ),
        (
            {"arguments": {"request": "{outputs.review}"}},
            "chains.delegated.steps[1].arguments",
            "its own output",
        ),
        ({"arguments": {"x": ["a {b"]}}, "chains.delegated.steps[1].arguments", "must be doubled"),
        (
            {"output_step": "engineer", "tool": "search"},
            "chains.delegated.steps[1].output_step",
            "construct-mcp",
        ),
    ],
)
def test_a_bad_agent_step_is_refused_at_load(change: dict[str, Any], field: str, words: str) -> None:
    step = {k: v for k, v in {**REVIEW, **change}.items() if v is not None}
    error = refused(chain_with(step))
    assert error.field == field and words in error.problem, error


def test_tool_without_agent_is_refused() -> None:
    error = refused(chain_with({"specialist": "engineer", "tool": "x"}))
    assert error.field == "chains.delegated.steps[1].tool"


def test_templates_render_from_the_record_and_keep_other_values() -> None:
    agent = AgentStep(
        agent="a",
        tool="t",
        arguments={"q": "{request} / {outputs.architect} / {outputs.gone} {{x}}", "n": 3, "l": ["{run_id}"]},
    )
    rendered = render_arguments(agent, request="R", outputs={"architect": "D"}, run_id="run-1", task_id="t1")
    assert rendered == {"q": "R / D /  {x}", "n": 3, "l": ["run-1"]}
    check_template("{task_id} {{ }}", ["a"], "b")


def test_agents_tables_are_checked(tmp_path: Path) -> None:
    def settings(table: dict[str, Any]) -> str:
        lines = ["[agents.r]"] + [f"{k} = {v!r}".replace("'", '"') for k, v in table.items()]
        file = tmp_path / "construct.toml"
        file.write_text("\n".join(lines) + "\n")
        with pytest.raises(ConfigError) as caught:
            load_settings(env={}, home=tmp_path)
        return str(caught.value)

    assert "exactly one of url" in settings({"url": "http://h/mcp", "command": ["x"]})
    assert "exactly one of url" in settings({"token_env": "T"})
    assert "must not carry credentials" in settings({"url": "http://user:pw@h/mcp"})
    assert "pw" not in settings({"url": "http://user:pw@h/mcp"})
    assert "token_env applies to url" in settings({"command": ["x"], "token_env": "T"})
    assert "unknown setting (did you mean 'token_env'?)" in settings(
        {"url": "http://h/mcp", "token": "x" * 20}
    )
    assert "http:// or https://" in settings({"url": "ftp://h/mcp"})
    (tmp_path / "construct.toml").write_text('[agents.Bad]\nurl = "http://h/mcp"\n')
    with pytest.raises(ConfigError, match="agent name"):
        load_settings(env={}, home=tmp_path)
    (tmp_path / "construct.toml").write_text(
        '[agents.r]\nurl = "https://h/mcp"\ntoken_env = "R_TOKEN"\nfollow_wait_seconds = 5\n'
    )
    loaded = load_settings(env={"R_TOKEN": "not-read-here"}, home=tmp_path)
    endpoint = agent_endpoints(loaded.agents)["r"]
    assert (endpoint.url, endpoint.token_env, endpoint.follow_wait_seconds) == ("https://h/mcp", "R_TOKEN", 5)
    assert "not-read-here" not in repr(loaded) + repr(endpoint)


def attempt(number: int, outcome: str, error: str | None = None, **extra: Any) -> AttemptRecord:
    return AttemptRecord(
        number=number,
        executor="agent:a:t",
        started_at=T0,
        outcome=outcome,  # type: ignore[arg-type]
        error=None if error is None else TypedError(code=error, message=error),
        **extra,
    )


CONSTRUCT = AgentStep(agent="a", tool="orchestrate_start")
GENERIC = AgentStep(agent="a", tool="search")


@pytest.mark.parametrize(
    ("agent", "attempts", "expected"),
    [
        (CONSTRUCT, [], (None, None, False)),
        # died after the remote run was recorded: follow it
        (CONSTRUCT, [attempt(1, "running", remote_run_id="R")], (1, "R", False)),
        # died before: the same key finds the run the remote made, if any
        (CONSTRUCT, [attempt(1, "running")], (1, None, False)),
        # unreachable while following: follow the same run again, through the first call's key
        (
            CONSTRUCT,
            [
                attempt(1, "failed", remote_run_id="R"),
                attempt(2, "failed", "agent_unreachable", follows=1, remote_run_id="R"),
            ],
            (1, "R", False),
        ),
        (CONSTRUCT, [attempt(1, "failed", "timeout")], (1, None, False)),
        # the remote run failed: a new call
        (CONSTRUCT, [attempt(1, "failed", "agent_run_failed", remote_run_id="R")], (None, None, False)),
        # a tool without keys is called again, a possible duplicate
        (GENERIC, [attempt(1, "running")], (None, None, True)),
        (GENERIC, [attempt(1, "failed", "timeout")], (None, None, True)),
        (GENERIC, [attempt(1, "failed", "tool_error")], (None, None, False)),
    ],
)
def test_the_next_attempt_follows_a_call_whose_outcome_is_unknown(
    agent: AgentStep, attempts: list[AttemptRecord], expected: tuple[int | None, str | None, bool]
) -> None:
    task = TaskState(task_id="review", specialist="agent:a", attempts=tuple(attempts))
    assert agent_attempt(agent, task) == expected


def test_the_readme_example_loads(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[3] / "docs" / "chains.md").read_text("utf-8")
    section = readme.split("### Agents", 1)[1]
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "construct.toml").write_text(example)
    settings = load_settings(env={}, home=tmp_path)
    assert set(settings.agents) == {"reviewer2"}
    chain = Catalog.load(settings.config_file).resolve("build-and-review")
    step = chain.step("review")
    assert step.agent is not None and step.agent.output_step == "engineer"
    assert step.agent.arguments["request"] == "{request}\n\n{outputs.engineer}"

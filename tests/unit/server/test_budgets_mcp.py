"""Costs and budgets through the MCP tools, in process: ``budget`` on ``orchestrate_start``
(refused with ``invalid_argument`` when it is not one), ``usage`` on ``orchestrate_resume``
(recorded as reported by the host, counted against the budget), ``budget_raise`` on
``orchestrate_approve``; and ``[prices]`` / ``[budgets]`` in ``construct.toml``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server import MCPServer

from orchestration.core.costs import Budget
from orchestration.core.pricing import Price
from orchestration.errors import ConfigError
from server.app import ConstructApp
from server.mcp.services import Services
from server.settings.config import load_settings
from tests.acceptance.harness import call, call_error


def server_for(tmp_path: Path, toml: str = "") -> MCPServer[Services]:
    config = tmp_path / "construct.toml"
    config.write_text(toml)
    env = {"CONSTRUCT_HOME": str(tmp_path), "CONSTRUCT_ORCHESTRATION_STORE": "memory"}
    return ConstructApp(load_settings(env=env)).build_server()


@asynccontextmanager
async def connected(server: MCPServer[Services]) -> AsyncIterator[Client]:
    async with Client(server) as client:
        yield client


@pytest.mark.parametrize(
    ("budget", "said"),
    [
        ({"max_total_tokens": 0}, "invalid_argument: budget"),
        ({"max_cost_usd": -1}, "invalid_argument: budget"),
        ({"max_tokens": 5}, "invalid_argument: budget"),
        ({"on_budget": "maybe"}, "invalid_argument: budget"),
        ({}, "invalid_argument: budget sets no limit"),
        ({"steps": [{"step": "nope", "max_total_tokens": 5}]}, "invalid_argument: budget.steps names 'nope'"),
        # the map form of steps (before issue 21): a list of {step, ...} objects now
        ({"steps": {"nope": {"max_total_tokens": 5}}}, "invalid_argument: budget"),
        (
            {"steps": [{"step": "engineer"}, {"step": "engineer", "max_cost_usd": 1}]},
            "invalid_argument: budget.steps names 'engineer' twice",
        ),
    ],
)
async def test_a_start_with_an_invalid_budget_is_refused(
    tmp_path: Path, budget: dict[str, Any], said: str
) -> None:
    async with connected(server_for(tmp_path)) as client:
        text = await call_error(client, "orchestrate_start", request="x", budget=budget)
        assert text.startswith(said), text
        assert (await call(client, "runs_list"))["runs"] == []


async def test_reported_usage_is_recorded_and_counts_against_the_budget(tmp_path: Path) -> None:
    async with connected(server_for(tmp_path)) as client:
        view = await call(
            client,
            "orchestrate_start",
            request="Build it",
            chain=["architect", "engineer"],
            budget={"max_total_tokens": 1000},
        )
        run_id = view["run_id"]
        assert view["next_action"]["task_id"] == "architect"
        assert view["budget"]["max_total_tokens"] == 1000 and view["budget"]["spent_tokens"] == 0
        text = await call_error(
            client, "orchestrate_resume", run_id=run_id, usage={"input_tokens": 1, "output_tokens": 1}
        )
        assert text.startswith("invalid_argument: usage goes with output")
        text = await call_error(
            client,
            "orchestrate_resume",
            run_id=run_id,
            task_id="architect",
            output="x",
            usage={"input_tokens": -1, "output_tokens": 1},
        )
        assert text.startswith("invalid_argument: usage")
        view = await call(
            client,
            "orchestrate_resume",
            run_id=run_id,
            task_id="architect",
            output="the design",
            usage={"input_tokens": 700, "output_tokens": 400, "cost_usd": 0.01},
        )
        assert view["status"] == "failed" and view["error"]["code"] == "budget_exhausted"
        # What it spent is in the compact answer; the attempt's telemetry in the full one.
        assert view["costs"] == {"input_tokens": 700, "output_tokens": 400, "cost_usd": 0.01}
        view = await call(client, "run_status", run_id=run_id, detail="full")
        telemetry = view["tasks"][0]["attempts"][0]["telemetry"]
        assert telemetry["reported_by_host"] is True and telemetry["input_tokens"] == 700
        assert view["budget"]["spent_tokens"] == 1100 and view["totals"]["cost_usd"] == 0.01


async def test_a_budget_gate_is_approved_with_an_amount(tmp_path: Path) -> None:
    async with connected(server_for(tmp_path)) as client:
        view = await call(
            client,
            "orchestrate_start",
            request="Build it",
            chain=["architect", "engineer"],
            budget={"max_total_tokens": 100, "on_budget": "ask"},
        )
        run_id = view["run_id"]
        view = await call(
            client,
            "orchestrate_resume",
            run_id=run_id,
            task_id="architect",
            output="the design",
            usage={"input_tokens": 100, "output_tokens": 50},
        )
        action = view["next_action"]
        assert (
            action["kind"] == "approve" and action["gate_id"] == "budget:1" and action["position"] == "budget"
        )
        assert "150 spent" in action["guards"]
        view = await call(
            client,
            "orchestrate_approve",
            run_id=run_id,
            decision="approve",
            gate_id="budget:1",
            budget_raise={"max_total_tokens": 60},
        )
        assert view["next_action"]["kind"] == "run_host_task" and view["next_action"]["task_id"] == "engineer"
        assert view["budget"]["max_total_tokens"] == 160


def test_prices_and_chain_budgets_come_from_construct_toml(tmp_path: Path) -> None:
    config = tmp_path / "construct.toml"
    config.write_text(
        '[prices."my-model"]\ninput_per_mtok = 1.5\noutput_per_mtok = 6\n\n'
        '[budgets.default]\nmax_cost_usd = 2.5\non_budget = "ask"\n'
        "[budgets.default.steps.engineer]\nmax_total_tokens = 5000\n"
    )
    settings = load_settings(env={"CONSTRUCT_HOME": str(tmp_path)})
    assert settings.prices == {"my-model": Price(input_per_mtok=1.5, output_per_mtok=6)}
    budget = settings.budgets["default"]
    assert isinstance(budget, Budget) and budget.max_cost_usd == 2.5 and budget.on_budget == "ask"
    assert budget.steps["engineer"].max_total_tokens == 5000
    config.write_text('[prices."my-model"]\ninput_per_mtok = -1\noutput_per_mtok = 6\n')
    with pytest.raises(ConfigError, match=r"prices\.my-model\.input_per_mtok"):
        load_settings(env={"CONSTRUCT_HOME": str(tmp_path)})


async def test_a_chain_budget_from_construct_toml_applies_to_a_start_without_one(tmp_path: Path) -> None:
    server = server_for(tmp_path, "[budgets.default]\nmax_total_tokens = 10\n")
    async with connected(server) as client:
        view = await call(client, "orchestrate_start", request="Build it")
        assert view["budget"]["max_total_tokens"] == 10
        view = await call(client, "orchestrate_start", request="Build it", budget={"max_total_tokens": 99})
        assert view["budget"]["max_total_tokens"] == 99

"""The provider backend through the MCP surface: a real server process (stdio) whose tasks are run by
the server calling a model — the fake provider over real HTTP — configured only by environment
variables, as a user would."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.acceptance.harness import call, call_error, full_view, read_log, server_env, stdio_client_for
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

CANARY = "sk-ant-canary-" + secrets.token_hex(12)


async def test_a_gated_provider_chain_through_mcp(tmp_path: Path) -> None:
    scenario = {
        "architect": [{"error": "overloaded"}, {"text": "the design, from the model"}],
        "engineer": [{"text": "the code, from the model"}],
    }
    with FakeProvider(scenario) as fake:
        env = server_env(
            tmp_path,
            CONSTRUCT_WORKER_BACKEND="provider",
            CONSTRUCT_MODEL="claude-test-1",
            CONSTRUCT_ANTHROPIC_BASE_URL=fake.base_url,
            ANTHROPIC_API_KEY=CANARY,
        )
        log_path = tmp_path / "server.log"
        async with stdio_client_for(env, log_path) as client:
            view = await call(
                client,
                "orchestrate_start",
                request="Design and build a rate limiter.",
                chain=["architect", "engineer"],
                approve_before=["engineer"],
                wait_seconds=60,
            )
            assert view["status"] == "awaiting_approval", view
            assert view["tasks"][0]["output_preview"] == "the design, from the model"
            record = await full_view(client, view["run_id"])
            assert record["contract"]["worker_backend"] == "provider"
            architect = record["tasks"][0]
            assert architect["executor"] == "provider:anthropic:claude-test-1"
            # The overloaded answer was one recorded attempt; the second succeeded.
            assert [a["outcome"] for a in architect["attempts"]] == ["failed", "succeeded"]
            assert architect["attempts"][0]["error"]["code"] == "overloaded"

            view = await call(
                client,
                "orchestrate_approve",
                run_id=view["run_id"],
                decision="approve",
                gate_id="before:engineer",
                wait_seconds=60,
            )
            assert view["status"] == "completed", view
            assert view["tasks"][1]["output_preview"] == "the code, from the model"
            assert view["costs"]["output_tokens"] > 0
            record = await full_view(client, view["run_id"])
            assert "provider:anthropic:claude-test-1" in record["semantics"]
            assert record["totals"]["output_tokens"] == view["costs"]["output_tokens"]

            text = await call_error(
                client, "orchestrate_start", request="x", worker_backend="provider", provider="openai"
            )
            assert text.startswith("invalid_argument: ") and "OPENAI_API_KEY" in text
        assert fake.calls() == {"architect": 2, "engineer": 1}
        # The key went to the provider, and nowhere else.
        assert all(CANARY in str(r["headers"]) for r in fake.requests())
        assert CANARY not in read_log(log_path)
        assert CANARY not in str(view) and CANARY not in str(record)

"""Issue 3 end to end: the server as a subprocess over stdio, the provider backend pointed at the
fake provider over real HTTP. Retries, a failing key, a durable wait that survives a restart,
cancel mid-call, and a canary key that must appear nowhere but in the provider's request headers."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.acceptance.harness import call, full_view, read_log, server_env, stdio_client_for
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

CANARY = "sk-or-canary-" + secrets.token_hex(16)


def provider_env(home: Path, fake: FakeProvider, **extra: str) -> dict[str, str]:
    return server_env(
        home,
        CONSTRUCT_WORKER_BACKEND="provider",
        CONSTRUCT_MODEL="open/test-model",
        CONSTRUCT_OPENROUTER_BASE_URL=f"{fake.base_url}/api",
        OPENROUTER_API_KEY=CANARY,
        CONSTRUCT_LEASE_TTL_SECONDS="2",
        **extra,
    )


async def until(client: Client, run_id: str, predicate: Any, seconds: float = 30) -> dict[str, Any]:
    with anyio.fail_after(seconds):
        while True:
            view = await call(client, "run_status", run_id=run_id, wait_seconds=1)
            if predicate(view):
                return view
            await anyio.sleep(0.05)


async def test_full_chain_retry_and_auth_failure(tmp_path: Path) -> None:
    scenario = {
        "architect": [{"text": "design from the model"}],
        "engineer": [{"error": "rate_limited", "retry_after": 0}, {"text": "code from the model"}],
        "reviewer": [{"text": "VERDICT: approve"}],
    }
    log = tmp_path / "server.log"
    with FakeProvider(scenario) as fake:
        async with stdio_client_for(provider_env(tmp_path, fake), log) as client:
            view = await call(client, "orchestrate_start", request="Build a cache", wait_seconds=60)
            assert view["status"] == "completed", view
            outputs = {t["task_id"]: t["output_preview"] for t in view["tasks"]}
            assert outputs == {
                "architect": "design from the model",
                "engineer": "code from the model",
                "reviewer": "VERDICT: approve",
            }
            record = await full_view(client, view["run_id"])
            engineer = record["tasks"][1]
            assert [a["error"]["code"] if a["error"] else None for a in engineer["attempts"]] == [
                "rate_limited",
                None,
            ]
            assert engineer["attempts"][0]["telemetry"]["http_status"] == 429
            assert engineer["totals"]["attempts"] == 2
            assert fake.calls() == {"architect": 1, "engineer": 2, "reviewer": 1}

            fake.set_scenario({"default": [{"error": "auth"}]})
            failed = await call(client, "orchestrate_start", request="Another", wait_seconds=60)
            assert failed["status"] == "failed"
            assert failed["tasks"][0]["error"]["code"] == "auth"
            assert fake.calls() == {"architect": 1}, "an auth error is not retried"
        assert CANARY not in read_log(log)
        assert CANARY not in str(view) + str(failed) + str(record)
        assert all(CANARY in str(r["headers"]) for r in fake.requests())
    stored = "".join(p.read_text(errors="replace") for p in (tmp_path / "runs").rglob("*") if p.is_file())
    assert "code from the model" in stored and CANARY not in stored


async def test_long_retry_after_is_a_durable_wait_that_survives_a_restart(tmp_path: Path) -> None:
    scenario = {"writer": [{"error": "rate_limited", "retry_after": 4}, {"text": "the docs"}]}
    log = tmp_path / "server.log"
    with FakeProvider(scenario) as fake:
        env = provider_env(tmp_path, fake, CONSTRUCT_RETRY_WAIT_CAP_SECONDS="1")
        async with stdio_client_for(env, log) as client:
            view = await call(client, "orchestrate_start", request="Docs", chain=["writer"], wait_seconds=0)
            run_id = view["run_id"]
            waiting = await until(
                client,
                run_id,
                lambda v: v["next_action"]["kind"] == "wait" and v["next_action"].get("not_before"),
            )
            assert waiting["status"] == "queued"
        # The server is gone while the wait runs out; a new one finishes the task.
        async with stdio_client_for(env, log) as client:
            done = await until(client, run_id, lambda v: v["status_kind"] == "terminal")
        assert done["status"] == "completed"
        assert done["tasks"][0]["output_preview"] == "the docs"
        assert fake.calls() == {"writer": 2}


async def test_cancel_aborts_a_call_in_flight(tmp_path: Path) -> None:
    scenario = {"writer": [{"delay_seconds": 30, "text": "too late"}]}
    log = tmp_path / "server.log"
    with FakeProvider(scenario) as fake:
        async with stdio_client_for(provider_env(tmp_path, fake), log) as client:
            view = await call(client, "orchestrate_start", request="Docs", chain=["writer"], wait_seconds=0)
            run_id = view["run_id"]
            await until(client, run_id, lambda v: v["status"] == "running")
            with anyio.fail_after(5):
                cancelled = await call(client, "orchestrate_cancel", run_id=run_id, reason="stop")
            assert cancelled["status"] == "cancelled"
            await anyio.sleep(1)
            after = await call(client, "run_status", run_id=run_id)
            record = await full_view(client, run_id)
        assert after["status"] == "cancelled"
        assert after["tasks"][0]["status"] == "cancelled"
        assert "output_preview" not in after["tasks"][0] and "output_chars" not in after["tasks"][0]
        assert record["tasks"][0]["output"] is None and record["tasks"][0]["output_preview"] is None
        assert "call_aborted" in read_log(log) or "cancel" in read_log(log)

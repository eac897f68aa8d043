"""The scale bench's thin MCP client (bench/scale_client.py) against a real server: runs it
starts through ``orchestrate_start`` complete as those the SDK's ``mcp.Client`` starts, its
answers are the SDK's (``run_status`` of one run reads the same through both), and a refused call
is an error result, not an exception."""

from __future__ import annotations

from pathlib import Path

from bench.scale_client import thin_clients
from tests.acceptance.cluster import (
    check_runs,
    clients,
    fake_provider_process,
    records,
    server_env,
    servers,
    start_runs,
    wait_for_runs,
)
from tests.acceptance.harness import call
from tests.acceptance.store_targets import store_target


async def test_the_thin_client_starts_runs_and_reads_what_the_sdk_client_reads(tmp_path: Path) -> None:
    async with (
        store_target("sqlite", tmp_path / "store") as target,
        fake_provider_process({"default": [{"text": "done"}]}, tmp_path / "fake") as fake,
    ):
        env = [("s0", server_env(target, tmp_path / "s0", fake, {}), tmp_path / "s0")]
        async with servers(env) as running, thin_clients(running * 2) as thin, clients(running) as (sdk,):
            run_ids = await start_runs(thin, [f"t{n}" for n in range(6)], parallel=4)
            await wait_for_runs(target, 6, within=60)
            for run_id in run_ids.values():
                assert await call(thin[0], "run_status", run_id=run_id) == await call(
                    sdk, "run_status", run_id=run_id
                )
            refused = await thin[1].call_tool("run_status", {"run_id": "no-such-run"})
            assert refused.is_error
        check_runs(await records(target, run_ids), await fake.calls())

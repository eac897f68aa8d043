"""The run page and the runs list of a run nobody drives, in headless Chromium: a ``runs start``
in a terminal is stopped with Ctrl-C mid-call while the server on the same home has no free slot
to take the run over (``dispatch_concurrency`` 1, its slot held by a long call of its own). The
page says nobody is driving the run, since when, and the command that continues it — not
"Working…" — and the list says so on the run's row.

``CONSTRUCT_SCREENSHOTS=<dir>`` keeps the screenshot (``run-page-unattended.png``)."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.acceptance.harness import REPO, call
from tests.acceptance.terminal import Terminal
from tests.acceptance.test_mcp_http import http_server
from tests.browser.cdp import chromium, chromium_path
from tests.browser.test_run_panel import screenshot_path
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

LONG = {"text": "".join(f"line {i}\n" for i in range(200)), "chunk_chars": 7, "chunk_delay_seconds": 0.3}


async def test_the_page_says_nobody_drives_a_run_whose_driver_stopped(tmp_path: Path) -> None:
    chromium_path()
    with FakeProvider({"writer": [LONG, LONG]}) as fake:
        env = {
            "CONSTRUCT_WORKER_BACKEND": "provider",
            "CONSTRUCT_MODEL": "claude-test-1",
            "CONSTRUCT_ANTHROPIC_BASE_URL": fake.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-test-unattended-page",
        }
        async with (
            http_server(tmp_path, "streamable-http", CONSTRUCT_DISPATCH_CONCURRENCY="1", **env) as port,
            httpx2.AsyncClient(timeout=30) as http,
            Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as client,
            chromium(tmp_path / "chromium.log") as browser,
        ):
            # The server's one slot: a long call of its own.
            await call(client, "orchestrate_start", request="Keep busy.", chain=["writer"], wait_seconds=0)
            cli_env = {"PYTHONPATH": str(REPO), "CONSTRUCT_HOME": str(tmp_path), **env}
            with Terminal(["runs", "start", "Write it.", "--specialists", "writer"], cli_env) as term:
                run_id = term.expect(r"run (run-\S+) started")[1]
                term.expect(r"writer> line 0")
                term.interrupt()
                assert term.wait() == 130

            page = await browser.new_page(1000, 700)
            await page.navigate(f"http://127.0.0.1:{port}/runs/{run_id}")
            said = await page.wait_for(
                "document.getElementById('next').textContent.startsWith('Nobody') && "
                "document.getElementById('next').textContent"
            )
            assert "the process that drove it stopped" in said
            assert f"construct-mcp runs resume {run_id}" in said, said
            await page.screenshot(screenshot_path(tmp_path, "run-page-unattended.png"))

            await page.navigate(f"http://127.0.0.1:{port}/runs")
            row = await page.wait_for(
                f"[...document.querySelectorAll('#runs tr')].map(r => r.textContent)"
                f".find(t => t.includes('{run_id}') && t.includes('nobody drives it'))"
            )
            assert f"construct-mcp runs resume {run_id}" in row

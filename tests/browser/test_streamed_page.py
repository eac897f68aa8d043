"""The run page and the run panel while a task's call streams (issue 25), in headless Chromium
against a server subprocess whose provider streams slowly: the running task's text grows in place
(read from the run's ``output_delta`` events: the page's events endpoint, the panel's ``run_events``
through the host), then the recorded output replaces it when the call ends.

``CONSTRUCT_SCREENSHOTS=<dir>`` keeps the screenshots (``run-page-streaming.png``,
``run-panel-streaming.png``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client import advertise
from mcp.client.streamable_http import streamable_http_client
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID
from mcp.types import TextResourceContents

from server.web.panel import PANEL_URI
from tests.acceptance.harness import call
from tests.acceptance.test_mcp_http import http_server
from tests.browser.apps_host import AppsHost
from tests.browser.cdp import Page, chromium, chromium_path
from tests.browser.test_run_panel import screenshot_path
from tests.fakes.fake_provider import FakeProvider

pytestmark = pytest.mark.slow

ANSWER = "".join(f"Review note {i}: the change keeps the limiter's state per client.\n" for i in range(40))


def provider_env(fake: FakeProvider) -> dict[str, str]:
    return {
        "CONSTRUCT_WORKER_BACKEND": "provider",
        "CONSTRUCT_MODEL": "claude-test-1",
        "CONSTRUCT_ANTHROPIC_BASE_URL": fake.base_url,
        "ANTHROPIC_API_KEY": "sk-ant-test-streamed-page",
    }


LIVE = "document.querySelector('pre[data-live=\"writer\"]')"


async def text_grows(frame: Page) -> str:
    """The live text, once it has grown by 200 characters since it was first 100 long."""
    first = await frame.wait_for(f"{LIVE} && {LIVE}.textContent.length > 100 && {LIVE}.textContent.length")
    grown = await frame.wait_for(f"{LIVE} && {LIVE}.textContent.length > {first} + 200 && {LIVE}.textContent")
    assert ANSWER.startswith(grown)
    return str(grown)


async def test_the_page_shows_a_running_tasks_text_growing_then_its_output(tmp_path: Path) -> None:
    chromium_path()
    scenario = {"writer": [{"text": ANSWER, "chunk_chars": 24, "chunk_delay_seconds": 0.05}]}
    with FakeProvider(scenario) as fake:
        async with (
            http_server(tmp_path, "streamable-http", **provider_env(fake)) as port,
            httpx2.AsyncClient(timeout=30) as http,
            Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as client,
            chromium(tmp_path / "chromium.log") as browser,
        ):
            view = await call(
                client, "orchestrate_start", request="Review it.", chain=["writer"], wait_seconds=0
            )
            page = await browser.new_page(1000, 900)
            await page.navigate(f"http://127.0.0.1:{port}/runs/{view['run_id']}")
            live = "document.querySelector('pre[data-live=\"writer\"]')"
            first = await page.wait_for(
                f"{live} && {live}.textContent.length > 100 && {live}.textContent.length"
            )
            grown = await page.wait_for(
                f"{live} && {live}.textContent.length > {first} + 200 && {live}.textContent"
            )
            assert ANSWER.startswith(grown)
            note = await page.evaluate("document.querySelector('[data-live-note=\"writer\"]').textContent")
            assert note.startswith("Writing… ") and "recorded when the call ends" in note
            # The answer is visibly coming in: the task is not said to wait for it.
            task = await page.evaluate(
                "document.querySelector('[data-live=\"writer\"]').parentElement.textContent"
            )
            assert "waits for" not in task, task
            await page.screenshot(screenshot_path(tmp_path, "run-page-streaming.png"))
            # The call ends: the recorded output is shown, the live box is gone.
            await page.wait_for(
                "!document.querySelector('pre[data-live]') && !!document.querySelector('pre.out')"
            )
            shown = await page.evaluate("document.querySelector('pre.out').textContent")
            assert shown.strip() == ANSWER.strip() or ANSWER.startswith(shown)


async def test_the_panel_shows_the_text_growing_through_run_events_via_the_host(tmp_path: Path) -> None:
    chromium_path()
    scenario = {"writer": [{"text": ANSWER, "chunk_chars": 24, "chunk_delay_seconds": 0.05}]}
    apps = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})
    with FakeProvider(scenario) as fake:
        async with (
            http_server(tmp_path, "streamable-http", **provider_env(fake)) as port,
            Client(f"http://127.0.0.1:{port}/mcp", extensions=[apps]) as client,
            chromium(tmp_path / "chromium.log") as browser,
        ):
            contents = (await client.read_resource(PANEL_URI)).contents[0]
            assert isinstance(contents, TextResourceContents)
            started = await client.call_tool(
                "orchestrate_start", {"request": "Review it.", "chain": ["writer"], "wait_seconds": 0}
            )
            run_id = (started.structured_content or {})["run_id"]
            page = await browser.new_page(900, 1000)
            host = AppsHost(page, client, {"run_id": run_id}, started)
            frame = await host.open(contents.text)
            bridge = asyncio.create_task(host.serve())
            try:
                await text_grows(frame)
                await page.screenshot(screenshot_path(tmp_path, "run-panel-streaming.png"))
                await frame.wait_for(
                    "!document.querySelector('pre[data-live]') && !!document.querySelector('pre.out')"
                )
            finally:
                bridge.cancel()
    reads = [c for c in host.calls if c["name"] == "run_events"]
    assert reads and all(c["arguments"]["run_id"] == run_id for c in reads)
    assert reads[-1]["arguments"]["output_after"] > 0  # it read on from the page's cursor

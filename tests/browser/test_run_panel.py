"""The run panel in a real browser, as an MCP Apps host shows it: a server subprocess over
Streamable HTTP, the official client declaring Apps support, and headless Chromium rendering the
tool's UI resource in a sandboxed iframe of a test host page that speaks the Apps bridge
(:mod:`tests.browser.apps_host`). A gated run is rendered, the approve button is clicked, and the
run moves on; a change made elsewhere shows up while the panel is open.

``CONSTRUCT_SCREENSHOTS=<dir>`` keeps the screenshot (the documentation's pictures are made by
``scripts/screenshots.py``)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from mcp import Client
from mcp.client import advertise
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID
from mcp.types import TextResourceContents

from server.web.panel import PANEL_URI
from tests.acceptance.test_mcp_http import http_server
from tests.browser.apps_host import AppsHost, click_in_frame
from tests.browser.cdp import chromium, chromium_path

pytestmark = pytest.mark.slow

#: Model output is untrusted: markup in it must show as text.
HOSTILE = "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>"
PLAN = (
    "## Plan\n\n"
    + HOSTILE
    + "\n"
    + "".join(f"{i}. Step {i}: a token bucket per client id.\n" for i in range(1, 40))
)

#: Where a page's content ends (a screenshot is cut there).
BOTTOM = "Math.ceil(document.querySelector('main').getBoundingClientRect().bottom) + 12"


def screenshot_path(tmp_path: Path, name: str) -> Path:
    folder = os.environ.get("CONSTRUCT_SCREENSHOTS")
    return Path(folder) / name if folder else tmp_path / name


async def gated_run(client: Client) -> str:
    """A run whose architect answered, waiting at the gate before the engineer."""
    started = await client.call_tool(
        "orchestrate_start",
        {"request": "Add a rate limiter to the API gateway " + HOSTILE, "approve_before": ["engineer"]},
    )
    run_id = str((started.structured_content or {})["run_id"])
    resumed = await client.call_tool(
        "orchestrate_resume", {"run_id": run_id, "task_id": "architect", "output": PLAN}
    )
    assert (resumed.structured_content or {})["status"] == "awaiting_approval", resumed
    return run_id


async def test_the_panel_renders_a_gated_run_approves_it_through_the_host_and_follows_it(
    tmp_path: Path,
) -> None:
    chromium_path()  # skip (or, under CI, fail) before starting anything
    apps = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})
    async with (
        http_server(tmp_path, "streamable-http") as port,
        Client(f"http://127.0.0.1:{port}/mcp", extensions=[apps]) as client,
        chromium(tmp_path / "chromium.log") as browser,
    ):
        # What a host does: find the tool's UI resource and read it.
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert (tools["run_status"].meta or {})["ui"]["resourceUri"] == PANEL_URI
        contents = (await client.read_resource(PANEL_URI)).contents[0]
        assert isinstance(contents, TextResourceContents) and contents.mime_type == APP_MIME_TYPE
        run_id = await gated_run(client)
        shown = await client.call_tool("run_status", {"run_id": run_id})

        page = await browser.new_page(900, 1100)
        host = AppsHost(page, client, {"run_id": run_id}, shown)
        frame = await host.open(contents.text)
        bridge = asyncio.create_task(host.serve())
        try:
            await frame.wait_for("!!document.querySelector('button.approve')")
            # The gate offers revise (the architect's output can be sent back): a Revise button.
            assert await frame.evaluate("document.querySelectorAll('#gates button.revise').length") == 1
            # The run as the tool answered it: its gate, its steps, the architect's output.
            body = await frame.evaluate("document.body.textContent")
            assert run_id in body and "before:engineer" in body and "Timeline" in body
            assert (
                await frame.evaluate("document.getElementById('status').textContent") == "awaiting approval"
            )
            # Untrusted text stays text: shown verbatim, never parsed into elements.
            assert HOSTILE in await frame.evaluate("document.getElementById('request').textContent")
            await click_in_frame(page, frame, "#tasks details summary")  # open the architect's output
            await frame.wait_for("document.querySelector('#tasks details').open")
            out = await frame.wait_for(
                "document.querySelector('pre.out') && document.querySelector('pre.out').textContent"
            )
            assert "<script>document.title='pwned'</script>" in out
            assert await frame.evaluate("document.querySelectorAll('img, main script').length") == 0
            assert await frame.evaluate("document.title") != "pwned"
            used = await frame.evaluate(BOTTOM) + 24  # + the host's bar
            await page.screenshot(screenshot_path(tmp_path, "run-panel.png"), min(used, 1100))

            # Approve: the panel calls orchestrate_approve through the host, with the gate's id.
            await frame.evaluate("document.querySelector('#gates textarea').focus()")
            await frame.type_text("Looks right; keep the bucket per client.")
            await click_in_frame(page, frame, "button.approve")
            await frame.wait_for(
                "document.getElementById('status').textContent === 'awaiting host'"
                " && document.body.textContent.includes('Waiting for the host to run engineer')"
            )
            approvals = [c for c in host.calls if c["name"] == "orchestrate_approve"]
            assert [a["arguments"]["gate_id"] for a in approvals] == ["before:engineer"]
            assert approvals[0]["arguments"]["decision"] == "approve"
            recorded = (await client.call_tool("run_status", {"run_id": run_id})).structured_content or {}
            gate = recorded["gates"][0]
            assert (
                gate["status"] == "approved" and gate["comment"] == "Looks right; keep the bucket per client."
            )
            assert gate["channel"] == "http"  # a tool call through the host, over HTTP

            # Live: a change made elsewhere (the host model answers the engineer) shows up.
            await client.call_tool(
                "orchestrate_resume", {"run_id": run_id, "task_id": "engineer", "output": "patch applied"}
            )
            await frame.wait_for("document.body.textContent.includes('Waiting for the host to run reviewer')")
            polls = [c for c in host.calls if c["name"] == "run_status"]
            assert polls and all(c["arguments"]["run_id"] == run_id for c in polls)

            # The panel reads the whole record (the tools' answers are compact, for a model):
            # run_status with detail full, through the host, so each output shows whole.
            assert all(c["arguments"].get("detail") == "full" for c in polls)
            await frame.evaluate(
                "document.querySelectorAll('#tasks details').forEach((d) => { d.open = true; })"
            )
            whole = await frame.wait_for(
                "(() => { const p = document.querySelector(\"pre[data-task='architect']\");"
                " const more = document.querySelector(\"button[data-key='full:architect']\");"
                " return !more && p.textContent; })()"
            )
            assert whole == PLAN
        finally:
            bridge.cancel()
            with pytest.raises(asyncio.CancelledError):
                await bridge
        # The panel spoke the bridge: initialize first, then initialized.
        methods = [m.get("method") for m in host.received]
        assert methods[:2] == ["ui/initialize", "ui/notifications/initialized"], json.dumps(methods)

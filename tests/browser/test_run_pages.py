"""The run pages for a person with a browser (``/runs``, ``/runs/{run_id}``), in headless Chromium
against a server subprocess with named tokens: log in, see the runs, open a gated run, approve it
with the keyboard, see the run move on; a token without the approve role sees no buttons.

``CONSTRUCT_SCREENSHOTS=<dir>`` keeps the screenshots (the documentation's pictures are made by
``scripts/screenshots.py``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.acceptance.test_mcp_http import http_server
from tests.browser.cdp import Page, chromium, chromium_path
from tests.browser.test_run_panel import BOTTOM, HOSTILE, PLAN, screenshot_path

pytestmark = pytest.mark.slow

ALICE = "alice-token-" + "7d1e5c3a9b2f4086"  # read, operate: starts the runs
BOB = "bob-token-" + "2a9c6e0f4b7d1358"  # read, approve
VERA = "vera-token-" + "c5e81b3d07a96f24"  # read only
CAROL = "carol-token-" + "8e2f0a6d4c1b9375"  # read, approve; only her own runs (she starts none)

CONFIG = f"""
[tokens.alice]
token = "{ALICE}"
roles = ["read", "operate"]

[tokens.bob]
token = "{BOB}"
roles = ["read", "approve"]

[tokens.vera]
token = "{VERA}"
roles = ["read"]

[tokens.carol]
token = "{CAROL}"
roles = ["read", "approve"]
own_runs_only = true
"""


@asynccontextmanager
async def as_identity(port: int, token: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as authed,
        Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=authed)) as client,
    ):
        yield client


async def gated_run(client: Client) -> str:
    started = await client.call_tool(
        "orchestrate_start",
        {"request": "Add a rate limiter to the API gateway " + HOSTILE, "approve_before": ["engineer"]},
    )
    run_id = str((started.structured_content or {})["run_id"])
    await client.call_tool("orchestrate_resume", {"run_id": run_id, "task_id": "architect", "output": PLAN})
    return run_id


async def log_in(page: Page, token: str) -> None:
    await page.wait_for("!document.getElementById('login').hidden")
    await page.evaluate("document.getElementById('token').focus()")
    await page.type_text(token)
    await page.press("Enter", "\r")


async def click(page: Page, selector: str) -> None:
    """A real mouse click at the centre of ``selector`` (of its first line, for a wrapped link)."""
    x, y = await page.evaluate(
        f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            e.scrollIntoView({{block: 'center'}});
            const r = e.getClientRects()[0]; return [r.x + r.width / 2, r.y + r.height / 2]; }})()"""
    )
    await page.click_at(x, y)


async def test_log_in_open_a_gated_run_and_approve_it_from_the_keyboard(tmp_path: Path) -> None:
    chromium_path()
    (tmp_path / "construct.toml").write_text(CONFIG)
    async with (
        http_server(tmp_path, "streamable-http") as port,
        as_identity(port, ALICE) as alice,
        chromium(tmp_path / "chromium.log") as browser,
    ):
        run_id = await gated_run(alice)
        base = f"http://127.0.0.1:{port}"
        page = await browser.new_page(1100, 1000)
        await page.navigate(f"{base}/runs")

        # A wrong token is refused and the form stays.
        await log_in(page, "not-the-token-" + "0000000000")
        await page.wait_for("document.getElementById('msg').textContent.includes('not accepted')")
        # A reader sees the list, opens the run, and gets no buttons.
        await log_in(page, VERA)
        await page.wait_for("!!document.querySelector('#runs a')")
        # Each run says how long ago it moved (the full times in its title).
        assert await page.evaluate("document.querySelector('#runs time').textContent") == "just now"
        assert "updated " in await page.evaluate("document.querySelector('#runs time').title")
        assert await page.evaluate("document.getElementById('who').textContent") == "Signed in as vera"
        await click(page, "#runs a")
        await page.wait_for(f"location.pathname === '/runs/{run_id}' && document.readyState === 'complete'")
        await page.wait_for("document.getElementById('gates').textContent.includes('approve role')")
        assert await page.evaluate("document.querySelectorAll('button.approve').length") == 0

        # An approver, on the same page after signing out and in again.
        await click(page, "#signout")
        await log_in(page, BOB)
        await page.wait_for("!!document.querySelector('button.approve')")
        # The architect's plan can be sent back: this gate offers Revise.
        assert await page.evaluate("document.querySelectorAll('button.revise').length") == 1
        # The gate shows what it approves: the engineer starts on the architect's plan.
        review = await page.evaluate("document.querySelector('#gates pre[data-review]').textContent")
        assert review == PLAN[: len(review)] and len(review) > 20
        assert "on the output of architect" in await page.evaluate(
            "document.getElementById('gates').textContent"
        )
        # Untrusted text is shown as text.
        assert HOSTILE in await page.evaluate("document.getElementById('request').textContent")
        assert await page.evaluate("document.querySelectorAll('img, main script').length") == 0
        # The token lives in this tab's session storage; there is no cookie.
        assert await page.evaluate("sessionStorage.getItem('construct-mcp-token')") == BOB
        assert await page.evaluate("document.cookie") == ""
        used = await page.evaluate(BOTTOM)
        await page.screenshot(screenshot_path(tmp_path, "run-page.png"), min(used, 1000))
        # The whole of what is under review, in the gate's card.
        await click(page, "[data-key='review:before:engineer']")
        await page.wait_for(
            f"document.querySelector('#gates pre[data-review]').textContent === {json.dumps(PLAN)}"
        )
        # Revise without a comment sends nothing: it asks for one.
        await click(page, "button.revise")
        await page.wait_for("document.getElementById('msg').textContent.includes('write what should change')")
        assert await page.evaluate("document.activeElement.tagName") == "TEXTAREA"
        pending = (await alice.call_tool("run_status", {"run_id": run_id})).structured_content or {}
        assert pending["gates"][0]["status"] == "requested"

        # The keyboard alone: a comment, Tab to Approve, Enter.
        await page.evaluate("document.querySelector('#gates textarea').focus()")
        await page.type_text("Go ahead.")
        await page.press("Tab")
        assert await page.evaluate("document.activeElement.dataset.key") == "approve:before:engineer"
        await page.press("Enter", "\r")
        await page.wait_for(
            "document.getElementById('status').textContent === 'awaiting host'"
            " && document.getElementById('gates').textContent.includes('approved by bob (verified) via web')"
        )
        # The record: bob, verified, through the web page, with his comment.
        view = (await alice.call_tool("run_status", {"run_id": run_id})).structured_content or {}
        gate = view["gates"][0]
        assert (
            gate["status"],
            gate.get("approver"),
            gate.get("verified", False),
            gate["channel"],
            gate["comment"],
        ) == (
            "approved",
            "bob",
            True,
            "web",
            "Go ahead.",
        )
        assert view["next_action"]["kind"] == "run_host_task"

        # Narrow, as in a side panel: still one readable column (no horizontal scrolling).
        narrow = await browser.new_page(380, 900)
        await narrow.navigate(f"{base}/runs/{run_id}")
        await log_in(narrow, VERA)
        await narrow.wait_for("document.getElementById('status').textContent === 'awaiting host'")
        assert await narrow.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        await narrow.screenshot(tmp_path / "run-page-narrow.png")

        # A gate before the first step has nothing to send back: no Revise button there.
        first = await alice.call_tool(
            "orchestrate_start", {"request": "Plan it", "approve_before": ["architect"]}
        )
        first_id = str((first.structured_content or {})["run_id"])
        await page.navigate(f"{base}/runs/{first_id}")
        await page.wait_for("!!document.querySelector('button.approve')")
        assert await page.evaluate("document.querySelectorAll('button.revise').length") == 0
        assert await page.evaluate("document.querySelectorAll('button.reject').length") == 1
        assert "nothing ran before it" in await page.evaluate("document.getElementById('gates').textContent")
        # Reject ends the run: the first click only asks; "Keep the run" takes it back.
        await click(page, "button.reject")
        await page.wait_for(
            "document.querySelector('button.reject').textContent.startsWith('Confirm reject')"
        )
        await click(page, "[data-key='keep:before:architect']")
        await page.wait_for("document.querySelector('button.reject').textContent === 'Reject'")
        still = (await alice.call_tool("run_status", {"run_id": first_id})).structured_content or {}
        assert still["gates"][0]["status"] == "requested"
        await click(page, "button.reject")
        await page.wait_for(
            "document.querySelector('button.reject').textContent.startsWith('Confirm reject')"
        )
        await click(page, "button.reject")
        await page.wait_for("document.getElementById('gates').textContent.includes('rejected by bob')")
        done = (await alice.call_tool("run_status", {"run_id": first_id})).structured_content or {}
        assert done["gates"][0]["status"] == "rejected"

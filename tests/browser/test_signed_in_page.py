"""The run pages signed in through the ``[auth]`` issuer, in headless Chromium: opening ``/runs``
goes to the stand-in issuer and back (consent given at once), the page renders the runs as the
signed-in person under its strict policy, an approval from the page is recorded as that person,
verified, and *Sign out* leaves the page with the sign-in link and the session refused."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from tests.acceptance.harness import full_view
from tests.acceptance.oauth_issuer import running_issuer
from tests.acceptance.test_oauth_tokens import STATIC, as_bearer
from tests.acceptance.test_page_sign_in import COOKIE, signing_server
from tests.browser.cdp import chromium, chromium_path
from tests.browser.test_run_pages import click, gated_run

pytestmark = pytest.mark.slow


async def test_the_signed_in_page_renders_decides_and_signs_out(tmp_path: Path) -> None:
    chromium_path()
    with running_issuer() as issuer:
        async with (
            signing_server(tmp_path, issuer) as base,
            as_bearer(f"{base}/mcp", STATIC) as ci,
            chromium(tmp_path / "chromium.log") as browser,
        ):
            run_id = await gated_run(ci)
            page = await browser.new_page(1100, 1000)
            await page.navigate(f"{base}/runs")
            # Through the issuer and back, to the list, signed in.
            await page.wait_for(f"location.href === '{base}/runs' && !!document.querySelector('#runs a')")
            who = await page.evaluate("document.getElementById('who').textContent")
            assert who == "Signed in as erin@example.com"
            assert await page.evaluate("document.getElementById('login').hidden")
            # The session cookie is HttpOnly: the page's script cannot read it.
            assert await page.evaluate("document.cookie") == ""
            assert issuer.fetches["authorize"] == 1 and issuer.fetches["token"] == 1

            await click(page, "#runs a")
            await page.wait_for("!!document.querySelector('button.approve')")
            await click(page, "button.approve")
            await page.wait_for(
                "document.getElementById('gates').textContent"
                ".includes('approved by erin@example.com (verified) via web')"
            )
            record = await full_view(ci, run_id)
            gate = next(g for g in record["gates"] if g["gate_id"] == "before:engineer")
            assert (gate["approver"], gate["channel"], gate["verified"]) == ("erin@example.com", "web", True)
            cookies = await page.send("Network.getCookies", {"urls": [base]})
            (session,) = [c for c in cookies["cookies"] if c["name"] == COOKIE]
            assert session["httpOnly"] and session["sameSite"] == "Lax" and session["path"] == "/"

            await click(page, "#signout")
            await page.wait_for(
                "!document.getElementById('login').hidden && !document.getElementById('signinlink').hidden"
            )
            # The cookie the browser held is refused now.
            async with httpx2.AsyncClient(base_url=base, cookies={COOKIE: session["value"]}) as replay:
                answer = await replay.get(f"/runs/api/runs/{run_id}")
                assert answer.status_code == 401 and run_id not in answer.text

"""The run page of a run whose chain was edited while it waited, in headless Chromium: it names the
chain's version the run is on and says the configuration has a newer one, with the command that
moves the run (or why the run stays).

``CONSTRUCT_SCREENSHOTS=<dir>`` keeps the screenshot (``run-page-behind.png``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.test_cli_upgrade import parked
from tests.acceptance.test_mcp_http import http_server
from tests.browser.cdp import chromium, chromium_path
from tests.browser.test_run_panel import screenshot_path

pytestmark = pytest.mark.slow

SAID = "document.getElementById('chain').textContent"


async def chain_line(tmp_path: Path, edit: str, shot: str | None = None) -> tuple[str, str]:
    """A run parked at the gate before its reviewer, the configuration then edited with ``edit``:
    the run id and the page's chain line (``shot``: its screenshot's name)."""
    chromium_path()
    run_id = parked(tmp_path)
    with (tmp_path / "construct.toml").open("a") as config:
        config.write(edit)
    async with (
        http_server(tmp_path, "streamable-http") as port,
        chromium(tmp_path / "chromium.log") as browser,
    ):
        page = await browser.new_page(1000, 700)
        await page.navigate(f"http://127.0.0.1:{port}/runs/{run_id}")
        said: str = await page.wait_for(f"{SAID}.includes('newer') && {SAID}")
        if shot is not None:
            await page.screenshot(screenshot_path(tmp_path, shot))
    return run_id, said


async def test_the_page_names_the_version_and_the_newer_one(tmp_path: Path) -> None:
    edit = '[specialists.reviewer]\ndescription = "Reviews"\npersona = "You check security first."\n'
    run_id, said = await chain_line(tmp_path, edit, "run-page-behind.png")
    assert said.startswith("Chain review v1. A newer version, v2, is configured (upgrade = manual)"), said
    assert f"“construct-mcp runs upgrade {run_id}” moves this run." in said, said


async def test_the_page_says_why_a_run_stays_on_its_version(tmp_path: Path) -> None:
    edit = '[specialists.architect]\ndescription = "Designs"\npersona = "You design for scale."\n'
    _, said = await chain_line(tmp_path, edit)
    assert "this run stays on its version: " in said and "architect" in said, said

"""The documentation's pictures (``python scripts/screenshots.py``), made by the same generator into
a temporary folder, in headless Chromium: each is a PNG of a sensible size, and what the page (and
the panel's frame) held when it was taken is a run of the built-in chain with its real task names,
never a test fixture (no markup-injection probe, no "Test MCP Apps host")."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.screenshots import CHAIN, COMMENT, REQUEST, generate, png_size
from tests.browser.cdp import chromium_path

pytestmark = pytest.mark.slow

#: What the pictures of the test fixtures showed (tests/browser/test_run_panel.py, apps_host.py).
FIXTURE_MARKERS = ("onerror", "<img", "Test MCP Apps host", "test host")
TASKS = ("architect", "engineer", "reviewer")


async def test_the_pictures_show_a_real_chain_and_no_fixture_text(tmp_path: Path) -> None:
    chromium_path()  # skip (or, under CI, fail) before starting anything
    out = tmp_path / "images"
    pictures = await generate(out, tmp_path)
    assert [p.path for p in pictures] == [
        out / "run-page.png",
        out / "run-panel.png",
        out / "run-page-streaming.png",
    ]
    for picture in pictures:
        data = picture.path.read_bytes()
        width, height = png_size(data)
        # A README picture: readable width, not a strip nor a scroll of a page; not blank, not huge.
        assert 800 <= width <= 1200 and 600 <= height <= 1100, (picture.path.name, width, height)
        assert 30_000 < len(data) < 300_000, (picture.path.name, len(data))
        for marker in FIXTURE_MARKERS:
            assert marker.lower() not in picture.text.lower(), (picture.path.name, marker)
            assert marker.lower() not in picture.html.lower(), (picture.path.name, marker)
        assert REQUEST in picture.text
        assert all(task in picture.text for task in TASKS), picture.path.name

    page, panel, streaming = pictures
    # The page: the chain waiting at the gate before the engineer, the architect's plan open.
    assert f"{CHAIN} · run-" in page.text and "awaiting approval" in page.text
    assert "before:engineer" in page.text and "Approve" in page.text and "Signed in as maria" in page.text
    assert "## Build plan" in page.text
    # The panel: the run completed, both gates decided by the lead, one revision asked and made.
    assert "completed" in panel.text and f"“{COMMENT}”" in panel.text
    assert "approved by maria (verified) via web" in panel.text
    assert "reviewer: verdict = revise → engineer~2" in panel.text
    assert "reviewer~2: verdict = approve → end" in panel.text
    # The streamed call: the engineer's text growing while the provider writes it.
    assert "engineer running" in streaming.text and "Writing… " in streaming.text
    assert "by provider:anthropic:" in streaming.text

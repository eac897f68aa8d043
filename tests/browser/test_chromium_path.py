"""Where no Chromium can be found, the browser tests skip with a clear message, except under
``CI=true``, where they fail (``.ci/run`` installs the browser)."""

from __future__ import annotations

import pytest

from tests.browser.cdp import chromium_path


def test_no_chromium_skips_with_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSTRUCT_TEST_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium"):
        chromium_path()


def test_no_chromium_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSTRUCT_TEST_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no Chromium found"):
        chromium_path()

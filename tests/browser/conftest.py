"""Fixtures of the browser suites: one headless Chromium for the session, reset between tests."""

from __future__ import annotations

import pytest

from browser_kit import Browser, require_browser, start_chromium


@pytest.fixture(scope="session")
def _chromium(tmp_path_factory: pytest.TempPathFactory):
    require_browser()
    driver = start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(_chromium) -> Browser:
    """The session's Chromium on a blank page with an empty console; left on a blank page afterwards."""
    _chromium.get("about:blank")
    _chromium.get_log("browser")
    yield Browser(_chromium)
    _chromium.get("about:blank")

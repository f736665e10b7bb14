"""A real browser for the tests that need one (registered in tests/conftest.py's
pytest_plugins): Debian's Chromium, headless, driven by Selenium through chromedriver.

The browser is installed by the test setup (``make test`` runs ``make browser``; the fixture
runs the same script when the binaries are missing). Where it still cannot be had, the test
skips and says why.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

ARTIFACTS = ROOT / "test-artifacts"
INSTALLER = ROOT / "tests" / "browser" / "install-chromium.sh"


def _binaries() -> tuple[str | None, str | None]:
    return shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium under Selenium; installs Debian's packages first if they are missing."""
    chromium, driver = _binaries()
    if not (chromium and driver):
        subprocess.run(["sh", str(INSTALLER)], check=False, timeout=900)
        chromium, driver = _binaries()
    if not (chromium and driver):
        pytest.skip(
            f"no browser: chromium={chromium} chromedriver={driver} after {INSTALLER.name} "
            "(needs root and apt-get with Debian's chromium and chromium-driver packages)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:  # pragma: no cover - selenium is pinned in requirements/dev.txt
        pytest.skip(f"selenium is not installed: {exc}")

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="vpay-chromium-")
    # Headless as root, and nothing that reaches for the network beyond the live server.
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    try:
        session = webdriver.Chrome(options=options, service=Service(driver))
    except Exception as exc:  # the binary is there but cannot start here: say exactly why
        pytest.skip(f"chromium could not start: {type(exc).__name__}: {str(exc)[:500]}")
    session.set_page_load_timeout(30)
    session.implicitly_wait(0)
    yield session
    session.quit()
    shutil.rmtree(profile, ignore_errors=True)


def shot(browser, name: str, folder: str = "browser") -> Path:
    """A screenshot under ``test-artifacts/<folder>/``, checked to be a real picture."""
    path = ARTIFACTS / folder / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(path))
    assert path.stat().st_size > 1000  # a real picture of a page
    return path


def navigate_by(browser, element) -> None:
    """Click something that loads a new page, and wait until the old page is gone."""
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    element.click()
    WebDriverWait(browser, 20).until(lambda _: _gone(expected_conditions.staleness_of(element), browser))


# What chromedriver answers, instead of a stale element, for an element whose document is being
# replaced while it looks (a full run failed on it once, mid-navigation): the old page is gone.
_DOCUMENT_REPLACED = "does not belong to the document"


def _gone(stale, browser) -> bool:
    from selenium.common.exceptions import WebDriverException

    try:
        return stale(browser)
    except WebDriverException as exc:
        if _DOCUMENT_REPLACED in (exc.msg or ""):
            return True
        raise


def text_of(browser) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.TAG_NAME, "body").text

"""Browser-test fixtures: the portal of ``tests.browser.harness`` and headless Chromium."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.harness import CHROMIUM, CHROMIUM_ARGS, ROOT, Driver, Server, start_portal

SCREENSHOTS = ROOT / "docs" / "screenshots"

__all__ = ["Driver", "Server", "login", "screenshot", "wait_live"]


@pytest.fixture(scope="session")
def portal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Driver, Any]]:
    """A migrated, seeded portal served by daphne, with its driver."""
    server, driver, tenants = start_portal(tmp_path_factory.mktemp("browser-portal"))
    try:
        yield server, driver, tenants
    finally:
        driver.close()
        server.stop()


@pytest.fixture(scope="session")
def server(portal: tuple[Server, Driver, Any]) -> Server:
    return portal[0]


@pytest.fixture(scope="session")
def driver(portal: tuple[Server, Driver, Any]) -> Driver:
    return portal[1]


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, through Playwright (never a downloaded browser)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def login(browser: Any, server: Server, username: str, width: int = 1280) -> Any:
    """A new browser context logged in as ``username``; returns its first page."""
    context = browser.new_context(viewport={"width": width, "height": 860}, base_url=server.url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/")
    return page


def screenshot(page: Any, name: str) -> None:
    """Save a full-page screenshot for the docs."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def wait_live(page: Any) -> None:
    """Wait until the page's socket is subscribed (its badge says live)."""
    page.wait_for_function("window.__portalLive && window.__portalLive.state === 'live'")

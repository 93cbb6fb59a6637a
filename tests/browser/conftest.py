"""Browser-test fixtures: the portal of ``devtools.browser`` and headless Chromium.

Two guards for honest results:

- every page a test opens is watched for Content-Security-Policy violations (Chromium
  reports each one on the console); a test with any fails at teardown, so a page that
  only works with inline script cannot pass;
- the run's summary says loudly how many browser tests were skipped, and why, so a
  machine without Chromium cannot pass them silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.browser import ROOT, Driver, Server, start_portal
from tests.chromium import launched_chromium

SCREENSHOTS = ROOT / "docs" / "screenshots"

__all__ = [
    "Driver",
    "Server",
    "assert_all_titled",
    "chart_axes",
    "login",
    "screenshot",
    "wait_live",
    "watch_csp",
]

# Console messages of the current test that report a blocked script, style, frame or fetch.
CSP_VIOLATIONS: list[str] = []
BROWSER_DIR = Path(__file__).resolve().parent


def watch_csp(context: Any) -> None:
    """Record every CSP violation that any page of ``context`` reports."""

    def on_console(message: Any) -> None:
        if "Content Security Policy" in message.text:
            CSP_VIOLATIONS.append(f"{message.page.url if message.page else '?'}: {message.text}")

    context.on("console", on_console)


@pytest.fixture(autouse=True)
def no_csp_violations() -> Iterator[None]:
    """Fail the test if any page it opened broke the Content-Security-Policy."""
    CSP_VIOLATIONS.clear()
    yield
    if CSP_VIOLATIONS:
        found = "\n".join(CSP_VIOLATIONS)
        CSP_VIOLATIONS.clear()
        pytest.fail(f"Content-Security-Policy violations:\n{found}", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say loudly how many browser tests were skipped (a fresh machine skips them all)."""
    skipped = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if Path(str(report.fspath)).resolve().is_relative_to(BROWSER_DIR)
    ]
    if not skipped:
        return
    reasons = sorted(
        {
            str(report.longrepr[-1]).removeprefix("Skipped: ")
            for report in skipped
            if report.longrepr
        }
    )
    terminalreporter.write_sep(
        "!", f"{len(skipped)} BROWSER TESTS SKIPPED: {'; '.join(reasons)}", red=True, bold=True
    )
    terminalreporter.write_line(
        "Install Debian's chromium (`make test` does when apt-get is available) to run them.",
        red=True,
    )


# Package scope, not session: the portal's daphne, its driver and Chromium stop once the
# last browser test ran, rather than idling (or serving a failed test's live page) beside
# the end-to-end tests that follow, which need both cores.
@pytest.fixture(scope="package")
def portal(
    browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Driver, Any]]:
    """A migrated, seeded portal served by daphne, with its driver.

    It asks for ``browser`` first: without Chromium a test skips before a portal is
    migrated and served for nothing.
    """
    server, driver, tenants = start_portal(tmp_path_factory.mktemp("browser-portal"))
    try:
        yield server, driver, tenants
    finally:
        driver.close()
        server.stop()


@pytest.fixture(scope="package")
def server(portal: tuple[Server, Driver, Any]) -> Server:
    return portal[0]


@pytest.fixture(scope="package")
def driver(portal: tuple[Server, Driver, Any]) -> Driver:
    return portal[1]


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, through Playwright (never a downloaded browser)."""
    with launched_chromium() as chromium:
        yield chromium


@pytest.fixture(autouse=True)
def close_contexts(request: pytest.FixtureRequest) -> Iterator[None]:
    """Close whatever browser contexts a test left open (one that failed before its close()).

    A left page stays live: its socket and timers kept Chromium and the portal's daphne
    busy (about half a core) for the rest of the run.
    """
    yield
    if "browser" in request.fixturenames:
        for context in list(request.getfixturevalue("browser").contexts):
            context.close()


def login(browser: Any, server: Server, username: str, width: int = 1280) -> Any:
    """A new browser context logged in as ``username``; returns its first page."""
    context = browser.new_context(viewport={"width": width, "height": 860}, base_url=server.url)
    context.set_default_timeout(10_000)
    watch_csp(context)
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
    page.wait_for_function("() => window.__portalLive && window.__portalLive.state === 'live'")


# Every visible cartesian axis of every Plotly chart on the page, with the title it was given.
# plotly.js 4 ignores a title given as a plain string, so ``layout.<axis>.title.text`` is
# exactly what the reader sees; an axis without it is an unlabelled axis.
AXES = """() => [...document.querySelectorAll('.js-plotly-plot')].map(gd => ({
  id: gd.id,
  axes: Object.keys(gd._fullLayout)
    .filter(k => /^[xy]axis[0-9]*$/.test(k) && gd._fullLayout[k].visible)
    .map(k => [k, ((gd.layout[k] || {}).title || {}).text || '', gd._fullLayout[k].title.text]),
}))"""


def chart_axes(page: Any) -> dict[str, dict[str, str]]:
    """``{chart id: {axis: title}}``; fails on an axis whose layout title is not what is drawn."""
    found: dict[str, dict[str, str]] = {}
    for chart in page.evaluate(AXES):
        for name, given, drawn in chart["axes"]:
            assert given == drawn, (chart["id"], name, given, drawn)
        found[chart["id"]] = {name: given for name, given, _ in chart["axes"]}
    return found


def assert_all_titled(charts: dict[str, dict[str, str]], expected: set[str]) -> None:
    assert expected <= set(charts), f"charts missing: {expected - set(charts)}"
    untitled = {
        (chart, axis) for chart, axes in charts.items() for axis, t in axes.items() if not t
    }
    assert not untitled, f"axes without a title: {sorted(untitled)}"

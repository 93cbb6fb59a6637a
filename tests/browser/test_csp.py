"""Every page works under the Content-Security-Policy, and a violation cannot go unseen."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.browser.conftest import CSP_VIOLATIONS, SCREENSHOTS, Server, login

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

PAGES = [
    "/",
    "/jobs/new/",
    "/code/",
    "/account/token/",
    "/cluster/",
    "/cluster/topology/",
    "/whatif/",
    "/admin/",
    "/admin/auth/user/",
    "/no-such-page/",
]


def test_pages_load_without_violations(browser: Any, server: Server) -> None:
    """The autouse guard fails this test on any violation a page reports."""
    root = login(browser, server, "root")
    for path in PAGES:
        root.goto(path)
        root.wait_for_load_state("networkidle")
    root.context.close()


def test_api_docs_render_under_the_policy(browser: Any, server: Server) -> None:
    """Swagger UI starts from its own script file and shows the operations."""
    root = login(browser, server, "root")
    root.goto("/api/docs/")
    root.wait_for_selector(".swagger-ui .opblock")
    assert root.locator(".swagger-ui .opblock").count() > 5
    # the portal's bar leads back, and the page keeps the portal's icon
    assert root.locator(".portal-bar a[href='/']").count() >= 1
    assert root.locator("link[rel=icon][href$='favicon.svg']").count() == 1
    root.set_viewport_size({"width": 1280, "height": 700})
    root.screenshot(path=str(SCREENSHOTS / "api-docs.png"))
    root.context.close()


def test_selects_submit_without_inline_handlers(browser: Any, server: Server) -> None:
    """The JCT window select (was an onchange= handler) still reloads the page."""
    root = login(browser, server, "root")
    root.goto("/cluster/")
    root.select_option("#window", "7d")
    root.wait_for_url(re.compile(r"/cluster/\?window=7d$"))
    assert root.locator("#live-cluster").get_attribute("data-window") == "7d"
    root.context.close()


def test_an_inline_script_is_blocked_and_reported(browser: Any, server: Server) -> None:
    """The guard is real: an injected inline script does not run, and it is recorded."""
    root = login(browser, server, "alice")
    root.evaluate(
        "() => { const s = document.createElement('script');"
        " s.textContent = 'window.__injected = true'; document.body.appendChild(s); }"
    )
    for _ in range(50):  # the console event arrives asynchronously
        if CSP_VIOLATIONS:
            break
        root.wait_for_timeout(100)
    assert root.evaluate("() => window.__injected === undefined") is True
    assert any("inline script" in violation for violation in CSP_VIOLATIONS), CSP_VIOLATIONS
    CSP_VIOLATIONS.clear()  # expected here; any other would fail this test
    root.context.close()

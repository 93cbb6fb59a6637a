"""The UI as a product (issue 19): the portal's own error pages, readable charts, small things."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.browser.conftest import Server, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def test_a_tenant_on_an_admin_page_sees_the_portals_404(browser: Any, server: Server) -> None:
    alice = login(browser, server, "alice")
    response = alice.goto("/cluster/")
    assert response is not None and response.status == 404
    assert alice.locator("header.topbar .brand").inner_text() == "GPU portal"
    assert alice.locator(".error-page h1").inner_text() == "Not found"
    assert alice.locator(".error-page a[href='/']").count() == 1
    screenshot(alice, "error-404")
    answer = alice.request.get("/live/cluster.json")
    assert answer.status == 404 and answer.headers["content-type"] == "application/json"
    assert json.loads(answer.text()) == {"message": "Not found.", "errors": {}}
    alice.context.close()

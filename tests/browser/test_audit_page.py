"""The audit page in Chromium: an owner filters their tenant's rows and downloads them as CSV."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest

from tests.browser.conftest import Driver, Server, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def test_an_owner_filters_the_audit_log_and_downloads_it(
    browser: Any, server: Server, driver: Driver
) -> None:
    mine = driver("submit", user="alice", tenant="acme", name="audited-job", gpus=1)["job"]
    driver("cancel", user="alice", job=mine)
    theirs = driver("submit", user="bob", tenant="globex", name="globex-secret", gpus=1)["job"]

    alice = login(browser, server, "alice")
    alice.click("nav a[href='/audit/']")
    alice.wait_for_selector("#audit-table")
    assert "globex-secret" not in alice.content()
    alice.fill("#id_action", "job.cancel")
    alice.click("#audit-filters button[type=submit]")
    alice.wait_for_url("**/audit/?*action=job.cancel*")
    rows = alice.locator("#audit-table tbody tr")
    texts = [rows.nth(i).inner_text() for i in range(rows.count())]
    assert any("audited-job" in t and "queued → cancelled" in t for t in texts)
    assert all("job.cancel" in t and "acme" in t for t in texts)
    screenshot(alice, "audit")

    href = alice.get_attribute("#audit-csv", "href")
    assert href == "/audit/export.csv?action=job.cancel"
    body = alice.request.get(href)  # streamed by daphne (ASGI)
    assert body.ok and body.headers["content-type"] == "text/csv"
    lines = list(csv.DictReader(io.StringIO(body.text())))
    assert lines and {line["action"] for line in lines} == {"job.cancel"}
    assert any(line["object"] == f"job {mine} (audited-job)" for line in lines)
    assert {line["tenant"] for line in lines} == {"acme"}
    alice.context.close()
    driver("cancel", user="bob", job=theirs)  # the portal is shared: leave no job to place

"""The Usage pages draw a tenant's held GPU-hours with Plotly and link the same figures as CSV."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest

from tests.browser.conftest import Driver, Server, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def chart_traces(page: Any, chart: str) -> list[dict[str, Any]]:
    """The traces Plotly drew in ``#chart`` (name, x and y), read from the live DOM."""
    return list(
        page.evaluate(
            f"(document.getElementById('{chart}').data || [])"
            ".map(t => ({name: t.name || null, x: t.x || t.labels, y: t.y || t.values}))"
        )
    )


def test_usage_page_draws_the_tenants_gpu_hours(
    browser: Any, server: Server, driver: Driver
) -> None:
    job = driver("submit", user="alice", tenant="acme", name="usage-chart", gpus=2)["job"]
    driver("transition", job=job, state="running", parallelism=2)
    alice = login(browser, server, "alice")
    alice.goto("/usage/")
    alice.wait_for_function("() => window.__usageDrawn === true")
    by_day = chart_traces(alice, "usage-by-day")
    assert [t["name"] for t in by_day] == ["alice"]
    assert sum(by_day[0]["y"]) > 0
    by_user = chart_traces(alice, "usage-by-user")
    assert by_user[0]["y"] == ["alice"]
    share = alice.locator("#usage-share")
    assert share.locator(".main-svg").count() or "No GPUs" in share.inner_text()
    screenshot(alice, "usage")

    href = alice.get_attribute("#usage-csv", "href")
    assert href and "format=csv" in href and "tenant=acme" in href
    body = alice.request.get(href)
    assert body.ok and body.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(body.text())))
    # The session's portal is shared: earlier tests' acme jobs are in the range too.
    mine = [r for r in rows if r["job_name"] == "usage-chart"]
    assert len(mine) == 1 and float(mine[0]["gpu_seconds"]) > 0
    assert {r["tenant"] for r in rows} == {"acme"}

    # Another tenant's member sees none of it; the admin page is for admins only.
    bob = login(browser, server, "bob")
    bob.goto("/usage/")
    bob.wait_for_function("() => window.__usageDrawn === true")
    assert all(t["name"] != "alice" for t in chart_traces(bob, "usage-by-day"))
    assert bob.goto("/usage/all/").status == 404
    driver("cancel", user="alice", job=job)

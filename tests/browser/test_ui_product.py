"""The UI as a product (issue 19): the portal's own error pages, readable charts, small things."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.browser.conftest import Driver, Server, assert_all_titled, chart_axes, login, screenshot

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


def ensure_topology(root: Any) -> None:
    """A small fabric for the cluster view (the session's portal may already have one)."""
    root.goto("/cluster/")
    if root.locator("#cluster-empty:visible").count() == 0:
        return
    root.goto("/cluster/topology/")
    for field, value in (
        ("leaves", 2),
        ("spines", 2),
        ("servers_per_leaf", 2),
        ("gpus_per_server", 2),
    ):
        root.fill(f"#id_{field}", str(value))
    root.click("#generate-form button[type=submit]")
    root.wait_for_load_state()


def test_every_chart_has_titled_axes_and_the_cdf_starts_at_zero(
    browser: Any, server: Server, driver: Driver
) -> None:
    job = driver("submit", user="alice", tenant="acme", name="axes", gpus=2)["job"]
    driver("transition", job=job, state="running", parallelism=2, reason="placed")
    driver("report", kind="profile", job=job, curve=[[1, 900.0], [2, 1650.0], [4, 2700.0]])
    for i, rate in enumerate((1600.0, 1650.0, 1630.0)):
        driver(
            "report",
            kind="progress",
            job=job,
            step=10 * (i + 1),
            samples_per_s=rate,
            world=2,
            loss=2.0 - i / 10,
        )
    driver("parallelism", job=job, parallelism=4)
    driver("report", kind="progress", job=job, step=40, samples_per_s=2650.0, world=4, loss=1.6)

    alice = login(browser, server, "alice")
    alice.goto(f"/jobs/{job}/")
    for chart in ("chart-parallelism", "chart-throughput", "chart-profile", "chart-loss"):
        alice.wait_for_function(f"() => document.querySelector('#{chart} .main-svg')")
    charts = chart_axes(alice)
    assert_all_titled(
        charts, {"chart-parallelism", "chart-throughput", "chart-profile", "chart-loss"}
    )
    assert charts["chart-parallelism"]["yaxis"] == "GPUs"
    assert charts["chart-throughput"]["yaxis"] == "Throughput (samples/s)"
    # counts get whole-number ticks; both time charts share one span; scale-ups are marked
    layout = "(id) => document.getElementById(id).layout"
    assert alice.evaluate(f"({layout})('chart-parallelism').yaxis.tickformat") == "d"
    spans = alice.evaluate(
        f"['chart-parallelism', 'chart-throughput'].map(id => ({layout})(id).xaxis.range.join())"
    )
    assert spans[0] == spans[1]
    assert len(alice.evaluate(f"({layout})('chart-throughput').shapes")) >= 1
    alice.context.close()

    driver("transition", job=job, state="completed", reason="finished")
    root = login(browser, server, "root")
    ensure_topology(root)
    root.goto("/cluster/?window=all")
    root.wait_for_function("() => document.querySelector('#jct-cdf .main-svg')")
    root.wait_for_function("() => document.querySelector('#timeline .main-svg')")
    charts = chart_axes(root)
    assert_all_titled(charts, {"jct-cdf", "timeline", "heatmap"})
    assert charts["jct-cdf"]["xaxis"].startswith("JCT (")
    cdf = root.evaluate("document.getElementById('jct-cdf').data[0]")
    assert cdf["y"][0] == 0 and cdf["x"][0] == cdf["x"][1], "the CDF must start at (x0, 0)"
    assert cdf["y"][-1] == 1 and "markers" in cdf["mode"]
    if len(cdf["y"]) == 2:  # the session's only completed job so far
        notes = root.evaluate("document.getElementById('jct-cdf').layout.annotations")
        assert [n["text"] for n in notes] == ["One job so far"]

    root.goto("/usage/all/")
    root.wait_for_function("() => window.__usageDrawn")
    assert_all_titled(chart_axes(root), {"usage-by-day", "usage-by-user"})
    root.context.close()


TENANT_PAGES = ["/", "/jobs/new/", "/code/", "/usage/", "/account/token/", "/api/docs/"]
ADMIN_PAGES = ["/cluster/", "/cluster/topology/", "/whatif/", "/usage/all/", "/admin/"]


def watch_problems(page: Any) -> list[str]:
    """Console errors, failed requests and error answers of sub-requests, as they happen."""
    problems: list[str] = []
    page.on(
        "console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None
    )
    # A request cut off by the next navigation (a late favicon) is not a failure.
    page.on(
        "requestfailed",
        lambda r: (
            None if "ERR_ABORTED" in (r.failure or "") else problems.append(f"{r.url} {r.failure}")
        ),
    )

    def on_response(response: Any) -> None:
        if response.status >= 400 and not response.request.is_navigation_request():
            problems.append(f"{response.status}: {response.url}")

    page.on("response", on_response)
    return problems


def test_no_page_has_console_errors_or_failed_requests(
    browser: Any, server: Server, driver: Driver
) -> None:
    job = driver("submit", user="alice", tenant="acme", name="quiet", gpus=1)["job"]
    for user, paths in (("alice", [*TENANT_PAGES, f"/jobs/{job}/"]), ("root", ADMIN_PAGES)):
        page = login(browser, server, user)
        problems = watch_problems(page)
        for path in paths:
            page.goto(path)
            page.wait_for_load_state("networkidle")
            icon = page.evaluate(
                "() => fetch(document.querySelector('link[rel=icon]')?.href || '/favicon.ico')"
                ".then(r => r.ok && r.headers.get('content-type'))"
            )
            assert icon and icon.startswith("image/"), (path, icon)
        assert not problems, problems
        page.context.close()
    driver("cancel", user="alice", job=job)


# The elements that stick out of a 390 px screen (not those inside a scrolling wrapper).
WIDE = """() => [...document.querySelectorAll('body *')]
  .filter(e => e.getBoundingClientRect().right > 391 && !e.closest('.table-wrap'))
  .slice(-6).map(e => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))"""


def test_no_page_is_wider_than_a_phone(browser: Any, server: Server, driver: Driver) -> None:
    long_name = "a-rather-long-job-name-on-a-phone"
    job = driver("submit", user="alice", tenant="acme", name=long_name, gpus=2)["job"]
    elastic = driver(
        "submit", user="alice", tenant="acme", name="stretchy", gpus=2, gpu_range=[1, 4]
    )
    pages = {
        "alice": [*TENANT_PAGES[:-1], f"/jobs/{job}/", "/no-such-page/"],
        "root": ADMIN_PAGES[:-1],
    }
    for user, paths in pages.items():
        page = login(browser, server, user, width=390)
        for path in paths:
            page.goto(path)
            page.wait_for_load_state("networkidle")
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{path} is {width} px wide at 390 px: {page.evaluate(WIDE)}"
        if user == "alice":
            # sizes say what they count: "2 GPUs (range 1-4)", a rigid job only "2 GPUs"
            page.goto("/")
            assert "2 GPUs" in page.inner_text(f"#job-{job}")
            assert "range" not in page.inner_text(f"#job-{job}")
            assert "2 GPUs (range 1\u20134)" in page.inner_text(f"#job-{elastic['job']}")
            page.goto(f"/jobs/{job}/")
            screenshot(page, "job-page-phone")
        page.context.close()
    for doomed in (job, elastic["job"]):
        driver("cancel", user="alice", job=doomed)


def test_the_token_page_copies_the_new_secret(browser: Any, server: Server) -> None:
    alice = login(browser, server, "alice")
    alice.context.grant_permissions(["clipboard-read", "clipboard-write"])
    alice.goto("/account/token/")
    alice.fill("#id_name", "laptop")
    alice.click("#token-form button[type=submit]")
    secret = alice.inner_text("#token")
    alice.click("#copy-token")
    alice.wait_for_function(
        "() => document.getElementById('copy-status').textContent === 'Copied.'"
    )
    assert alice.evaluate("navigator.clipboard.readText()") == secret
    screenshot(alice, "token-page")
    alice.context.close()


def test_the_chart_helper_in_the_page(browser: Any, server: Server) -> None:
    """PortalCharts' pure parts, as the pages load them (every page carries charts.js)."""
    alice = login(browser, server, "alice")
    got = alice.evaluate(
        """() => { const C = window.PortalCharts; return {
          cdf: C.cdf([60, 120, 180], 60),
          units: [59, 120, 7199, 7200].map(s => C.durationUnit(s).unit),
          steps: [0, 3, 4, 37, 1000].map(C.integerStep),
          long: C.maxOf(Array.from({ length: 300000 }, (_, i) => i), 0),
          none: C.maxOf([], 1),
          title: C.axis('GPUs').title,
        }; }"""
    )
    assert got["cdf"] == {"x": [1, 1, 2, 3], "y": [0, 1 / 3, 2 / 3, 1]}
    assert got["units"] == ["s", "min", "min", "h"]
    assert got["steps"] == [1, 1, 1, 10, 200]
    assert got["long"] == 299999 and got["none"] == 1  # no argument-list overflow
    assert got["title"] == {"text": "GPUs"}  # the object form plotly.js 4 reads
    alice.context.close()

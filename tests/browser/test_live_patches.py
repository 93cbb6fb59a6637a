"""The job page and the cluster view patch themselves from events; only a gap reloads them.

Each test watches the page's requests for its snapshot (``/live/jobs/<id>.json``,
``/live/cluster.json``): after the one load that follows the socket's first
subscription, changes driven through the real services must show on the page
with no snapshot request and no page reload; then a lost batch (the group's seq
counter moved on without the page hearing of it) must reload the snapshot once.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import redis
from django.conf import settings

from tests.browser.conftest import Driver, Server, login, wait_live
from utilities.realtime import CLUSTER_GROUP, SEQ_KEY, job_group

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def watch_snapshots(page: Any, path: str) -> list[str]:
    """The URLs of the snapshot requests the page makes from now on."""
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url) if path in r.url else None)
    return seen


def text_is(page: Any, selector: str, text: str) -> None:
    page.wait_for_function(
        f"() => (document.querySelector({selector!r}) || {{}}).textContent === {text!r}"
    )


def lose_a_batch(group: str) -> None:
    """Move the group's counter on, as a batch this page never got would have."""
    redis.Redis.from_url(settings.REDIS_URL).incr(SEQ_KEY.format(group=group))


def test_job_page_patches_state_history_charts_and_reloads_only_on_a_gap(
    browser: Any, server: Server, driver: Driver
) -> None:
    job = driver("submit", user="alice", tenant="acme", name="patched", gpus=2, gpu_range=[1, 2])[
        "job"
    ]
    page = login(browser, server, "alice")
    page.goto(f"/jobs/{job}/")
    wait_live(page)
    page.wait_for_function("() => window.__portalLive.resyncs >= 1")
    snapshots = watch_snapshots(page, f"/live/jobs/{job}.json")
    page.evaluate("window.__notReloaded = true")
    chart_points = "document.getElementById('chart-parallelism').data[0].y"
    history_rows = "() => document.querySelectorAll('#events-body tr').length"
    rows_before = page.evaluate(history_rows)

    # placed: the state, the Started field, a history row and a step of the chart
    driver("transition", job=job, state="running", parallelism=1, reason="placed by the test")
    text_is(page, "#job-state", "running")
    page.wait_for_function("() => document.getElementById('job-started').textContent !== '—'")
    page.wait_for_function(f"() => {history_rows}() === {rows_before + 1}")
    assert "placed by the test" in page.inner_text("#events-body")
    page.wait_for_function(f"() => {chart_points}.includes(1)")

    # scaled out: the counter and the chart's step follow
    driver("parallelism", job=job, parallelism=2)
    text_is(page, "#job-parallelism", "2")
    page.wait_for_function(f"() => {chart_points}.includes(2)")
    assert "scaled by the test" in page.inner_text("#events-body")

    # progress: the step and a point of the throughput chart, from the sample itself
    driver("report", kind="progress", job=job, step=30, samples_per_s=750.0, world=2)
    text_is(page, "#job-step", "step 30")
    page.wait_for_function(
        "() => { const c = document.getElementById('chart-throughput');"
        " return c.data && c.data[0].y.includes(750); }"
    )
    assert snapshots == [], "the job page reloaded its snapshot for a change"
    assert page.evaluate("window.__portalLive.gaps") == 0

    # a lost batch: the next one shows the gap, and the page reloads its snapshot once
    lose_a_batch(job_group(job))
    driver("parallelism", job=job, parallelism=1)
    page.wait_for_function("() => window.__portalLive.gaps === 1")
    page.wait_for_function("() => window.__portalLive.resyncs === 2")
    text_is(page, "#job-parallelism", "1")
    assert len(snapshots) == 1
    assert page.evaluate("window.__notReloaded") is True
    driver("transition", job=job, state="cancelled", parallelism=0)
    text_is(page, "#job-state", "cancelled")
    page.context.close()


def test_cluster_view_patches_placements_and_reloads_only_on_a_gap(
    browser: Any, server: Server, driver: Driver
) -> None:
    fabric = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}
    driver("cancel_active")  # the portal is shared: earlier tests' jobs would hold GPUs
    driver("call", path="inventory.services:do_load_topology", kwargs={"data": fabric})
    driver("heartbeats")
    root = login(browser, server, "root")
    root.goto("/cluster/")
    wait_live(root)
    root.wait_for_function("() => window.__portalLive.resyncs >= 1")
    snapshots = watch_snapshots(root, "/live/cluster.json")
    root.evaluate("window.__notReloaded = true")
    allocated_before = int(root.inner_text("#tile-allocated").split("/")[0])
    down_before = int(root.inner_text("#tile-down"))
    points_before = root.evaluate("document.getElementById('timeline').data[0].x.length")

    job = driver("submit", user="alice", tenant="acme", name="wide-live", gpus=8)["job"]
    try:
        # a job across both leaves, placed by the real tick: its GPUs, links and legend
        driver("tick")
        legend = f'#job-legend li[data-job="{job}"]'
        root.wait_for_selector(legend)
        assert "wide-live · acme · 8 GPUs" in root.inner_text(legend)
        text_is(root, "#tile-allocated", f"{allocated_before + 8} / 8")
        traces = root.evaluate(
            "Object.fromEntries(document.getElementById('topology').data"
            ".map(t => [t.name, t.x.length]))"
        )
        assert traces[f"job {job}"] == 8 and traces[f"job {job} links"] // 3 == 8
        # the profiled curve and a measured rate: the heatmap shows its per-GPU efficiency
        driver("report", kind="profile", job=job, curve=[[1, 100.0], [4, 340.0], [8, 560.0]])
        driver("report", kind="progress", job=job, step=20, samples_per_s=480.0, world=8)
        root.wait_for_function(
            "() => document.getElementById('heatmap').data[0].z[0][0] === 0.6"  # 480 / (8 x 100)
        )
        root.wait_for_function(
            f"() => document.getElementById('timeline').data[0].x.length > {points_before}"
        )

        # a server goes down: the tile and the drawing follow
        driver("server_state", node="node-3", state="draining")
        text_is(root, "#tile-down", str(down_before + 2))
        assert snapshots == [], "the cluster view reloaded its snapshot for a change"

        # a lost batch, then the job ends: the gap reloads the snapshot once
        lose_a_batch(CLUSTER_GROUP)
        driver("cancel", job=job, user="alice")
        root.wait_for_function("() => window.__portalLive.gaps === 1")
        root.wait_for_function(f"() => !document.querySelector({legend!r})")
        root.wait_for_function("() => window.__portalLive.resyncs === 2")
        assert len(snapshots) == 1
        text_is(root, "#tile-allocated", f"{allocated_before} / 8")
        assert root.evaluate("window.__notReloaded") is True
    finally:  # the portal is shared with the other browser tests: leave it as it was
        with contextlib.suppress(RuntimeError):  # already cancelled
            driver("cancel", job=job, user="alice")
        driver("server_state", node="node-3", state="up")
        root.context.close()

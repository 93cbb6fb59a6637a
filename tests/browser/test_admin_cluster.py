"""An admin builds the fabric in the topology editor and watches jobs on the cluster view."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import (
    Driver,
    Server,
    assert_all_titled,
    chart_axes,
    login,
    screenshot,
    wait_live,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def generate(page: Any, leaves: int, spines: int, servers: int, gpus: int) -> None:
    page.fill("#id_leaves", str(leaves))
    page.fill("#id_spines", str(spines))
    page.fill("#id_servers_per_leaf", str(servers))
    page.fill("#id_gpus_per_server", str(gpus))
    page.click("#generate-form button[type=submit]")
    page.wait_for_load_state()


def test_admin_edits_topology_and_sees_jobs_coloured(
    browser: Any, server: Server, driver: Driver
) -> None:
    root = login(browser, server, "root")
    root.goto("/cluster/")
    assert "No topology yet" in root.inner_text("#cluster-empty")

    root.goto("/cluster/topology/")
    generate(root, leaves=4, spines=3, servers=2, gpus=2)  # 4 uplinks do not spread over 3
    error = root.locator('.field-error[data-for="spines"]')
    assert "spines" in error.inner_text()
    assert root.locator(".field.has-error #id_spines").count() == 1
    screenshot(root, "topology-editor-error")

    generate(root, leaves=4, spines=4, servers=2, gpus=2)
    assert root.locator("#servers-table tbody tr").count() == 8
    with root.expect_download() as download_info:
        root.click("#export")
    exported = json.loads(Path(download_info.value.path()).read_text())
    assert (exported["leaves"], exported["spines"]) == (4, 4)
    assert (exported["servers_per_leaf"], exported["gpus_per_server"]) == (2, 2)
    assert len(exported["servers"]) == 8

    # two jobs placed by the real control-plane tick; one server marked down
    wide = driver("submit", user="alice", tenant="acme", name="wide", gpus=8)["job"]
    narrow = driver("submit", user="bob", tenant="globex", name="narrow", gpus=2)["job"]
    driver("heartbeats")
    driver("tick")
    driver("server_state", node="node-7", state="down")
    driver("report", kind="profile", job=wide, curve=[[1, 100.0], [4, 340.0], [8, 560.0]])
    driver("report", kind="progress", job=wide, step=50, samples_per_s=520.0, world=8)
    root.goto("/cluster/topology/")
    screenshot(root, "topology-editor")

    root.goto("/cluster/")
    wait_live(root)
    root.evaluate("window.__notReloaded = true")
    root.wait_for_function(f"() => document.querySelector('#job-legend li[data-job=\"{wide}\"]')")
    traces = root.evaluate(
        "Object.fromEntries(document.getElementById('topology').data"
        ".map(t => [t.name, {n: t.x.length, colour: (t.marker || t.line).color}]))"
    )
    colour = root.evaluate(f"window.__clusterColour({wide})")
    assert traces[f"job {wide}"] == {"n": 8, "colour": colour}
    assert traces[f"job {wide} links"]["n"] // 3 == 8  # m*n cables reserved for it alone
    assert traces[f"job {narrow}"]["n"] == 2
    assert traces[f"job {narrow}"]["colour"] != colour
    assert traces["down GPUs"]["n"] == 2
    assert root.inner_text("#tile-allocated") == "10 / 16"
    # a legible fabric: every switch and server labelled, servers linked to their leaf,
    # and a job inside one leaf says why it holds no links
    labels = root.evaluate(
        "Object.fromEntries(document.getElementById('topology').data"
        ".filter(t => t.text).map(t => [t.name, t.text]))"
    )
    assert labels["spines"] == ["spine 0", "spine 1", "spine 2", "spine 3"]
    assert labels["leaves"] == ["leaf 0", "leaf 1", "leaf 2", "leaf 3"]
    assert "node-7" in labels["servers"] and len(labels["servers"]) == 8
    assert traces["server-leaf links"]["n"] == 8 * 3
    assert "0 links" in root.inner_text(f'#job-legend li[data-job="{narrow}"]')
    assert "inside one leaf" in root.inner_text(f'#job-legend li[data-job="{narrow}"]')
    assert "inside one leaf" not in root.inner_text(f'#job-legend li[data-job="{wide}"]')
    colorbar = root.evaluate("document.getElementById('heatmap').data[0].colorbar.ticktext")
    assert colorbar[:2] == ["down", "idle"]
    heat = root.evaluate("document.getElementById('heatmap').data[0].z")
    assert heat[0][0] == 0.65  # 520/s measured over 8 x 100/s profiled on one GPU
    assert heat[3][3] == -1  # node-7 is down
    screenshot(root, "cluster-view")

    # a job leaves: the view follows without a reload
    driver("cancel", job=narrow, user="bob")
    root.wait_for_function(
        f"() => !document.querySelector('#job-legend li[data-job=\"{narrow}\"]')"
    )
    assert root.evaluate("window.__notReloaded") is True
    driver("cancel", job=wide, user="alice")
    root.context.close()


def test_whatif_shows_progress_then_the_report(
    browser: Any, server: Server, driver: Driver
) -> None:
    root = login(browser, server, "root")
    root.goto("/whatif/")
    root.check('input[name="source"][value="60_job"]')
    root.check('input[name="policies"][value="fifo"]')
    root.check('input[name="policies"][value="tiresias"]')
    root.check('input[name="policies"][value="srtf"]')
    root.fill("#id_total_gpus", "8")
    root.fill("#id_gpus_per_server", "4")
    root.check('input[name="placements"][value="vclos"]')
    root.check('input[name="placements"][value="ecmp"]')
    root.fill("#id_leaves", "2")
    # every choice is a box beside its words, not a full-width input above them
    boxes = root.locator("#whatif-form input[type=checkbox], #whatif-form input[type=radio]")
    widths = boxes.evaluate_all("nodes => nodes.map(n => n.getBoundingClientRect().width)")
    assert widths and max(widths) < 40, widths
    screenshot(root, "whatif-form")
    root.click("#whatif-form button[type=submit]")
    root.wait_for_url(re.compile(r"/whatif/[0-9a-f]{32}/$"))
    assert "Waiting for a worker" in root.inner_text("#whatif-step")
    run_id = root.url.rstrip("/").rsplit("/", 1)[1]
    # the driver stands in for the Celery worker: the same task function, run to completion
    driver("call", path="portal.whatif:run_whatif", kwargs={"run_id": run_id})
    root.wait_for_selector("#whatif-table tbody tr[data-policy=tiresias]")
    root.wait_for_function("() => document.querySelector('#whatif-cdf .main-svg')")
    charts = chart_axes(root)
    assert_all_titled(charts, {"whatif-cdf", "whatif-queue", "whatif-eff"})
    assert charts["whatif-queue"]["xaxis"] == "Simulated time (h)"
    policies = root.locator("#whatif-table tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.policy)"
    )
    assert policies == [
        "fifo",
        "fifo / vclos",
        "fifo / ecmp",
        "srtf",
        "srtf / vclos",
        "srtf / ecmp",
        "tiresias",
        "tiresias / vclos",
        "tiresias / ecmp",
    ]
    screenshot(root, "whatif-report")
    root.context.close()

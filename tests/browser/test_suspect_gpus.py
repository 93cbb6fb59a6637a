"""A straggler's GPU, shown everywhere: the job's history, the cluster view, the topology page.

The control plane gets a real straggler report (through ``handle_report``, as
an agent's would arrive), removes the worker and marks its GPU suspect; the
admin's open cluster view draws the mark (its list item titled with until and
why), the tenant's job page lists the event, and the admin clears the mark on
the topology page, which the open cluster view follows without a reload.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.browser.conftest import Driver, Server, login, screenshot, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

DEMO = {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}


def held_by(page: Any, job: int) -> list[int]:
    """The GPUs ``job`` holds, as the cluster view's data says."""
    data = page.evaluate("fetch('/live/cluster.json').then(r => r.json())")
    # each row: index, leaf, slot, local, holding job, GPU type (portal.cluster_data)
    return sorted(row[0] for row in data["gpus"] if row[4] == job)


def test_a_straggler_is_removed_marked_shown_and_cleared(
    browser: Any, server: Server, driver: Driver
) -> None:
    driver("call", path="inventory.services:do_load_topology", kwargs={"data": DEMO})
    driver("heartbeats")
    job = driver("submit", user="alice", tenant="acme", name="slowpoke", gpus=2, gpu_range=[1, 2])
    job = job["job"]
    root = login(browser, server, "root")
    try:
        driver("tick")
        gpus = held_by(root, job)
        assert len(gpus) == 2, gpus
        slow = gpus[1]
        root.goto("/cluster/")
        wait_live(root)
        root.evaluate("window.__notReloaded = true")
        report = {
            "type": "straggler",
            "node": "node-0",
            "job": f"job-{job}",
            "event_id": f"{int(time.time() * 1000)}-0",
            "worker_id": f"w{slow}",
            "ratio": 1.5,
        }
        outcome = driver("call", path="control.reports:handle_report",
                         kwargs={"payload": report})  # fmt: skip
        assert outcome["repr"] == "'straggler removed'"

        # The open cluster view draws the mark: a titled list item, hover text, its own trace.
        item = root.locator(f'#suspect-gpus li[data-gpu="{slow}"]')
        item.wait_for()
        title = item.get_attribute("title") or ""
        assert title.startswith("suspect until ") and " UTC: straggler: worker " in title
        assert f"w{slow} of job {job} was 1.50x slower" in title
        assert f"job {job}" in item.inner_text()
        hover = root.evaluate(
            "[].concat(...document.getElementById('topology').data.map(t => t.text || []))"
        )
        assert any(str(t).startswith(f"GPU {slow} ") and "suspect until" in str(t) for t in hover)
        heat = root.evaluate("[].concat(...document.getElementById('heatmap').data[0].text)")
        assert any(str(t).startswith(f"GPU {slow} ") and "suspect until" in str(t) for t in heat)
        screenshot(root, "cluster-suspect-gpu")

        # The tenant sees it in the job's history.
        alice = login(browser, server, "alice")
        alice.goto(f"/jobs/{job}/")
        history = alice.inner_text("#events-table")
        assert f"straggler detected: worker w{slow} on GPU {slow} is 1.50x slower" in history
        assert "removing it: scale-in 2→1 GPUs" in history and "suspect until" in history
        alice.context.close()

        # The admin clears the mark on the topology page; the open view follows live.
        editor = root.context.new_page()
        editor.goto("/cluster/topology/")
        row = editor.locator(f"#suspect-{slow}")
        assert "1.50x slower" in row.inner_text()
        assert "suspect until" in (row.locator("td").first.get_attribute("title") or "")
        row.locator("button", has_text="Clear").click()
        editor.wait_for_load_state()
        assert f"GPU {slow} is no longer suspect" in editor.inner_text("body")
        assert editor.locator("#suspect-empty").count() == 1
        root.wait_for_function(
            f"() => !document.querySelector('#suspect-gpus li[data-gpu=\"{slow}\"]')"
        )
        assert root.evaluate("window.__notReloaded") is True
    finally:
        driver("cancel", job=job, user="alice")
        root.context.close()

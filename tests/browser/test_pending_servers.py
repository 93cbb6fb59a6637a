"""An admin watches servers register themselves and forgets one; the cluster view shows
utilization per GPU type on the two-type demo cluster, and both pages follow live."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from portal.demo import two_type_fabric
from tests.browser.conftest import Driver, Server, chart_axes, login, screenshot, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

A100, H100 = "a100-40g", "h100-80g"


def report_hardware(driver: Driver, node: str, temperature_c: int | None = None) -> None:
    """``node``'s agent reports two H100s (what its heartbeat carries), through the service;
    with their NVML health when ``temperature_c`` is given."""
    health = {"temperature_c": temperature_c, "utilization_pct": 7, "ecc_uncorrected": 0}
    gpus = [
        {"index": i, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81920, "uuid": f"GPU-{i}"}
        | ({"health": health} if temperature_c is not None else {})
        for i in range(2)
    ]
    hardware = {"source": "nvml", "gpus": gpus, "cpu_cores": 64, "memory_mib": 524288}
    if temperature_c is not None:
        hardware["health"] = "nvml"
    driver(
        "call",
        path="inventory.registration:do_heartbeat",
        kwargs={"node": node, "info": {"slots": 2, "hardware": hardware}},
    )


def test_a_pending_server_appears_live_and_forget_removes_it(
    browser: Any, server: Server, driver: Driver
) -> None:
    driver("cancel_active")  # the portal is shared: earlier tests' jobs would hold GPUs
    driver("call", path="inventory.services:do_load_topology", kwargs={"data": two_type_fabric()})
    driver("heartbeats")
    root = login(browser, server, "root")
    root.goto("/cluster/topology/")
    wait_live(root)
    root.evaluate("window.__notReloaded = true")
    # Types by colour and pools by label, with a legend.
    assert root.locator("#leaf-map .server-slot").count() == 4
    slot = root.locator('#leaf-map .server-slot[data-node="h100-1"]')
    assert "pool interactive" in slot.inner_text() and slot.get_attribute("data-type") == H100
    legend = root.inner_text("#type-legend")
    assert f"{A100} (2 servers)" in legend and f"{H100} (2 servers)" in legend
    assert "pool train: 2 servers" in root.inner_text("#pool-legend")
    colours = root.evaluate(
        "[...document.querySelectorAll('#type-legend .swatch')].map(s => s.style.background)"
    )
    assert len(set(colours)) == 2

    try:
        report_hardware(driver, "rack-9")
        row = root.wait_for_selector("#pending-rack-9")
        assert "NVIDIA H100 80GB HBM3" in row.inner_text()
        assert root.evaluate("window.__notReloaded") is True  # it came over the socket
        # What the admin types survives the next live refresh (another server reports).
        root.fill('#pending-rack-9 input[name="leaf"]', "1")
        refreshes = root.evaluate("window.__topologyRefreshes")
        report_hardware(driver, "rack-10")
        root.wait_for_selector("#pending-rack-10")
        root.wait_for_function(f"() => window.__topologyRefreshes > {refreshes}")
        assert root.input_value('#pending-rack-9 input[name="leaf"]') == "1"
        # So does a server's open Type / pool form; saved, the leaf map shows the new pool.
        root.click("#server-h100-1 details.retype summary")
        root.fill('#server-h100-1 input[name="pool"]', "bigmem")
        refreshes = root.evaluate("window.__topologyRefreshes")
        report_hardware(driver, "rack-11")
        root.wait_for_function(f"() => window.__topologyRefreshes > {refreshes}")
        assert root.evaluate("document.querySelector('#server-h100-1 details.retype').open")
        assert root.input_value('#server-h100-1 input[name="pool"]') == "bigmem"
        root.click("#server-h100-1 .retype-form button")
        root.wait_for_load_state()
        assert "pool bigmem" in root.inner_text('#leaf-map .server-slot[data-node="h100-1"]')
        wait_live(root)
        screenshot(root, "topology-pending-server")

        root.click("#pending-rack-9 .forget-form button")
        root.wait_for_load_state()
        assert root.locator("#pending-rack-9").count() == 0
        assert "Pending server forgotten" in root.inner_text(".messages")

        # Its agent still runs: the next report brings it back, saying it was forgotten.
        wait_live(root)
        report_hardware(driver, "rack-9")
        note = root.wait_for_selector("#pending-rack-9 .pending-note")
        assert "forgotten by root" in note.inner_text()
    finally:  # the portal is shared: forget what this test made pending, through the page
        forget = root.locator("#pending-section .forget-form button")
        for _ in range(10):  # rack-9, -10, -11; bounded should a forget fail
            if not forget.count():
                break
            forget.first.click()
            root.wait_for_load_state()
        root.context.close()


def test_the_cluster_view_shows_utilization_per_type_live(
    browser: Any, server: Server, driver: Driver
) -> None:
    driver("cancel_active")
    driver("call", path="inventory.services:do_load_topology", kwargs={"data": two_type_fabric()})
    driver("heartbeats")
    root = login(browser, server, "root")
    root.goto("/cluster/")
    wait_live(root)
    root.evaluate("window.__notReloaded = true")
    held = "(t) => document.querySelector(`#types-body tr[data-type='${t}'] td:nth-child(3)`)"
    assert root.evaluate(f"({held})('{A100}').textContent") == "0"
    assert root.evaluate(f"({held})('{H100}').textContent") == "0"
    traces = root.evaluate("document.getElementById('types-chart').data.map(t => t.name)")
    assert traces == [A100, H100]
    assert chart_axes(root)["types-chart"]["yaxis"] == "Share of the type's GPUs in use"
    pools = root.inner_text("#pools-body")
    assert "train" in pools and "interactive" in pools and f"{A100}, {H100}" in pools

    job = driver("submit", user="alice", tenant="acme", name="typed", gpus=2)["job"]
    try:
        driver("tick")
        # The job's patch moves the table and the chart's last point, without a reload.
        root.wait_for_function(
            f"() => ['{A100}', '{H100}'].some(t => ({held})(t).textContent === '2')"
        )
        last = root.evaluate(
            "document.getElementById('types-chart').data.map(t => t.y[t.y.length - 1])"
        )
        assert sorted(last) == [0.0, 0.5], last
        # A server's health word changes: its row follows (the table is read again).
        assert root.get_attribute("#health-h100-0", "data-health") == "not reported"
        report_hardware(driver, "h100-0", temperature_c=64)
        root.wait_for_selector('#health-h100-0[data-health="ok"]')
        assert "64 °C, 7%" in root.inner_text("#health-h100-0")
        assert root.evaluate("window.__notReloaded") is True
        screenshot(root, "cluster-types")
    finally:
        with contextlib.suppress(RuntimeError):
            driver("cancel", job=job, user="alice")
        root.context.close()

"""The dashboard patches queue positions from events and reloads its snapshot only on a gap."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.conf import settings

from tests.browser.conftest import Driver, Server, login, wait_live
from utilities.realtime import SEQ_KEY, tenant_group

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

SNAPSHOT = "/live/tenants/"


def position(page: Any, job: int) -> str:
    return str(page.inner_text(f"#job-{job} [data-field=queue_position]"))


def wait_position(page: Any, job: int, text: str) -> None:
    page.wait_for_function(
        f"() => (document.querySelector('#job-{job} [data-field=queue_position]') || {{}})"
        f".textContent === {text!r}"
    )


def test_queue_positions_move_without_a_snapshot_reload_and_a_gap_reloads(
    browser: Any, server: Server, driver: Driver
) -> None:
    page = login(browser, server, "alice")
    wait_live(page)
    page.wait_for_function("() => window.__portalLive.resyncs >= 1")
    snapshots: list[str] = []
    page.on("request", lambda r: snapshots.append(r.url) if SNAPSHOT in r.url else None)
    page.evaluate("window.__notReloaded = true")
    tenant = int(page.get_attribute("#live-dashboard", "data-tenant") or 0)

    # New jobs appear from their events (the event carries the row), no reload.
    jobs = [
        driver("submit", user="alice", tenant="acme", name=f"queued-{n}", gpus=2)["job"]
        for n in range(3)
    ]
    for job in jobs:
        page.locator(f"#job-{job}").wait_for()
    page.wait_for_function("() => document.getElementById('count-queued').textContent === '3'")

    # The forecast gives positions; the first in line is placed: the others move up.
    driver(
        "call",
        path="inventory.services:do_load_topology",
        kwargs={"data": {"leaves": 1, "spines": 1, "servers_per_leaf": 1, "gpus_per_server": 2}},
    )
    driver("call", path="control.forecast:refresh_forecast")
    for job in jobs:
        page.wait_for_function(
            f"() => document.querySelector('#job-{job} [data-field=queue_position]')"
            ".textContent.startsWith('#')"
        )
    order = sorted(jobs, key=lambda job: int(position(page, job)[1:]))
    # Positions are cluster-wide: jobs other browser tests left queued may stand ahead.
    first = int(position(page, order[0])[1:])
    assert [position(page, job) for job in order] == [f"#{first + i}" for i in range(3)]
    driver("transition", job=order[0], state="running", parallelism=2)
    wait_position(page, order[1], f"#{first}")
    wait_position(page, order[2], f"#{first + 1}")
    assert position(page, order[0]) == "—"
    page.wait_for_function("() => document.getElementById('count-running').textContent === '1'")
    page.wait_for_function(
        "() => document.getElementById('quota-use').textContent.startsWith('2 /')"
    )
    assert snapshots == [], "the page reloaded its snapshot for a queue change"
    assert page.evaluate("window.__portalLive.gaps") == 0

    # A lost batch: the group's counter moves on without this page hearing of it.
    redis.Redis.from_url(settings.REDIS_URL).incr(SEQ_KEY.format(group=tenant_group(tenant)))
    driver("transition", job=order[1], state="running", parallelism=2)
    page.wait_for_function("() => window.__portalLive.gaps === 1")
    page.wait_for_function("() => window.__portalLive.resyncs === 2 && !document.hidden")
    wait_position(page, order[2], f"#{first}")
    page.wait_for_function(
        f"() => document.querySelector('#job-{order[1]} [data-field=state]').textContent"
        " === 'running'"
    )
    assert len(snapshots) == 1 and str(tenant) in snapshots[0]
    assert page.evaluate("window.__notReloaded") is True
    # The portal is shared with the other browser tests: leave no job of acme holding GPUs.
    for job in jobs:
        driver("transition", job=job, state="cancelled", parallelism=0)

"""The job page stays honest while the job runs (issue 19, item 5): no reload needed."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.browser.conftest import Driver, Server, login, screenshot, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

UTC_TIME = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"


def test_settings_card_fills_live_as_the_job_runs_and_finishes(
    browser: Any, server: Server, driver: Driver
) -> None:
    alice = login(browser, server, "alice")
    alice.goto("/jobs/new/")
    alice.fill("#id_name", "settings-live")
    alice.select_option("#id_workload", "mlp-digits")
    alice.fill("#id_args", '{"epochs": 3, "lr": 0.1}')
    alice.fill("#id_gpus", "1")
    alice.fill("#id_min_gpus", "1")
    alice.fill("#id_max_gpus", "1")
    alice.click("#job-form button[type=submit]")
    alice.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = int(alice.url.rstrip("/").rsplit("/", 1)[1])
    wait_live(alice)
    alice.evaluate("window.__notReloaded = true")

    # the arguments as JSON (what was typed, defaults filled in), not a Python dict
    args = json.loads(alice.inner_text("#job-args"))
    assert args["epochs"] == 3 and args["lr"] == 0.1 and args["hidden"] == 128
    assert alice.inner_text("#job-started") == "—"
    assert alice.inner_text("#job-finished") == "—"
    assert alice.locator(".messages li.success").count() == 1  # "Job N submitted."

    driver("transition", job=job, state="running", parallelism=1, reason="placed")
    alice.wait_for_function("() => document.getElementById('job-started').textContent !== '—'")
    assert re.match(UTC_TIME, alice.inner_text("#job-started"))
    # the submit note described the page as it opened: it goes with the first live update
    alice.wait_for_function("() => !document.querySelector('.messages li.success')")

    driver("report", kind="progress", job=job, step=40, samples_per_s=900.0, world=1)
    alice.wait_for_function("() => document.getElementById('job-step').textContent === 'step 40'")
    assert driver("report", kind="finished", job=job, step=57) == {"outcome": "completed"}
    alice.wait_for_function(
        "() => document.getElementById('job-state').textContent === 'completed'"
    )
    alice.wait_for_function("() => document.getElementById('job-finished').textContent !== '—'")
    assert re.match(UTC_TIME, alice.inner_text("#job-finished"))
    history = alice.inner_text("#events-body")
    assert "Completed" in history and "Running" in history
    assert alice.evaluate("window.__notReloaded") is True
    screenshot(alice, "job-page-completed")
    alice.context.close()

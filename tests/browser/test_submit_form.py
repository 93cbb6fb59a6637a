"""The submit form guides (issue 19, item 7): arguments, defaults and limits beside the fields."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import Server, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


def test_the_form_lists_the_chosen_workloads_arguments_and_defaults(
    browser: Any, server: Server
) -> None:
    alice = login(browser, server, "alice")
    alice.goto("/jobs/new/")
    alice.select_option("#id_workload", "mlp-digits")
    epochs = alice.locator('#workload-args dd[data-arg="epochs"]')
    assert "default 20, 1\u2013100" in epochs.inner_text()
    assert alice.get_attribute("#id_batch_size", "placeholder") == "64"
    assert "GPU quota of tenant acme" in alice.inner_text(".field:has(#id_gpus) .help")
    assert "shrink" in alice.inner_text(".field:has(#id_min_gpus) .help")
    screenshot(alice, "submit-form")

    alice.select_option("#id_workload", "resnet18-synthetic")
    assert alice.locator('#workload-args dd[data-arg="steps"]').count() == 1
    assert alice.locator('#workload-args dd[data-arg="epochs"]').count() == 0
    assert alice.get_attribute("#id_batch_size", "placeholder") == "32"

    alice.fill("#id_name", "backwards")
    alice.fill("#id_gpus", "2")
    alice.fill("#id_min_gpus", "4")
    alice.fill("#id_max_gpus", "2")
    alice.click("#job-form button[type=submit]")
    error = alice.locator('.field-error[data-for="min_gpus"]').first
    error.wait_for()
    assert error.inner_text() == "Min GPUs cannot exceed Max GPUs."
    alice.context.close()

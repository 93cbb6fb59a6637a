"""An array submitted through the form, capped at one task at a time, and its page kept live
(issue 40): as tasks change state the counts and the task table change without a reload."""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Driver, Server, login, screenshot, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


@pytest.fixture(autouse=True)
def no_tasks_left(driver: Driver) -> Iterator[None]:
    """Cancel what the test left waiting: later tests on the same portal count the tenant's
    waiting jobs (the dashboard's tile) and must not find these tasks among them."""
    yield
    driver("cancel_active")


def bundle(tmp_path: Path) -> Path:
    """A .tar.gz holding a program that reads its TASK_ID."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"import os\nprint('task', os.environ['TASK_ID'])\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    path = tmp_path / "grid.tgz"
    path.write_bytes(buf.getvalue())
    return path


def submit_array(page: Any, tmp_path: Path, name: str, size: int) -> list[int]:
    """Submit an array of ``size`` tasks, one running at a time, through the form; its page
    is open and the tasks' job ids are returned (TASK_ID order)."""
    page.goto("/jobs/new/")
    page.fill("#id_name", name)
    page.check("input[name=source][value=program]")
    page.set_input_files("#id_archive", str(bundle(tmp_path)))
    page.fill("#id_entrypoint", "train.py")
    for field in ("gpus", "min_gpus", "max_gpus"):
        page.fill(f"#id_{field}", "1")
    page.fill("#id_array_size", str(size))
    page.fill("#id_array_max_running", "1")
    page.click("#job-form button[type=submit]")
    page.wait_for_url(re.compile(r"/arrays/\d+/$"))
    return [int(j) for j in page.locator("#array-tasks-body tr").evaluate_all(
        "rows => rows.map(r => r.dataset.job)")]  # fmt: skip


def count(page: Any, state: str) -> str:
    node = page.locator(f"#array-count-{state}")
    return str(node.inner_text()) if node.count() else "0"


def states(page: Any) -> list[str]:
    return [str(s) for s in page.locator("#array-tasks-body .state").all_inner_texts()]


def test_an_array_submitted_with_a_cap_updates_live(
    browser: Any, server: Server, driver: Driver, tmp_path: Path
) -> None:
    driver("cancel_active")
    alice = login(browser, server, "alice")
    jobs = submit_array(alice, tmp_path, "grid-live", 3)
    wait_live(alice)
    alice.evaluate("window.__notReloaded = true")
    assert (count(alice, "queued"), count(alice, "pending")) == ("1", "2")
    assert states(alice) == ["queued", "pending", "pending"]
    assert alice.locator(".messages li.success").count() == 1  # "Array N submitted: 3 tasks."
    assert "runs at most 1 tasks at once" in alice.inner_text("#array-tasks-body")

    driver("transition", job=jobs[0], state="running", parallelism=1)
    alice.wait_for_function("() => document.getElementById('array-count-running')")
    driver("transition", job=jobs[0], state="completed", parallelism=0)
    # The end of task 0 frees the slot: task 1 is queued in the same transaction.
    alice.wait_for_function(
        "() => (document.getElementById('array-count-completed') || {}).textContent === '1'"
    )
    alice.wait_for_function(
        "() => [...document.querySelectorAll('#array-tasks-body .state')]"
        ".map(s => s.textContent).join() === 'completed,queued,pending'"
    )
    assert (count(alice, "queued"), count(alice, "pending")) == ("1", "1")
    assert alice.locator("#array-retry-form").is_hidden()
    assert alice.locator(".messages li.success").count() == 0  # the note went with the change

    driver("transition", job=jobs[1], state="running", parallelism=1)
    driver("transition", job=jobs[1], state="failed", parallelism=0)
    alice.wait_for_function(
        "() => (document.getElementById('array-count-failed') || {}).textContent === '1'"
    )
    alice.wait_for_function("() => !document.getElementById('array-retry-form').hidden")
    alice.wait_for_function(
        "() => [...document.querySelectorAll('#array-tasks-body .state')]"
        ".map(s => s.textContent).join() === 'completed,failed,queued'"
    )
    # The last pending task's reason went with its slot (the reload after the events).
    alice.wait_for_function(
        "() => !document.querySelector('#array-tasks-body tr:nth-child(3)')"
        ".textContent.includes('runs at most')"
    )
    assert alice.evaluate("window.__notReloaded") is True
    screenshot(alice, "array-page-live")
    alice.context.close()


def test_a_waiting_tasks_page_links_to_its_array_and_follows_its_wait(
    browser: Any, server: Server, driver: Driver, tmp_path: Path
) -> None:
    driver("cancel_active")
    alice = login(browser, server, "alice")
    first, second = submit_array(alice, tmp_path, "pair", 2)
    array = int(alice.url.rstrip("/").rsplit("/", 1)[1])
    alice.click(f"#array-tasks-body a[href='/jobs/{second}/']")
    alice.wait_for_url(f"**/jobs/{second}/")
    wait_live(alice)
    assert "Task 1 of array" in alice.inner_text("#job-array")
    assert alice.get_attribute("#job-array a", "href") == f"/arrays/{array}/"
    assert "runs at most 1 tasks at once" in alice.inner_text("#job-wait-reason")
    driver("transition", job=first, state="running", parallelism=1)
    driver("transition", job=first, state="completed", parallelism=0)
    # Its slot is free: it is queued, and what it waited for goes, without a reload.
    alice.wait_for_function("() => document.getElementById('job-state').textContent === 'queued'")
    alice.wait_for_function("() => document.getElementById('job-wait').hidden")
    alice.context.close()

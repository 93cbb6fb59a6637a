"""The Notifications page: subscribe a webhook, send a test event, see it delivered and signed.

A real Celery worker (queue ``portal``) of the browser portal's database
delivers the test event to a receiver started here on loopback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from devtools.browser import ROOT, server_env
from notifications.signing import verify
from tests.browser.conftest import Server, login, screenshot
from tests.notifications.receiver import Receiver

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


@pytest.fixture
def portal_worker(server: Server) -> Iterator[subprocess.Popen[bytes]]:
    """A Celery worker for the ``portal`` and ``webhooks`` queues, on the browser portal's database."""
    log = (server.data_dir / "notify-worker.log").open("ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "-Q",
            "portal,webhooks",
            "-n",
            "notify-test@%h",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
        ],
        cwd=ROOT,
        env=server_env(server.data_dir),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def test_subscribe_and_send_a_test_event(
    browser: Any, server: Server, receiver: Receiver, portal_worker: Any
) -> None:
    alice = login(browser, server, "alice")
    alice.click("nav >> text=Notifications")
    alice.wait_for_url(server.url + "/account/notifications/")
    alice.select_option("#id_tenant", "acme")
    alice.check("input[name=events][value=completed]")
    alice.check("input[name=events][value=failed]")
    alice.select_option("#id_channel", "webhook")
    alice.fill("#id_url", receiver.url)
    alice.click("#subscription-form button[type=submit]")
    alice.wait_for_selector("#secret")
    secret = alice.inner_text("#secret").strip()
    assert len(secret) == 64

    alice.click("#test-form button[type=submit]")
    alice.wait_for_selector("#deliveries tr[data-delivery]")
    # Other browser tests' jobs in acme may complete meanwhile and be delivered too: follow
    # the test event's row and request.
    delivered = "#deliveries tr[data-event=test][data-state=delivered]"
    for _ in range(100):  # the worker delivers; the page shows it on reload
        if alice.locator(delivered).count():
            break
        alice.wait_for_timeout(200)
        alice.reload()
    assert alice.locator(delivered).count() == 1
    assert "HTTP 200" in alice.locator(delivered).inner_text()
    screenshot(alice, "notifications")

    [request] = [r for r in receiver.requests if json.loads(r.body)["type"] == "job.test"]
    headers = request.headers
    assert verify(
        secret, headers["X-Portal-Timestamp"], request.body, headers["X-Portal-Signature"]
    )
    assert json.loads(request.body)["type"] == "job.test"

    # Bob (another tenant) cannot open it.
    row = alice.url
    bob = login(browser, server, "bob")
    assert bob.goto(row).status == 404
    alice.context.close()
    bob.context.close()

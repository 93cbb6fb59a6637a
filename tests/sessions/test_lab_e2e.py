"""A session's JupyterLab end to end, in a real Chromium, on the session's real stack (ASGI
server, Celery, agents with bubblewrap): start a session through the API, open the lab
through the portal on the lab's own host, run a cell that imports torch and sees its
devices, save the notebook, stop the session, start another and find the notebook; the lab's
page cannot read the portal's API; another tenant's user gets 404 on the lab's link and on
the session's shell, and nothing on the lab's host; the second session, left idle, is culled.

    Chromium ──portal cookie──> /sessions/<id>/lab-open/ ──302 + one-use ticket──>
             lab-<id>.localhost/sessions/<id>/lab/... ──lab cookie──> ──Redis──> agent
             ──lab.sock──> Jupyter       (the shared stack sets LAB_HOST_TEMPLATE)

Saves the user guide's screenshot of the lab (docs/img/lab.png).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from devtools.browser import ROOT
from tests.chromium import launched_chromium
from tests.test_e2e import api, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.stack, pytest.mark.slow, pytest.mark.timeout(900)]

SCREENSHOT = ROOT / "docs" / "img" / "lab.png"
USERS = (
    "from django.contrib.auth import get_user_model; User = get_user_model(); "
    "from tenancy.models import Tenant; from tenancy.services import do_add_member, "
    "do_create_tenant; "
    "lara = User.objects.create_user('lara', password='pw'); "
    "do_add_member(tenant=Tenant.objects.get(slug='e2e'), user=lara, role='member'); "
    "do_create_tenant(slug='elsewhere', owner_username='otto', password='pw', gpu_quota=1)"
)
CELL = "import os, torch\nprint(torch.cuda.device_count(), os.environ.get('CUDA_VISIBLE_DEVICES'))"
NOTEBOOK = {
    "type": "notebook",
    "content": {
        "cells": [
            {"cell_type": "code", "source": CELL, "metadata": {}, "outputs": [],
             "execution_count": None},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, with the browser tests' launch options."""
    with launched_chromium() as browser:
        yield browser


def signed_in(chromium: Any, stack: dict[str, Any], username: str) -> Any:
    """A page of a new context signed in as ``username`` (password ``pw``)."""
    context = chromium.new_context(viewport={"width": 1280, "height": 800}, base_url=stack["url"])
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    page.click("button[type=submit]")
    page.wait_for_url(stack["url"] + "/")
    return page


def start_session(stack: dict[str, Any], **fields: Any) -> int:
    """A one-GPU session of tenant e2e that its members may open; its id once it runs."""
    body = {"name": "e2e-lab", "gpus": 1, "lab_access": "tenant", **fields}
    found = api(stack, "/api/v1/sessions/", body)
    session = int(found["id"])
    wait_for(
        "the session to run",
        lambda: api(stack, f"/api/v1/sessions/{session}/")["state"] == "running",
        stack,
        180,
    )
    return session


def lab_origin(stack: dict[str, Any], session: int) -> str:
    """Where session ``session``'s lab is served: its own host, the portal's port."""
    return stack["url"].replace("127.0.0.1", f"lab-{session}.localhost")


def open_lab(page: Any, stack: dict[str, Any], session: int, path: str = "api/status") -> None:
    """Follow the portal's Open link (``path`` under the lab): ``page`` lands on the lab's host."""
    wanted = quote(f"/sessions/{session}/lab/{path}", safe="")
    page.goto(f"{stack['url']}/sessions/{session}/lab-open/?next={wanted}")
    assert page.url.startswith(lab_origin(stack, session) + f"/sessions/{session}/lab/"), page.url
    assert "lab_ticket" not in page.url


def lab_fetch(page: Any, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    """A request from the page itself (its cookie, its origin), as JupyterLab makes them."""
    answer = page.evaluate(
        """async ([method, url, body]) => {
            const r = await fetch(url, {method, headers: {'Content-Type': 'application/json'},
                                        body: body === null ? undefined : JSON.stringify(body)});
            return [r.status, await r.text()];
        }""",
        [method, url, body],
    )
    status, text = int(answer[0]), str(answer[1])
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def until_lab_answers(page: Any, base: str, timeout: float = 120) -> None:
    """Wait while the lab starts (the proxy says 503 until Jupyter listens)."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = lab_fetch(page, "GET", f"{base}api/status")
        if status == 200:
            return
        assert status == 503 and time.monotonic() < deadline, (status, body)
        page.wait_for_timeout(1000)


def test_a_notebook_in_the_lab_sees_its_devices_and_outlives_its_session(
    stack: dict[str, Any], chromium: Any
) -> None:
    stack["manage"]("shell", "-c", USERS)
    session = start_session(stack)
    base = f"/sessions/{session}/lab/"
    page = signed_in(chromium, stack, "lara")
    open_lab(page, stack, session)
    until_lab_answers(page, base)
    status, body = lab_fetch(page, "PUT", f"{base}api/contents/e2e.ipynb", NOTEBOOK)
    assert status == 201, body

    # The lab, through the portal: the notebook's cell runs on the session's kernel.
    page.goto(f"{lab_origin(stack, session)}{base}lab/tree/e2e.ipynb")
    page.wait_for_selector(".jp-Notebook .jp-Cell .cm-content")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    output = page.locator(".jp-OutputArea-output").first
    try:
        page.locator(".jp-Notebook .jp-Cell").first.click()
        for _ in range(3):  # Run > Run All Cells, once the kernel has taken it
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_text("Run All Cells", exact=True).click()
            with contextlib.suppress(Exception):
                output.wait_for(timeout=40_000)
                break
        output.wait_for(timeout=1000)
    except Exception:
        page.screenshot(path="/tmp/lab-e2e-failure.png")
        raise
    printed = output.inner_text().strip()
    assert printed.startswith("0"), printed  # a CPU node: no GPU, CUDA_VISIBLE_DEVICES empty
    assert "Error" not in printed, printed
    page.keyboard.press("Control+s")
    page.wait_for_timeout(1500)
    with contextlib.suppress(Exception):  # JupyterLab's question about its news feed
        page.locator(".jp-toast-button", has_text="No").first.click(timeout=3000)
        page.wait_for_timeout(500)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    status, saved = lab_fetch(page, "GET", f"{base}api/contents/e2e.ipynb")
    assert status == 200
    outputs = saved["content"]["cells"][0]["outputs"]
    assert outputs and outputs[0]["text"].startswith("0"), outputs
    # Nothing of Jupyter's token reached the browser.
    assert "token" not in page.url
    html = page.content()
    assert '"token": ""' in html or "token" not in html.split("jupyter-config-data", 1)[-1][:50]

    # The lab's page (its script: a notebook's outputs) cannot read the portal's API with
    # the viewer's portal session: another origin, no CORS; nor reach it on its own host.
    portal_me = page.evaluate(
        """(url) => fetch(url, {credentials: 'include'})
            .then((r) => 'read ' + r.status, (e) => 'refused: ' + e.name)""",
        stack["url"] + "/api/v1/me/",
    )
    assert portal_me == "refused: TypeError", portal_me
    assert lab_fetch(page, "GET", "/api/v1/me/")[0] == 404
    cookies = page.evaluate("document.cookie")
    assert "sessionid" not in cookies and f"lab_{session}" not in cookies  # HttpOnly

    # Another tenant's user: the lab's link is a 404, and so is the session's shell (the
    # socket closes with 4404, as for a job that does not exist); the lab's host, without
    # the ticket only the portal hands out, opens nothing.
    stranger = signed_in(chromium, stack, "otto")
    assert stranger.goto(f"/sessions/{session}/lab-open/").status == 404
    assert stranger.goto(f"{base}lab").status == 404  # the portal's host serves no lab
    assert stranger.goto(f"{lab_origin(stack, session)}{base}lab").status == 403
    assert lab_fetch(stranger, "GET", f"{base}api/contents")[0] == 403
    stranger.goto("/")
    shell_url = stack["url"].replace("http", "ws", 1) + f"/ws/jobs/{session}/shell/"
    code = stranger.evaluate(
        """(url) => new Promise((resolve) => {
            const socket = new WebSocket(url);
            socket.onopen = () => socket.send(JSON.stringify({type: 'open', rows: 24, cols: 80}));
            socket.onclose = (event) => resolve(event.code);
        })""",
        shell_url,
    )
    assert code == 4404, code

    # Stopped, then another session of the same user in the same tenant: the notebook is
    # back (the persistent home, synced at stop, restored at start).
    api(stack, f"/api/v1/sessions/{session}/stop/", {})
    wait_for(
        "the session to stop",
        lambda: api(stack, f"/api/v1/sessions/{session}/")["state"] not in ("running", "scaling"),
        stack,
        120,
    )
    stopped = page.goto(f"{lab_origin(stack, session)}{base}api/contents")
    assert stopped.status == 404  # a stopped session has no lab
    again = start_session(stack, idle_timeout_s=20)
    base = f"/sessions/{again}/lab/"
    open_lab(page, stack, again)  # a JSON page: no JupyterLab app keeps the session busy
    until_lab_answers(page, base)
    status, listing = lab_fetch(page, "GET", f"{base}api/contents/e2e.ipynb")
    assert status == 200, listing
    assert listing["content"]["cells"][0]["source"] == CELL

    # Left alone (no client, no kernel), the session is culled after its idle timeout.
    wait_for(
        "the idle session to be culled",
        lambda: api(stack, f"/api/v1/sessions/{again}/")["state"] == "cancelled",
        stack,
        150,
    )
    events = api(stack, f"/api/v1/jobs/{again}/events/")
    reasons = [e["reason"] for e in events.get("results", events)]
    assert any("idle for 20 s: culled" in reason for reason in reasons), reasons

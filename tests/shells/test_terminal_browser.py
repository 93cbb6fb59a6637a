"""The job page's terminal and the admins' page of open shells, in a real Chromium, on the
session's real stack (ASGI server, Celery, agents with bubblewrap, a running built-in job).

    Chromium ──session cookie──> /ws/jobs/<job>/shell/ ──> agent ──nsenter──> worker's sandbox
       │  xterm.js (static/vendor/xterm/), static/js/terminal.js
       └── admin's page /cluster/shells/ (refreshes itself) ──Close──> do_request_close

Also saves the user guide's screenshots (docs/img/terminal.png, docs/img/admin-shells.png).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devtools.browser import ROOT
from tests.chromium import launched_chromium
from tests.test_e2e import api, job_state, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.stack, pytest.mark.slow]

SCREENSHOTS = ROOT / "docs" / "img"
# tess: a member of tenant e2e (eve's tokens stay valid: a password change revokes them).
USERS = (
    "from django.contrib.auth import get_user_model; User = get_user_model(); "
    "from tenancy.models import Tenant; from tenancy.services import do_add_member; "
    "tess = User.objects.create_user('tess', password='pw'); "
    "do_add_member(tenant=Tenant.objects.get(slug='e2e'), user=tess, role='member'); "
    "User.objects.create_user('term-admin', password='pw', is_staff=True)"
)


OFFERED = (
    "() => [...document.querySelectorAll('#terminal-worker option')]"
    ".map(o => o.value).filter(Boolean)"
)
"""The workers the terminal's select offers now (not "the first")."""


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, with the browser tests' launch options."""
    with launched_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def job(stack: dict[str, Any], chromium: Any) -> Iterator[int]:
    """A built-in job of tenant e2e, running on one slot until the module ends."""
    stack["manage"]("shell", "-c", USERS)
    body = {"name": "terminal", "workload": "mlp-digits", "gpus": 1, "args": {"epochs": 5000}}
    found = api(stack, "/api/v1/jobs/", body)
    wait_for(
        "the job to run",
        lambda: job_state(stack, found["id"])["state"] == "running",
        stack,
        120,
    )
    yield int(found["id"])
    api(stack, f"/api/v1/jobs/{found['id']}/cancel/", {})


def signed_in(chromium: Any, stack: dict[str, Any], username: str, csp: list[str]) -> Any:
    """A page of a new context signed in as ``username`` (password ``pw``)."""
    context = chromium.new_context(viewport={"width": 1100, "height": 900}, base_url=stack["url"])
    context.set_default_timeout(20_000)
    context.on(
        "console",
        lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None,
    )
    page = context.new_page()
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    page.click("button[type=submit]")
    page.wait_for_url(stack["url"] + "/")
    return page


def screen(page: Any) -> str:
    """What the terminal shows now, one line per row (xterm.js draws rows as DOM)."""
    return str(page.locator("#terminal .xterm-rows").inner_text()).replace("\xa0", " ")


def until(page: Any, check: Callable[[str], bool], what: str, timeout: float = 30) -> str:
    """Wait until ``check`` holds for the screen; the screen."""
    deadline = time.monotonic() + timeout
    while True:
        text = screen(page)
        if check(text):
            return text
        assert time.monotonic() < deadline, f"{what}: the terminal shows\n{text}"
        page.wait_for_timeout(200)


def open_shell(page: Any, button: str) -> str:
    """Click ``button`` until a shell opens (an agent refuses while the sandbox starts)."""
    for _ in range(15):
        page.click(button)
        page.wait_for_function(
            "() => { const c = document.getElementById('job-terminal');"
            " return c.dataset.shell || c.dataset.exitCode !== undefined"
            " || document.getElementById('terminal-status').dataset.kind === 'error'; }"
        )
        card = page.locator("#job-terminal")
        if card.get_attribute("data-exit-code") is None and card.get_attribute("data-shell"):
            until(page, lambda text: "$" in text, "a prompt")
            return str(card.get_attribute("data-shell"))
        assert "still starting" in page.inner_text("#job-terminal"), page.inner_text(
            "#job-terminal"
        )
        page.wait_for_timeout(1000)
        button = "#terminal-reconnect"
    raise AssertionError("no shell opened")


def type_line(page: Any, line: str) -> None:
    page.locator("#terminal .xterm-helper-textarea").focus()
    page.keyboard.type(line)
    page.keyboard.press("Enter")


def stty_size(page: Any, marker: str) -> tuple[int, int]:
    """The remote PTY's rows and columns, as ``stty size`` prints them."""
    type_line(page, f"echo {marker}-$(stty size | tr ' ' x)")
    text = until(page, lambda t: re.search(rf"{marker}-\d+x\d+", t) is not None, "stty size")
    found = re.search(rf"{marker}-(\d+)x(\d+)", text)
    assert found is not None
    return int(found.group(1)), int(found.group(2))


def test_a_person_uses_the_terminal_and_an_admin_sees_and_closes_it(
    stack: dict[str, Any], chromium: Any, job: int
) -> None:
    csp: list[str] = []
    page = signed_in(chromium, stack, "tess", csp)
    page.goto(f"/jobs/{job}/")
    workers = page.locator("#terminal-worker option").evaluate_all(
        "options => options.map(o => o.value).filter(Boolean)"
    )
    assert workers, "the running job's workers are offered"
    page.select_option("#terminal-worker", workers[0])
    shell_id = open_shell(page, "#terminal-open")
    assert page.inner_text("#terminal-status").startswith(f"Connected: {workers[0]} on ")

    type_line(page, "echo hi-$((6*7))")
    until(page, lambda text: "hi-42" in text, "the command's output")
    type_line(page, "sleep 100")
    page.wait_for_timeout(1000)
    page.keyboard.press("Control+c")
    type_line(page, "echo after-$?")
    until(page, lambda text: "after-130" in text, "Ctrl-C to interrupt sleep")

    # The terminal's box follows the window; the remote PTY follows the box (fit addon).
    rows, cols = stty_size(page, "size1")
    page.set_viewport_size({"width": 760, "height": 900})
    page.wait_for_function("() => document.querySelector('#terminal .xterm-rows') !== null")
    deadline = time.monotonic() + 10
    while (narrower := stty_size(page, f"size{int(time.monotonic())}")) == (rows, cols):
        assert time.monotonic() < deadline, "the window's resize never reached the shell"
    assert narrower[0] == rows and narrower[1] < cols
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1100, "height": 900})
    type_line(page, "clear; echo hi-$((6*7)); stty size; nproc; echo done-$((3+4))")
    until(
        page,
        lambda text: "done-7" in text and "after-130" not in text,
        "the screenshot's commands",
    )
    page.wait_for_timeout(300)  # the last frame drawn
    page.locator("#job-terminal").screenshot(path=str(SCREENSHOTS / "terminal.png"))

    # The admin's page lists the shell, with the bytes it moved, and refreshes itself.
    admin = signed_in(chromium, stack, "term-admin", csp)
    admin.goto("/cluster/shells/")
    row = admin.locator(f'tr[data-shell="{shell_id}"]')
    assert row.locator("td").nth(0).inner_text() == "tess"
    assert row.locator("td").nth(1).inner_text() == "e2e"
    assert row.locator("td").nth(2).inner_text().startswith(f"{job} terminal")
    assert row.locator("td").nth(3).inner_text().startswith(workers[0])
    admin.wait_for_function(
        f"() => {{ const r = document.querySelector('tr[data-shell=\"{shell_id}\"] .bytes-out');"
        " return r && Number(r.title.split(' ')[0]) > 100; }"
    )
    admin.screenshot(path=str(SCREENSHOTS / "admin-shells.png"), full_page=True)

    type_line(page, "exit 3")
    page.wait_for_selector("#terminal-exit:not([hidden])")
    assert page.inner_text("#terminal-exit") == "Shell exited with code 3"
    assert page.locator("#job-terminal").get_attribute("data-exit-code") == "3"
    admin.wait_for_function(f"() => !document.querySelector('tr[data-shell=\"{shell_id}\"]')")

    # A new shell; the admin's page shows it without a reload, and closes it.
    second = open_shell(page, "#terminal-reconnect")
    assert second != shell_id
    closing = admin.locator(f'tr[data-shell="{second}"] button', has_text="Close")
    closing.wait_for()
    closing.click()
    admin.wait_for_url(stack["url"] + "/cluster/shells/")
    assert f"Shell {second[:8]} of tess in job {job} closed." in admin.inner_text(".messages")
    page.wait_for_selector("#terminal-exit:not([hidden])")
    assert page.inner_text("#terminal-exit") == "Shell killed by signal 9"
    closed = api(stack, f"/api/v1/shells/{second}/")
    assert (closed["closed_by"], closed["exit_code"]) == ("term-admin", -9)
    assert not csp, csp


def test_another_tenants_user_gets_404_on_the_page_and_at_the_socket(
    stack: dict[str, Any], chromium: Any, job: int
) -> None:
    stack["manage"]("createtenant", "term-other", "--owner", "trudy", "--no-profile")
    stack["manage"](
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model; "
        "u = get_user_model().objects.get(username='trudy'); u.set_password('pw'); u.save()",
    )
    csp: list[str] = []
    page = signed_in(chromium, stack, "trudy", csp)
    assert page.goto(f"/jobs/{job}/").status == 404
    answers = page.evaluate(
        """(job) => new Promise((done) => {
            const frames = [];
            const ws = new WebSocket("ws://" + location.host + "/ws/jobs/" + job + "/shell/");
            ws.onopen = () => ws.send(JSON.stringify({type: "open"}));
            ws.onmessage = (e) => frames.push(JSON.parse(e.data));
            ws.onclose = (e) => done({frames: frames, code: e.code});
        })""",
        job,
    )
    assert answers["code"] == 4404
    assert answers["frames"] == [
        {"type": "error", "status": 404, "field": "job", "message": f"no job {job}"}
    ]
    assert not csp, csp


def test_the_worker_list_follows_a_job_that_starts_after_its_page_opened(
    stack: dict[str, Any], chromium: Any, job: int
) -> None:
    """A job queued when its page opens: the card waits, saying why; once the job runs, its
    worker is offered and a shell opens on it, and once it ends the worker goes, all without
    a reload (the page's live messages carry the workers: jobs.live.patches.page_fields)."""
    # Tenant term-q holds one GPU at most: a blocker keeps the job queued until it goes.
    stack["manage"]("createtenant", "term-q", "--owner", "tess", "--gpu-quota", "1", "--no-profile")
    as_tess = {**stack, "token": stack["manage"]("issuetoken", "tess", "--name", "term-q").strip()}
    body = {"tenant": "term-q", "workload": "mlp-digits", "gpus": 1, "args": {"epochs": 5000}}
    blocker = api(as_tess, "/api/v1/jobs/", {**body, "name": "blocker"})["id"]
    queued = api(as_tess, "/api/v1/jobs/", {**body, "name": "queued"})["id"]
    try:
        wait_for(
            "the blocker to run",
            lambda: job_state(as_tess, blocker)["state"] == "running",
            stack,
            120,
        )
        assert job_state(as_tess, queued)["state"] == "queued"
        csp: list[str] = []
        page = signed_in(chromium, stack, "tess", csp)
        page.goto(f"/jobs/{queued}/")
        page.evaluate("() => { window.notReloaded = true; }")
        assert page.evaluate(OFFERED) == []
        assert page.locator("#terminal-open").is_disabled()
        assert "(it is queued)" in page.inner_text("#terminal-status")
        assert page.inner_text("#terminal-command") == f"portalctl shell {queued}"

        api(as_tess, f"/api/v1/jobs/{blocker}/cancel/", {})
        page.wait_for_function(f"() => ({OFFERED})().length === 1", timeout=120_000)
        worker = page.evaluate(OFFERED)[0]
        assert page.locator("#terminal-open").is_enabled()
        assert page.inner_text("#terminal-status") == ""
        page.select_option("#terminal-worker", worker)
        assert page.inner_text("#terminal-command") == f"portalctl shell {queued} --worker {worker}"
        # Running is the placement; its agent knows the worker once the process runs.
        wait_for(
            "the job to report progress",
            lambda: job_state(as_tess, queued)["step"] > 0,
            stack,
            120,
        )
        open_shell(page, "#terminal-open")
        assert page.inner_text("#terminal-status").startswith(f"Connected: {worker} on ")
        type_line(page, "exit 0")
        page.wait_for_selector("#terminal-exit:not([hidden])")

        api(as_tess, f"/api/v1/jobs/{queued}/cancel/", {})
        page.wait_for_function(f"() => ({OFFERED})().length === 0", timeout=60_000)
        assert page.locator("#terminal-reconnect").is_disabled()
        assert "(it is cancelled)" in page.inner_text("#terminal-status")
        assert page.evaluate("() => document.getElementById('terminal-worker').value") == ""
        assert page.inner_text("#terminal-command") == f"portalctl shell {queued}"
        assert page.evaluate("() => window.notReloaded === true"), "the page was reloaded"
        assert not csp, csp
    finally:
        for left in (blocker, queued):
            if job_state(as_tess, left)["state"] not in ("completed", "failed", "cancelled"):
                api(as_tess, f"/api/v1/jobs/{left}/cancel/", {})

"""End to end (issue 39's done-when): ``portalctl shell`` into a real running job's worker.

The session's stack (``tests/conftest.py``: ASGI server, Celery, beat, real agents with
bubblewrap), one built-in job of tenant ``e2e`` running on one slot, the real
``portalctl`` as a subprocess.  The shell travels portalctl -> WebSocket -> portal ->
signed OpenShell -> agent -> nsenter into the worker's sandbox, and back through Redis.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cli.test_cli_e2e import ROOT, portalctl
from tests.test_e2e import api, job_state, wait_for
from workers.agent.shell import set_window

pytestmark = [pytest.mark.stack, pytest.mark.slow]

ADMIN_TOKEN = (
    "from django.contrib.auth import get_user_model; "
    "from tenancy.token_services import do_issue_token; "
    "u, _ = get_user_model().objects.get_or_create(username='shell-admin', "
    "defaults={'is_staff': True}); print(do_issue_token(user=u))"
)


@pytest.fixture(scope="module")
def portal(stack: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The session's portal as ``tests.cli.test_cli_e2e.portalctl`` takes it."""
    return {"url": stack["url"], "token": stack["token"], "tmp": tmp_path_factory.mktemp("sh")}


@pytest.fixture(scope="module")
def job(stack: dict[str, Any]) -> Iterator[int]:
    """A built-in job of tenant e2e, running on one slot until the module ends."""
    body = {"name": "shell", "workload": "mlp-digits", "gpus": 1, "args": {"epochs": 5000}}
    found = api(stack, "/api/v1/jobs/", body)
    wait_for(
        "the job to run",
        lambda: job_state(stack, found["id"])["state"] == "running",
        stack,
        120,
    )
    yield int(found["id"])
    api(stack, f"/api/v1/jobs/{found['id']}/cancel/", {})


def shell(portal: dict[str, Any], *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``portalctl shell ARGS``; once more while the worker's sandbox is still starting."""
    for _ in range(10):
        done = portalctl(portal, "shell", *args, timeout=60, **kwargs)
        if "still starting" not in done.stderr:
            return done
        time.sleep(1.0)
    return done


def test_portalctl_shell_runs_a_command_in_the_worker_and_exits_with_its_status(
    portal: dict[str, Any], job: int
) -> None:
    done = shell(portal, str(job), "--", "sh", "-c", "echo hello; exit 3")
    assert done.returncode == 3, done.stderr
    assert done.stdout.split() == ["hello"]


def test_input_reaches_the_shell_through_the_pty(portal: dict[str, Any], job: int) -> None:
    done = shell(portal, str(job), "--", "cat", stdin="ping\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("ping") == 2, done.stdout  # the PTY's echo, then cat's


def test_another_tenants_user_gets_the_answer_of_a_missing_job(
    stack: dict[str, Any], portal: dict[str, Any], job: int
) -> None:
    stack["manage"]("createtenant", "shell-other", "--owner", "mallory", "--no-profile")
    token = stack["manage"]("issuetoken", "mallory")
    theirs = shell(portal, str(job), "--", "true", token=token)
    missing = shell(portal, str(job + 100_000), "--", "true", token=token)
    assert theirs.returncode == missing.returncode == 255
    assert f"404 no job {job} (job)" in theirs.stderr
    assert theirs.stderr.replace(str(job), "N") == missing.stderr.replace(str(job + 100_000), "N")


def test_an_admin_sees_an_open_shell_and_closes_it(
    stack: dict[str, Any], portal: dict[str, Any], job: int
) -> None:
    admin = stack["manage"]("shell", "-c", ADMIN_TOKEN).splitlines()[-1]
    env = {"PORTAL_URL": portal["url"], "PORTAL_TOKEN": portal["token"], "PATH": "/usr/bin:/bin"}
    sleeper = subprocess.Popen(
        [sys.executable, "-m", "portalctl", "shell", str(job), "--", "sleep", "300"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    as_admin = {**stack, "token": admin}
    try:
        opened: list[dict[str, Any]] = []

        def listed() -> bool:
            shells = api(as_admin, "/api/v1/shells/?open=1")["results"]
            # An earlier test's shell may still be open for a moment (its end is recorded
            # after portalctl has its exit status): this test's shell is the sleeper.
            opened[:] = [s for s in shells if s["argv"] == ["sleep", "300"]]
            return bool(opened)

        wait_for("the shell to be listed", listed, stack, 60)
        assert opened[0]["job"] == job
        closed = api(as_admin, f"/api/v1/shells/{opened[0]['id']}/close/", {})
        assert closed["closed_by"] == "shell-admin" and closed["closed_at"]
        assert sleeper.wait(timeout=30) == 128 + 9  # the agent SIGKILLed it
        # The shell's own end (SIGKILL) completes the admin's record; it stays the admin's.
        ended: dict[str, Any] = {}

        def recorded() -> bool:
            ended.update(api(as_admin, f"/api/v1/shells/{opened[0]['id']}/"))
            return ended["exit_code"] is not None

        wait_for("the shell's exit status", recorded, stack, 30)
        assert (ended["exit_code"], ended["closed_by"]) == (-9, "shell-admin")
    finally:
        sleeper.kill()
        sleeper.communicate()


class Terminal:
    """portalctl on a terminal of its own (a local PTY), as a person runs it."""

    def __init__(self, portal: dict[str, Any], job: int, rows: int, cols: int) -> None:
        self.master, slave = os.openpty()
        set_window(slave, rows, cols)
        env = {"PORTAL_URL": portal["url"], "PORTAL_TOKEN": portal["token"],
               "PATH": "/usr/bin:/bin", "TERM": "xterm"}  # fmt: skip
        self.process = subprocess.Popen(
            [sys.executable, "-m", "portalctl", "shell", str(job), "--", "sh", "-i"],
            cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self.seen = b""

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def until(self, text: bytes, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            assert time.monotonic() < deadline, self.seen[-2000:]
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                with contextlib.suppress(OSError):
                    self.seen += os.read(self.master, 4096)


def test_a_person_at_a_terminal_types_interrupts_resizes_and_exits(
    portal: dict[str, Any], job: int
) -> None:
    """Raw mode end to end: Ctrl-C interrupts the remote command (not portalctl), a window
    resize reaches the remote PTY, and `exit 7` is portalctl's status."""
    terminal = Terminal(portal, job, 33, 101)
    try:
        terminal.until(b"$ ")
        terminal.type(b"stty size\r")
        terminal.until(b"33 101")
        terminal.type(b"sleep 60\r")
        time.sleep(1.0)
        terminal.type(b"\x03")
        terminal.type(b"echo after-$?\r")
        terminal.until(b"after-130")
        set_window(terminal.master, 40, 120)
        terminal.process.send_signal(signal.SIGWINCH)
        time.sleep(0.5)
        terminal.type(b"stty size\r")
        terminal.until(b"40 120")
        terminal.type(b"exit 7\r")
        status = terminal.process.wait(timeout=30)
        with contextlib.suppress(OSError):
            terminal.seen += os.read(terminal.master, 65536)
        assert status == 7, terminal.seen[-1500:]
    finally:
        terminal.process.kill()
        terminal.process.wait()
        os.close(terminal.master)

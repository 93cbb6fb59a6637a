"""`make run`'s supervisor and embedded defaults, with real child processes.

The supervisor (``portal.stack``): a child that dies is started again after a
pause that doubles with each quick death, a child that stayed up long enough
starts the pauses over, and SIGTERM stops every child.

The whole stack: ``manage.py runstack`` with neither DATABASE_URL nor
REDIS_URL set must migrate SQLite, start the bundled redis-server, daphne, the
Celery workers and beat, serve the login page, accept a login with the demo
password it printed once, and stop everything on Ctrl-C.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis

from devtools.stack import free_port, start_stack, wait_http

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.stack


def output_of(tmp_path: Path) -> str:
    return (tmp_path / "stack.log").read_text()


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_runstack_on_embedded_defaults(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        PORTAL_DATA_DIR=str(tmp_path),
        DJANGO_SETTINGS_MODULE="portal.settings.dev",
        PYTHONUNBUFFERED="1",
    )
    proc = start_stack(tmp_path, port, env)
    try:
        assert wait_http(f"http://127.0.0.1:{port}/login/", timeout=90) == 200
        banner = (tmp_path / "stack.log").read_text()
        printed = re.search(r"tenant 'demo': demo / (\S+)", banner)
        assert printed is not None, banner
        assert "admin / admin" not in banner and printed.group(1) != "demo"
        kids = children_of(proc.pid)
        assert len(kids) >= 3, kids  # web, worker, beat (+ embedded redis)
        assert (tmp_path / "portal.sqlite3").exists()
        redis_port = int((tmp_path / "redis" / "port").read_text())

        jar = CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        page = opener.open(f"http://127.0.0.1:{port}/login/").read().decode()
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert csrf is not None
        form = urlencode(
            {
                "username": "demo",
                "password": printed.group(1),
                "csrfmiddlewaretoken": csrf.group(1),
            }
        ).encode()
        dashboard = opener.open(f"http://127.0.0.1:{port}/login/", data=form).read().decode()
        assert "Demo team" in dashboard
        css = urllib.request.urlopen(f"http://127.0.0.1:{port}/static/css/portal.css")
        assert css.status == 200
        plotly = urllib.request.urlopen(
            f"http://127.0.0.1:{port}/static/vendor/plotly/plotly.min.js"
        )
        assert plotly.status == 200

        # Faults: the embedded Redis and Celery beat are killed; both come back.
        password = (tmp_path / "redis" / "password").read_text()
        client = redis.Redis(
            host="127.0.0.1", port=redis_port, username="portal", password=password
        )
        client.set("survives", "yes")
        time.sleep(1.5)  # appendfsync everysec
        beat = int(re.findall(r"started beat \(pid (\d+)\)", output_of(tmp_path))[-1])
        os.kill(int((tmp_path / "redis" / "pid").read_text()), signal.SIGKILL)
        os.kill(beat, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            log = output_of(tmp_path)
            if "embedded redis-server exited" in log and log.count("started beat") == 2:
                break
            time.sleep(0.3)
        log = output_of(tmp_path)
        assert "embedded redis-server exited (status -9); started again" in log, log
        assert "beat exited with status -9" in log and log.count("started beat") == 2, log
        assert client.get("survives") == b"yes"  # same port, same password, same data
        assert proc.poll() is None and wait_http(f"http://127.0.0.1:{port}/login/", 30) == 200
        kids = children_of(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        output = (tmp_path / "stack.log").read_text()
    assert code == 0, output
    assert "GPU portal: http://127.0.0.1" in output and "demo / demo" not in output
    assert (tmp_path / "redis" / "password").read_text() not in output  # redacted in the banner
    for pid in kids:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        ), f"child {pid} still running"
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", redis_port)) != 0, "embedded redis still running"


@pytest.mark.django_db
def test_no_agents_leaves_the_servers_to_agents_started_elsewhere() -> None:
    from portal.demo import ensure_demo_fabric
    from portal.management.commands.runstack import stack_processes

    ensure_demo_fabric()
    names = [spec.name for spec in stack_processes(host="127.0.0.1", port=8000)]
    assert [n for n in names if n.startswith("agent")] == [f"agent node-{i}" for i in range(4)]
    without = [spec.name for spec in stack_processes(host="127.0.0.1", port=8000, agents=False)]
    assert without == ["web", "worker", "tick worker", "whatif worker", "webhooks worker", "beat"]


def test_the_banner_hides_the_redis_password() -> None:
    from portal.management.commands.runstack import redacted

    assert (
        redacted("redis://portal:s3cret@127.0.0.1:6380/0") == "redis://portal:***@127.0.0.1:6380/0"
    )
    assert redacted("redis://127.0.0.1:6379/6") == "redis://127.0.0.1:6379/6"


def test_the_tick_and_what_if_simulations_get_their_own_workers_and_queues() -> None:
    """Reports, ticks and simulations never wait behind one another (each has a worker)."""
    from django.conf import settings

    from portal.management.commands.runstack import stack_processes

    specs = {s.name: s.argv for s in stack_processes(host="h", port=1, agents=False)}

    def option(worker: str, flag: str) -> str:
        argv = specs[worker]
        return argv[argv.index(flag) + 1]

    assert option("whatif worker", "-Q") == "whatif"
    assert option("whatif worker", "-n") == "whatif@%h"
    assert option("whatif worker", "--concurrency") == "1"
    assert option("tick worker", "-Q") == "tick"
    assert option("tick worker", "--concurrency") == "1"
    # agent reports, log exports, retention; heartbeats on their own queue beside them
    assert option("worker", "-Q") == "heartbeats,reports,portal"
    # webhook and email deliveries wait on strangers' servers: never beside a heartbeat
    assert option("webhooks worker", "-Q") == "webhooks"
    assert settings.CELERY_TASK_ROUTES["notifications.deliver"] == {"queue": "webhooks"}
    assert settings.CELERY_BEAT_SCHEDULE["scheduler-tick"]["options"]["queue"] == "tick"


# --------------------------------------------------------------------------- the supervisor

SLEEPER = (sys.executable, "-c", "import time; time.sleep(120)")
CRASHER = (sys.executable, "-c", "raise SystemExit(3)")


def supervise(stack: Any, seconds: float, until: Callable[[], bool] = lambda: False) -> None:
    """Run the supervisor's passes for up to ``seconds`` (or until ``until()``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not until():
        stack.step()
        time.sleep(0.02)


def test_a_killed_child_is_restarted_and_the_others_keep_running() -> None:
    from portal.stack import Backoff, ProcessSpec, Stack

    lines: list[str] = []
    stack = Stack(
        [ProcessSpec("a", SLEEPER), ProcessSpec("b", SLEEPER)],
        log=lines.append,
        backoff=Backoff(first_s=0.2, cap_s=1.0),
    )
    stack.start()
    try:
        a, b = (stack.children[n].process for n in ("a", "b"))
        assert a is not None and b is not None
        os.kill(a.pid, signal.SIGKILL)
        supervise(stack, 10, until=lambda: stack.children["a"].process is not a)
        again = stack.children["a"].process
        assert again is not None and again is not a and again.poll() is None
        assert stack.children["b"].process is b and b.poll() is None  # untouched
        assert any(line.startswith("a exited with status -9") for line in lines), lines
        assert f"started a (pid {again.pid})" in lines
    finally:
        stack.stop(grace_seconds=5)
    assert all(c.process is not None and c.process.poll() is not None
               for c in stack.children.values())  # fmt: skip


def test_the_pause_doubles_with_each_quick_death_up_to_the_cap() -> None:
    from portal.stack import Backoff, ProcessSpec, Stack

    lines: list[str] = []
    stack = Stack(
        [ProcessSpec("crasher", CRASHER)],
        log=lines.append,
        backoff=Backoff(first_s=0.1, factor=2, cap_s=0.4),
    )
    stack.start()
    started = time.monotonic()
    try:
        supervise(stack, 20, until=lambda: stack.children["crasher"].restarts >= 5)
    finally:
        stack.stop(grace_seconds=5)
    pauses = [
        float(m.group(1))
        for line in lines
        if (m := re.search(r"exited with status 3 .*restarting in ([\d.]+) s", line))
    ]
    assert pauses[:5] == [0.1, 0.2, 0.4, 0.4, 0.4], lines
    assert time.monotonic() - started >= 0.1 + 0.2 + 0.4 + 0.4 + 0.4  # it really waited


def test_a_child_that_stayed_up_starts_the_pauses_over() -> None:
    from portal.stack import Backoff, ProcessSpec, Stack

    lines: list[str] = []
    stack = Stack(
        [ProcessSpec("a", SLEEPER)],
        log=lines.append,
        backoff=Backoff(first_s=0.1, cap_s=10.0, healthy_after_s=1.0),
    )
    stack.start()

    def kill_and_wait_restart() -> None:
        process = stack.children["a"].process
        assert process is not None
        os.kill(process.pid, signal.SIGKILL)
        supervise(stack, 10, until=lambda: stack.children["a"].process is not process)

    try:
        kill_and_wait_restart()  # up only a moment each time: 0.1, 0.2, 0.4
        kill_and_wait_restart()
        kill_and_wait_restart()
        assert stack.children["a"].failures == 3
        supervise(stack, 1.2)  # up longer than healthy_after_s
        kill_and_wait_restart()
        assert stack.children["a"].failures == 1
    finally:
        stack.stop(grace_seconds=5)
    pauses = [
        line.split("restarting in ")[1].split(" s")[0] for line in lines if "restarting" in line
    ]
    assert pauses == ["0.1", "0.2", "0.4", "0.1"], lines


def test_a_failing_keeper_or_start_is_logged_and_retried_not_fatal(tmp_path: Path) -> None:
    from portal.stack import Backoff, ProcessSpec, Stack

    lines: list[str] = []
    calls: list[int] = []

    def broken_keeper() -> str | None:
        calls.append(1)
        raise RuntimeError("redis-server did not start")

    program = tmp_path / "program"
    program.write_text("#!/bin/sh\nexit 1\n")
    program.chmod(0o755)
    stack = Stack(
        [ProcessSpec("vanishing", (str(program),))],
        log=lines.append,
        backoff=Backoff(first_s=0.05, cap_s=0.1),
        keepers=[broken_keeper],
    )
    stack.start()
    program.unlink()  # its next start fails: OSError, not a crash of the supervisor
    try:
        supervise(stack, 5, until=lambda: sum("could not start" in line for line in lines) >= 2)
    finally:
        stack.stop(grace_seconds=5)
    assert sum("could not start vanishing" in line for line in lines) >= 2, lines
    assert "could not restore a service: redis-server did not start" in lines
    assert len(calls) > 2


SUPERVISOR = """
import sys
from portal.stack import Backoff, ProcessSpec, Stack
sleeper = (sys.executable, "-c", "import time; time.sleep(120)")
stack = Stack([ProcessSpec("a", sleeper), ProcessSpec("b", sleeper)],
              log=lambda line: print(line, flush=True), backoff=Backoff(first_s=0.1))
stack.start()
sys.exit(stack.watch(poll_seconds=0.05))
"""


def test_sigterm_stops_every_child_and_the_supervisor() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    pids = []
    while len(pids) < 2:
        line = proc.stdout.readline()
        assert line, "the supervisor ended before starting its children"
        if found := re.match(r"started \w \(pid (\d+)\)", line):
            pids.append(int(found.group(1)))
    os.kill(pids[0], signal.SIGKILL)  # a death first: restarted, not a reason to stop
    deadline = time.monotonic() + 10
    restarted = None
    while restarted is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if found := re.match(r"started a \(pid (\d+)\)", line):
            restarted = int(found.group(1))
    assert restarted is not None and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    rest = proc.stdout.read()
    assert "stopping a" in rest and "stopping b" in rest
    for pid in (restarted, pids[1]):
        assert (
            not Path(f"/proc/{pid}").exists()
            or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        ), f"child {pid} still running"

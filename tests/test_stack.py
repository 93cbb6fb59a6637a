"""`make run`'s embedded defaults: boot the real stack with no services configured, then stop it.

Runs ``manage.py runstack`` with neither DATABASE_URL nor REDIS_URL set: it must
migrate SQLite, start the bundled redis-server, daphne, a Celery worker and
beat, serve the login page, accept a login, and stop everything on Ctrl-C.
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
from http.cookiejar import CookieJar
from pathlib import Path
from urllib.parse import urlencode

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.stack


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return int(response.status)
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout} s")


def start_stack(tmp_path: Path, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Run ``manage.py runstack`` with ``env``, its output in ``tmp_path/stack.log``."""
    log = (tmp_path / "stack.log").open("w+")
    return subprocess.Popen(
        [sys.executable, "manage.py", "runstack", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


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
            {"username": "demo", "password": "demo", "csrfmiddlewaretoken": csrf.group(1)}
        ).encode()
        dashboard = opener.open(f"http://127.0.0.1:{port}/login/", data=form).read().decode()
        assert "Demo team" in dashboard
        css = urllib.request.urlopen(f"http://127.0.0.1:{port}/static/css/portal.css")
        assert css.status == 200
        plotly = urllib.request.urlopen(
            f"http://127.0.0.1:{port}/static/vendor/plotly/plotly.min.js"
        )
        assert plotly.status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        output = (tmp_path / "stack.log").read_text()
    assert code == 0, output
    assert "GPU portal: http://127.0.0.1" in output and "demo / demo" in output
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
    assert without == ["web", "worker", "beat"]

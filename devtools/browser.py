"""A real portal for browser tests and bench/live.py: daphne, a driver process, Chromium.

    pytest/bench ──Playwright──> /usr/bin/chromium (headless) ──HTTP+WS──> daphne subprocess
       │                                                                       │
       └──JSON lines──> driver subprocess ──services──> SQLite file <──────────┘
                                                │ group_send after commit
                                                └──────> Redis channel layer

The server runs against its own SQLite file in a temporary directory (a
pytest-django test database cannot be shared with another process when it is
in memory), and the same Redis as the calling process.  The driver plays the
control plane: it changes jobs through the real services.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from utilities.embedded_redis import free_port

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")  # Debian's; the Makefile installs it
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def server_env(data_dir: Path) -> dict[str, str]:
    """The environment of the server and the driver: own SQLite file, the run's Redis."""
    from django.conf import settings

    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(
        PORTAL_DATA_DIR=str(data_dir),
        REDIS_URL=settings.REDIS_URL,
        DJANGO_SETTINGS_MODULE="portal.settings.test",
        PYTHONUNBUFFERED="1",
        TICK_SECONDS="3600",
        # Webhooks reach public addresses only; the browser tests' receiver is on loopback.
        WEBHOOK_ALLOWED_NETWORKS="127.0.0.1/32",
    )
    return env


class Server:
    """A daphne process serving the portal on a fixed port; can be stopped and restarted."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir = data_dir
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = (data_dir / "daphne.log").open("ab")

    def start(self, timeout: float = 60.0) -> None:
        """Start daphne and wait until the login page answers."""
        argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(
            [*argv, "portal.asgi:application"],
            cwd=ROOT,
            env=server_env(self.data_dir),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"daphne exited with {self.proc.returncode}; see {self.log.name}"
                )
            try:
                with urllib.request.urlopen(self.url + "/login/", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"daphne did not answer within {timeout} s")

    def stop(self) -> None:
        """Stop daphne (SIGTERM, then SIGKILL) so open sockets drop."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


class Driver:
    """The control plane stand-in: a persistent process applying service calls."""

    def __init__(self, data_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "devtools.browser_driver"],
            cwd=ROOT,
            env=server_env(data_dir),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(data_dir / "driver.log").open("ab"),
            text=True,
        )
        assert json.loads(self._readline())["ready"]

    def _readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the driver process died; see driver.log")
        return line

    def __call__(self, op: str, **fields: Any) -> Any:
        """Send one request and return its result (raises on a refused request)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self._readline())
        if not answer["ok"]:
            raise RuntimeError(answer["error"])
        return answer["result"]

    def close(self) -> None:
        """End the driver."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def start_portal(data_dir: Path) -> tuple[Server, Driver, dict[str, int]]:
    """Migrate a fresh database in ``data_dir``, serve it, seed it; returns (server, driver, tenants)."""
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=server_env(data_dir),
        check=True,
    )
    server = Server(data_dir, free_port())
    server.start()
    driver = Driver(data_dir)
    return server, driver, driver("seed")

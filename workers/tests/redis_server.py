"""A redis-server of a test's own, append-only, that the test may stop and start again.

Not the shared server of ``REDIS_URL``: a test restarts only what it started.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from utilities.embedded_redis import free_port as free_port  # part of this module's API
from utilities.embedded_redis import server_binary


@dataclass
class OwnRedis:
    """One redis-server on a fixed loopback port with its append-only file in ``directory``."""

    directory: Path
    port: int = field(default_factory=free_port)
    load_delay_us: int = 0
    """Redis's own ``key-load-delay``: microseconds per key while it loads its file (a
    long ``LOADING`` phase, answered with ``BusyLoadingError``, from a small file)."""
    password: str | None = None
    """``requirepass`` (kept in a 0600 config file, never on the command line); None: none."""
    proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        """The URL of database ``db`` on this server."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 20.0) -> None:
        """Start the server and wait until it accepts connections (it may still be loading)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "redis.conf"
        conf.write_text(f'requirepass "{self.password}"\n' if self.password else "")
        conf.chmod(0o600)
        argv = [
            str(server_binary()), str(conf), "--bind", "127.0.0.1", "--port", str(self.port),
            "--dir", str(self.directory), "--appendonly", "yes", "--appendfsync", "always",
            "--save", "", "--logfile", str(self.directory / "redis.log"),
            "--key-load-delay", str(self.load_delay_us),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.listens():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} did not start: {self.log_tail()}")
            time.sleep(0.02)

    def listens(self) -> bool:
        """Whether the server accepts connections (it may still be loading its file)."""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def answers(self) -> bool:
        """Whether the server answers PING now (not while it loads its file)."""
        client = redis.Redis(port=self.port, password=self.password, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server (SIGTERM: it writes its append-only file out first)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self) -> str:
        """The end of the server's log, for failure messages."""
        path = self.directory / "redis.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def wait_loaded(self, timeout: float = 60.0) -> None:
        """Wait until the server has loaded its file and answers."""
        deadline = time.monotonic() + timeout
        while not self.answers():
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} still loading")
            time.sleep(0.05)

    def restart(self, down_s: float = 0.0) -> None:
        """Stop, stay down ``down_s`` seconds, then start again with the same data."""
        self.stop()
        time.sleep(down_s)
        self.start()

"""Services the fault tests own and restart: a Redis server and a PostgreSQL cluster.

Neither is the machine's shared server: a test restarts only what it started.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from workers.tests.redis_server import OwnRedis
from workers.tests.redis_server import free_port as free_port  # the stack's port too


@dataclass
class RedisServer(OwnRedis):
    """A redis-server of the test's own: append-only, password, fixed loopback port.

    ``restart()`` stops it (SIGTERM: the append-only file is flushed) and starts
    it again on the same port and directory, as an operator's restart would;
    ``start()`` returns once it has loaded its file and answers.
    """

    password: str | None = field(default_factory=lambda: secrets.token_hex(16))

    def start(self, timeout: float = 20.0) -> None:
        """Start the server and wait until it answers."""
        super().start(timeout)
        self.wait_loaded(timeout)


def postgres_binaries() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with initdb and pg_ctl, if any."""
    found = [
        path.parent
        for path in Path("/usr/lib/postgresql").glob("*/bin/initdb")
        if (path.parent / "pg_ctl").exists()
    ]
    if not found:
        return None
    return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)


@dataclass
class ThrowawayPostgres:
    """A PostgreSQL cluster of the test's own, made with the machine's binaries.

    PostgreSQL refuses to run as root: as root, every command runs as the
    ``postgres`` user, in a temporary directory that user owns.
    """

    binaries: Path
    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fault-pg-")))

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str) -> str:
        """A ``DATABASE_URL`` for ``database`` on this cluster."""
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *argv: str) -> None:
        command = list(argv)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}{done.stderr}{self.log_tail()}")

    def init(self) -> None:
        """Create the cluster (trust authentication on loopback only)."""
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            str(self.binaries / "initdb"), "-D", str(self.data), "-U", "postgres",
            "-A", "trust", "--no-sync", "-E", "UTF8",
        )  # fmt: skip

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            str(self.binaries / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "pg.log"),
            "-o", options, "-w", "-t", "60", "start",
        )  # fmt: skip

    def ensure_started(self) -> None:
        """Start the server unless it runs (a test that failed during an outage left it off)."""
        if not (self.data / "postmaster.pid").exists():
            self.start()

    def stop(self) -> None:
        """Stop the server (fast: open connections are cut, as in a restart by an operator)."""
        self._run(str(self.binaries / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        """Stop, then start again on the same port with the same data."""
        self.stop()
        self.start()

    def destroy(self) -> None:
        """Stop the server if it runs, and remove its files."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self) -> str:
        path = self.root / "pg.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

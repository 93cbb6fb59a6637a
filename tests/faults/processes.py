"""The processes of a running stack, found through /proc, and how a test kills them.

    runstack (pid given)
      ├── web          python -m daphne ...
      ├── worker       python -m celery -A portal worker -Q heartbeats,reports,portal ...  (its pool: same argv)
      ├── beat         python -m celery -A portal beat ...
      └── agent <node> python -m workers.agent --node <node> ...
                         └── training processes: python -m workers.elastic.worker
                             --job job-<id> --worker w<gpu> ... --step-log <dir>/...

Only direct children of runstack count as its roles (a Celery pool process has
its parent's argv), and only training processes whose step log is under the
test's own directory count as the test's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    """A live process: its id, its parent's, and its command line."""

    pid: int
    ppid: int
    argv: tuple[str, ...]

    def option(self, name: str) -> str | None:
        """The value after ``name`` on the command line, if present."""
        if name in self.argv[:-1]:
            return self.argv[self.argv.index(name) + 1]
        return None


def processes() -> list[Proc]:
    """Every live (not zombie) process that this user may read."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if not raw or fields[0] == "Z":
            continue
        argv = tuple(part.decode(errors="replace") for part in raw.rstrip(b"\0").split(b"\0"))
        out.append(Proc(int(entry.name), int(fields[1]), argv))
    return out


def role_of(proc: Proc) -> str | None:
    """The stack role a runstack child plays: web, worker, whatif-worker, beat, agent <node>."""
    argv = proc.argv
    if "daphne" in argv:
        return "web"
    if "celery" in argv and "beat" in argv:
        return "beat"
    if "celery" in argv and "worker" in argv:
        queue = proc.option("-Q") or proc.option("--queues") or "portal"
        return "worker" if "portal" in queue.split(",") else f"{queue}-worker"
    if "workers.agent" in argv:
        return f"agent {proc.option('--node')}"
    return None


def stack_roles(runstack_pid: int) -> dict[str, Proc]:
    """runstack's live children by role."""
    return {
        role: proc
        for proc in processes()
        if proc.ppid == runstack_pid and (role := role_of(proc)) is not None
    }


@dataclass(frozen=True)
class TrainingProc:
    """A training process of the test: its job's runtime name and its worker id (``w<gpu>``)."""

    pid: int
    ppid: int
    job: str
    worker: str

    @property
    def gpu(self) -> int:
        """The global index of the GPU (slot) it trains on."""
        return int(self.worker.removeprefix("w"))


def training_processes(step_dir: Path) -> list[TrainingProc]:
    """The live training processes whose step logs go under ``step_dir``.

    One per worker: the process its agent started.  A sandboxed worker is
    bubblewrap, its namespace's bubblewrap and the worker, all with the
    worker's arguments; the agent's child is the one whose parent is none of them.
    """
    mine = str(step_dir)
    out = []
    for proc in processes():
        if "workers.elastic.worker" not in proc.argv:
            continue
        step_log, job, worker = (
            proc.option("--step-log"),
            proc.option("--job"),
            proc.option("--worker"),
        )
        if step_log is None or not step_log.startswith(mine) or job is None or worker is None:
            continue
        out.append(TrainingProc(proc.pid, proc.ppid, job, worker))
    pids = {proc.pid for proc in out}
    return [proc for proc in out if proc.ppid not in pids]


def sigkill(pid: int) -> None:
    """SIGKILL ``pid`` (already gone is fine)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def wait_for_replacement(runstack_pid: int, role: str, dead_pid: int, timeout: float) -> Proc:
    """The new child that runstack started in ``role`` after ``dead_pid`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = stack_roles(runstack_pid).get(role)
        if proc is not None and proc.pid != dead_pid:
            return proc
        time.sleep(0.2)
    raise AssertionError(f"runstack did not restart its {role} within {timeout:.0f} s")

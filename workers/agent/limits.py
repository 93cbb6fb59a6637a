"""Resource limits of a tenant program's process tree, and why one ended.

Memory: ``RLIMIT_AS`` (address space) of ``SANDBOX_MEMORY_MB``, set before
exec and inherited by bubblewrap and everything below it; an allocation past
it fails (``MemoryError`` in Python, ``std::bad_alloc`` in C++).

Processes: ``SANDBOX_MAX_PROCS`` for the worker's whole tree.  The kernel does
not apply ``RLIMIT_NPROC`` to a process whose real uid is root, and the
agent usually is root, so each worker gets a cgroup v1 ``pids`` cgroup
(``<cgroup_root>/pids/portal-<...>``, ``pids.max``) that the child joins
before exec; the agent removes it after the exit.  Where that hierarchy is
not writable (the agent is not root), ``RLIMIT_NPROC`` is set instead (it
then counts all processes of the agent's uid).  Open files:
``RLIMIT_NOFILE``; core dumps: off.

Diagnosis (``exit_reason``) is a best effort from evidence the agent has
after the fact: the pids cgroup's ``pids.events`` ``max`` counter (forks
refused), and the tail of the worker's log (``MemoryError``,
``Cannot allocate memory``, ``bad_alloc`` → memory; ``BlockingIOError``,
``Resource temporarily unavailable``, ``can't start new thread`` →
processes).  A program that hits a limit and exits cleanly, or hides the
error, is not diagnosed.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Callable
from pathlib import Path

from workers.agent.config import SandboxSettings

MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "bad_alloc", "out of memory")
PROCESS_SIGNS = (
    "BlockingIOError",
    "Resource temporarily unavailable",
    "can't start new thread",
    "fork: retry",
)


def pids_hierarchy(settings: SandboxSettings) -> Path:
    """Where the cgroup v1 ``pids`` controller is mounted."""
    return settings.cgroup_root / "pids"


def create_pids_cgroup(settings: SandboxSettings, name: str) -> Path | None:
    """A fresh pids cgroup limited to ``max_procs``; None where cgroups are not writable."""
    root = pids_hierarchy(settings)
    path = root / name
    try:
        if not (root / "cgroup.procs").exists():
            return None
        if path.exists():
            remove_cgroup(path)
        path.mkdir()
        (path / "pids.max").write_text(str(settings.max_procs))
    except OSError:
        remove_cgroup(path)
        return None
    return path


def remove_cgroup(path: Path | str) -> None:
    """Remove a (now empty) cgroup; a no-op if it is gone or still busy."""
    with contextlib.suppress(OSError):
        os.rmdir(path)


def members(path: Path | str | None) -> list[int]:
    """The processes in a cgroup (none if there is no cgroup)."""
    if path is None:
        return []
    try:
        return [int(pid) for pid in (Path(path) / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def processes_refused(path: Path | str | None) -> bool:
    """Whether the pids cgroup refused a fork (``pids.events``: ``max N`` with N > 0)."""
    if path is None:
        return False
    try:
        for line in (Path(path) / "pids.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "max" and int(value) > 0:
                return True
    except (OSError, ValueError):
        return False
    return False


def preexec(settings: SandboxSettings, cgroup: Path | None) -> Callable[[], None]:
    """What the child runs between fork and exec: join the cgroup, set the rlimits.

    Runs in the forked child: no locks, no logging, only system calls.
    """
    memory = settings.memory_mb * 1024 * 1024
    procs_file = str(cgroup / "cgroup.procs") if cgroup is not None else None

    def apply() -> None:
        if procs_file is not None:
            with open(procs_file, "w") as f:
                f.write(str(os.getpid()))
        else:
            resource.setrlimit(resource.RLIMIT_NPROC, (settings.max_procs, settings.max_procs))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        files = settings.max_open_files
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def exit_reason(
    settings: SandboxSettings, code: int | None, log_tail: str, cgroup: str | None
) -> str:
    """Which sandbox limit ended a process, from the evidence at hand ("" if none)."""
    if code == 0:
        return ""
    if processes_refused(cgroup) or any(sign in log_tail for sign in PROCESS_SIGNS):
        return f"process limit reached (SANDBOX_MAX_PROCS={settings.max_procs})"
    if any(sign in log_tail for sign in MEMORY_SIGNS):
        return f"memory limit reached (SANDBOX_MEMORY_MB={settings.memory_mb})"
    return ""


def descendants(pid: int) -> list[int]:
    """``pid``'s descendants, parents first (from ``/proc/<pid>/task/*/children``)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop(0)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                text = Path(f"/proc/{current}/task/{task}/children").read_text()
            except OSError:
                continue
            for child in text.split():
                out.append(int(child))
                todo.append(int(child))
    return out


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot); None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    # After the command name: state is field 3 of stat(5), starttime field 22.
    return int(fields[19])

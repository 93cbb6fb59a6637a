"""Resource limits of a tenant program's process tree, and why one ended.

Each worker gets cgroups named ``portal-<node>-<job>-<worker>-<generation>``: on a
cgroup v2 host (``<cgroup_root>/cgroup.controllers`` offers memory and pids)
one, ``<cgroup_root>/portal-sandbox/<name>``, with ``memory.max``,
``memory.swap.max`` 0, ``pids.max`` and ``cpu.weight`` (an equal CPU share per
slot); else cgroup v1 ones under ``<cgroup_root>/pids`` and
``<cgroup_root>/memory``, where those hierarchies are mounted and writable
(the agent is root).  The child joins them before exec, and the agent removes
them after the exit.

Memory, ``SANDBOX_MEMORY_MB``: the memory cgroup's ``memory.limit_in_bytes``
(the kernel's OOM killer ends the tree past it), and on CPU nodes also
``RLIMIT_AS`` (address space), set before exec and inherited through
bubblewrap, so an allocation past it fails cleanly (``MemoryError`` in
Python, ``std::bad_alloc`` in C++).  Not on GPU nodes: CUDA reserves far
more address space than it uses.

Processes, ``SANDBOX_MAX_PROCS`` for the worker's whole tree: the ``pids``
cgroup's ``pids.max``.  The kernel does not apply ``RLIMIT_NPROC`` to a
process whose real uid is root, and the agent usually is root; where the
cgroup is not writable (the agent is not root), ``RLIMIT_NPROC`` is set
instead (it then counts all processes of the agent's uid).  Open files:
``RLIMIT_NOFILE``; core dumps: off; one file's size: ``RLIMIT_FSIZE``, the
job's scratch quota (``workers.agent.quota``).

Diagnosis (``exit_reason``) is a best effort from evidence the agent has
after the fact, for a non-zero exit: the pids cgroup's ``pids.events``
``max`` counter (forks refused), the memory cgroup's ``oom_kill`` counter,
and the tail of the worker's log (``MemoryError``, ``Cannot allocate
memory``, ``bad_alloc`` → memory; ``BlockingIOError``, ``Resource
temporarily unavailable``, ``can't start new thread`` → processes; ``File
too large`` or death by ``SIGXFSZ`` → one file's size).  A
program that hits a limit and exits cleanly is not diagnosed; one that
merely prints those words on its way to another failure is misdiagnosed.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
from collections.abc import Callable, Iterable
from pathlib import Path

from workers.agent.config import SandboxSettings

MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "bad_alloc", "out of memory")
PROCESS_SIGNS = (
    "BlockingIOError",
    "Resource temporarily unavailable",
    "can't start new thread",
    "fork: retry",
)

FILE_SIZE_SIGNS = ("File too large",)
"""What a write past ``RLIMIT_FSIZE`` prints (``EFBIG``; Python ignores ``SIGXFSZ``)."""
FILE_SIZE_CODES = (-signal.SIGXFSZ, 128 + signal.SIGXFSZ)
"""A process killed by ``SIGXFSZ``: as Python reports it, and as bubblewrap passes it on."""


CONTROLLERS: tuple[str, ...] = ("pids", "memory")
"""The cgroup v1 controllers a worker gets a cgroup in, where they are writable."""


def cgroup_paths(settings: SandboxSettings, name: str) -> dict[str, Path]:
    """Where a worker's cgroups are, per controller (``<cgroup_root>/<controller>/<name>``)."""
    return {controller: settings.cgroup_root / controller / name for controller in CONTROLLERS}


UNIFIED = "unified"
"""The key of a worker's one cgroup on a cgroup v2 host (``create_cgroups``)."""
V2_PARENT = "portal-sandbox"
"""The cgroup v2 directory, below ``cgroup_root``, that holds the workers' cgroups."""
V2_CONTROLLERS: tuple[str, ...] = ("memory", "pids", "cpu")


def is_cgroup_v2(root: Path) -> bool:
    """Whether ``root`` is a cgroup v2 hierarchy offering memory and pids (a v2-only host)."""
    try:
        offered = (root / "cgroup.controllers").read_text().split()
    except OSError:
        return False
    return {"memory", "pids"} <= set(offered)


def v2_limits(settings: SandboxSettings) -> dict[str, str]:
    """A worker's cgroup v2 files: memory (no swap past it), processes, an equal CPU share."""
    return {
        "memory.max": str(settings.memory_mb * 1024 * 1024),
        "memory.swap.max": "0",
        "pids.max": str(settings.max_procs),
        "cpu.weight": "100",
    }


def create_v2_cgroup(settings: SandboxSettings, name: str) -> dict[str, Path]:
    """One cgroup v2 for a worker, ``<cgroup_root>/portal-sandbox/<name>``, its limits set.

    The controllers are enabled for the children of the root and of
    ``portal-sandbox`` (which holds no process: cgroup v2's rule); a file the
    kernel does not offer (``memory.swap.max`` without swap) is skipped.
    """
    parent = settings.cgroup_root / V2_PARENT
    path = parent / name
    try:
        parent.mkdir(exist_ok=True)
        enable = " ".join(f"+{c}" for c in V2_CONTROLLERS)
        for holder in (settings.cgroup_root, parent):
            (holder / "cgroup.subtree_control").write_text(enable)
        if path.exists():
            remove_cgroup(path)
        path.mkdir()
        for file, value in v2_limits(settings).items():
            if file == "memory.swap.max" and not (path / file).exists():
                continue
            (path / file).write_text(value)
    except OSError:
        remove_cgroup(path)
        return {}
    return {UNIFIED: path}


def create_cgroups(settings: SandboxSettings, name: str) -> dict[str, Path]:
    """Fresh cgroups for one worker: memory and process limits set.

    On a cgroup v2 host one cgroup (``create_v2_cgroup``, key ``unified``);
    else a cgroup v1 per controller (``pids.max``, ``memory.limit_in_bytes``),
    only those whose hierarchy is mounted and writable here.  An empty answer
    means: no cgroups (the agent is not root), rlimits only.
    """
    if is_cgroup_v2(settings.cgroup_root):
        return create_v2_cgroup(settings, name)
    limits = {
        "pids": {"pids.max": str(settings.max_procs)},
        "memory": {"memory.limit_in_bytes": str(settings.memory_mb * 1024 * 1024)},
    }
    made: dict[str, Path] = {}
    for controller, path in cgroup_paths(settings, name).items():
        try:
            if not (path.parent / "cgroup.procs").exists():
                continue
            if path.exists():
                remove_cgroup(path)
            path.mkdir()
            for file, value in limits[controller].items():
                (path / file).write_text(value)
        except OSError:
            remove_cgroup(path)
            continue
        made[controller] = path
    return made


def remove_cgroup(path: Path | str) -> None:
    """Remove a (now empty) cgroup; a no-op if it is gone or still busy."""
    with contextlib.suppress(OSError):
        os.rmdir(path)


def members(paths: Iterable[Path]) -> list[int]:
    """The processes in these cgroups."""
    out: set[int] = set()
    for path in paths:
        with contextlib.suppress(OSError, ValueError):
            out.update(int(pid) for pid in (path / "cgroup.procs").read_text().split())
    return sorted(out)


def _counter(path: Path, key: str) -> int:
    """A ``key value`` line of a cgroup file (0 if there is none)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return 0
    return 0


def processes_refused(paths: dict[str, Path]) -> bool:
    """Whether the pids cgroup refused a fork (``pids.events``: ``max N`` with N > 0)."""
    pids = paths.get("pids") or paths.get(UNIFIED)
    return pids is not None and _counter(pids / "pids.events", "max") > 0


def memory_killed(paths: dict[str, Path]) -> bool:
    """Whether the OOM killer struck in the memory cgroup (v1 ``memory.oom_control``,
    v2 ``memory.events``: ``oom_kill N`` with N > 0)."""
    if UNIFIED in paths:
        return _counter(paths[UNIFIED] / "memory.events", "oom_kill") > 0
    memory = paths.get("memory")
    return memory is not None and _counter(memory / "memory.oom_control", "oom_kill") > 0


def preexec(
    settings: SandboxSettings, cgroups: dict[str, Path], *, address_space: bool = True
) -> Callable[[], None]:
    """What the child runs between fork and exec: join the cgroups, set the rlimits.

    ``address_space`` False leaves RLIMIT_AS off (CUDA reserves far more
    address space than memory; the memory cgroup limits a GPU worker).
    Runs in the forked child: no locks, no logging, only system calls.
    """
    memory = settings.memory_mb * 1024 * 1024
    file_size = settings.quota.disk_bytes
    procs_files = [str(path / "cgroup.procs") for path in cgroups.values()]
    nproc = "pids" not in cgroups and UNIFIED not in cgroups

    def apply() -> None:
        for procs_file in procs_files:
            with open(procs_file, "w") as f:
                f.write(str(os.getpid()))
        if nproc:
            resource.setrlimit(resource.RLIMIT_NPROC, (settings.max_procs, settings.max_procs))
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        files = settings.max_open_files
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    return apply


def exit_reason(
    settings: SandboxSettings, code: int | None, log_tail: str, cgroups: dict[str, Path]
) -> str:
    """Which sandbox limit ended a process, from the evidence at hand ("" if none)."""
    if code == 0:
        return ""
    if processes_refused(cgroups) or any(sign in log_tail for sign in PROCESS_SIGNS):
        return f"process limit reached (SANDBOX_MAX_PROCS={settings.max_procs})"
    if memory_killed(cgroups) or any(sign in log_tail for sign in MEMORY_SIGNS):
        return f"memory limit reached (SANDBOX_MEMORY_MB={settings.memory_mb})"
    if code in FILE_SIZE_CODES or any(sign in log_tail for sign in FILE_SIZE_SIGNS):
        return (
            "file size limit reached: one file may not exceed the job's scratch quota "
            f"(SANDBOX_SCRATCH_MB={settings.quota.disk_bytes // 2**20})"
        )
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

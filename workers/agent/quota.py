"""A job's files on a node, held to a quota: its disk and its shared memory.

A job's programs write below three places of a node: ``<data_dir>/jobs/<job>``
(scratch and HOME, node-local checkpoints, artifacts), their output in
``<data_dir>/logs/agent-<node>/<job>``, and their shared ``/dev/shm``
(``/dev/shm/portal-<node>-<job>``, memory).  No kernel mechanism bounds a
directory on an ordinary filesystem (project quotas need XFS, or ext4 mounted
with ``prjquota``, which a node may not have), so the agent measures them
every ``every_s`` and stops a job over its quota, reporting why:

- ``disk_bytes``: the blocks the job's directory and logs hold on the disk
  (``SANDBOX_SCRATCH_MB``; sparse files count what they hold, not their size);
- ``entries``: files and directories in them (``SANDBOX_SCRATCH_FILES``: a
  million empty files fill a filesystem's inodes, not its blocks);
- ``shm_bytes``: what its shared memory holds (``SANDBOX_SHM_MB``).

Between two measurements a program can write at the disk's rate; each one
file is bounded at once by ``RLIMIT_FSIZE`` = the disk quota
(``limits.preexec``: past it a write fails with ``EFBIG``, "File too large").
The walk never follows a link (tenant code made these directories), counts an
inode with several names once, and stops as soon as a limit is passed, so a
job with millions of files costs the agent at most ``entries`` steps.

``measure`` is the adapter (it reads the filesystem); ``verdict`` is pure.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MIB = 2**20


@dataclass(frozen=True)
class Quota:
    """What one job may hold on one node (``SANDBOX_SCRATCH_MB``, ``SANDBOX_SCRATCH_FILES``,
    ``SANDBOX_SHM_MB``), measured every ``every_s`` (``SANDBOX_QUOTA_EVERY_SECONDS``)."""

    disk_bytes: int = 100 * 2**30
    entries: int = 500_000
    shm_bytes: int = 8 * 2**30
    every_s: float = 15.0


@dataclass(frozen=True)
class Usage:
    """What a walk found: bytes held (allocated blocks) and entries seen.

    ``complete`` is False when the walk stopped early, past a limit: the
    figures are then lower bounds, already over it.
    """

    bytes: int = 0
    entries: int = 0
    complete: bool = True


def measure(roots: Iterable[Path], *, max_bytes: int, max_entries: int) -> Usage:
    """Bytes and entries below ``roots`` (a root that does not exist holds nothing).

    Never follows a link; an inode with several names counts once; stops once
    past ``max_bytes`` or ``max_entries``.
    """
    held, entries = 0, 0
    seen: set[tuple[int, int]] = set()
    todo = [str(root) for root in roots]
    while todo:
        try:
            listing = os.scandir(todo.pop())
        except OSError:  # gone (the job ended), or not a directory
            continue
        with listing:
            for entry in listing:
                entries += 1
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    todo.append(entry.path)
                elif info.st_nlink > 1:
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                held += info.st_blocks * 512
                if held > max_bytes or entries > max_entries:
                    return Usage(held, entries, complete=False)
    return Usage(held, entries)


def verdict(job: str, node: str, disk: Usage, shm: Usage, quota: Quota) -> str | None:
    """Why ``job`` must stop on ``node``, or None when it is within its quota."""
    where = f"job {job} on node {node}"
    if disk.bytes > quota.disk_bytes:
        return (
            f"{where} holds {_size(disk)} in its node-local files (scratch, checkpoints, "
            f"artifacts, output), over its quota of {quota.disk_bytes // MIB} MiB "
            f"(SANDBOX_SCRATCH_MB): stopped"
        )
    if disk.entries > quota.entries:
        return (
            f"{where} made {'over ' if not disk.complete else ''}{disk.entries} files and "
            f"directories, over its quota of {quota.entries} (SANDBOX_SCRATCH_FILES): stopped"
        )
    if shm.bytes > quota.shm_bytes:
        return (
            f"{where} holds {_size(shm)} in its shared memory (/dev/shm), over its quota of "
            f"{quota.shm_bytes // MIB} MiB (SANDBOX_SHM_MB): stopped"
        )
    return None


def _size(usage: Usage) -> str:
    figure = f"{usage.bytes / MIB:.1f} MiB"
    return figure if usage.complete else f"over {figure}"

"""Cleaning a node: ended jobs' directories and logs, and unused code bundles, go.

A node keeps, per job that ran here, ``<data_dir>/jobs/<job>`` (scratch,
node-local checkpoints and artifacts) and ``<data_dir>/logs/agent-<node>/<job>``
(its workers' output), and one unpacked directory per code bundle under
``<data_dir>/code``.  Without cleaning they fill the disk.  The rule
(``doomed``, pure):

1. Never what is in use: a job with a process on this node or a stop under
   way, a bundle that a running process was started from.
2. Never a log the shipper has not sent to the control plane up to its end
   (``LogShipper``'s saved offset): no output is lost.
3. Anything else older than ``keep_s`` (by the newest modification time in
   it) goes; a job's shared memory (``/dev/shm/portal-<node>-<job>``, normally
   removed when its last process here ends) goes at once: it holds memory.
4. If what remains is still over ``max_bytes`` in all, the least recently
   modified of the rest go first, until it fits (in-use ones count but stay).

The adapters: ``scan`` measures the directories (never following a link: a
job's directories were written by tenant code), ``remove`` removes what the
rule names and deletes the removed logs' saved offsets.  The agent runs them
every ``every_s`` (``Agent.clean``), the removal under its lock, so that no
job starts here between the rule and the removal.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

Kind = Literal["job", "log", "code", "shm"]


@dataclass(frozen=True)
class CleanupSettings:
    """How long ended jobs' node directories stay, and how much they may hold in all.

    ``AGENT_KEEP_ENDED_HOURS`` (default 24), ``AGENT_NODE_DIRS_MAX_GB``
    (default 100), ``AGENT_CLEAN_EVERY_SECONDS`` (default 600).
    """

    keep_s: float = 24 * 3600.0
    max_bytes: int = 100 * 2**30
    every_s: float = 600.0


@dataclass(frozen=True)
class Leftover:
    """One directory the node may remove: a job's files, a job's logs, or a bundle."""

    kind: Kind
    name: str
    """The job id (``job``, ``log``) or the bundle id (``code``)."""
    path: Path
    size: int
    modified: float
    """The newest modification time of anything in it."""
    shipped: bool = True
    """For a log: whether every byte of it reached the control plane."""


def doomed(
    leftovers: Iterable[Leftover],
    *,
    now: float,
    settings: CleanupSettings,
    busy_jobs: frozenset[str],
    busy_codes: frozenset[str],
) -> list[Leftover]:
    """Which leftovers to remove, by the module's rule (oldest first)."""
    every = sorted(leftovers, key=lambda item: (item.modified, item.kind, item.name))

    def removable(item: Leftover) -> bool:
        busy = busy_codes if item.kind == "code" else busy_jobs
        return item.name not in busy and item.shipped

    def expired(item: Leftover) -> bool:
        return item.kind == "shm" or now - item.modified > settings.keep_s

    out = [item for item in every if removable(item) and expired(item)]
    total = sum(item.size for item in every) - sum(item.size for item in out)
    for item in every:
        if total <= settings.max_bytes:
            break
        if removable(item) and item not in out:
            out.append(item)
            total -= item.size
    return out


def measure(path: Path) -> tuple[int, float]:
    """(bytes, newest modification time) of everything below ``path``, links not followed."""
    size, newest = 0, path.lstat().st_mtime
    for current, dirs, files in os.walk(path, followlinks=False):
        for name in (*dirs, *files):
            try:
                info = os.lstat(os.path.join(current, name))
            except OSError:
                continue
            newest = max(newest, info.st_mtime)
            if stat.S_ISREG(info.st_mode):
                size += info.st_size
    return size, newest


Shipped = Callable[[str, Path], bool]
"""Whether the log directory of a job (its id, its path) was shipped to its end."""


def scan(data_dir: Path, node: str, shipped: Shipped, shm_root: Path) -> list[Leftover]:
    """Every job directory, job log directory, bundle and job shared memory of this node."""
    roots: tuple[tuple[Kind, Path, str], ...] = (
        ("job", data_dir / "jobs", ""),
        ("log", data_dir / "logs" / f"agent-{node}", ""),
        ("code", data_dir / "code", ""),
        ("shm", shm_root, f"portal-{node}-"),
    )
    out = []
    for kind, root, prefix in roots:
        try:
            entries = sorted(os.scandir(root), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False) or entry.name.startswith("."):
                continue  # a bundle being unpacked is a dot-directory, its lock a file
            if not entry.name.startswith(prefix):
                continue
            name, path = entry.name.removeprefix(prefix), Path(entry.path)
            try:
                size, modified = measure(path)
            except OSError:
                continue
            done = shipped(name, path) if kind == "log" else True
            out.append(Leftover(kind, name, path, size, modified, done))
    return out


def remove(
    items: Iterable[Leftover], *, now: float, forget_log: Callable[[str, str], None]
) -> list[Leftover]:
    """Remove ``items`` (``doomed``'s answer); ``forget_log(job, worker)`` drops a removed
    log's saved offset.  What cannot be removed is logged and left for the next sweep."""
    removed = []
    for item in items:
        workers = [p.stem for p in item.path.glob("*.log")] if item.kind == "log" else []
        try:
            shutil.rmtree(item.path)  # fd-based on Linux: links inside are removed, not followed
        except OSError as exc:
            log.warning("could not remove %s %s (%s): %s", item.kind, item.name, item.path, exc)
            continue
        for worker in workers:
            forget_log(item.name, worker)
        removed.append(item)
        log.info(
            "removed %s %s from this node (%d bytes, last modified %.0f s ago)",
            item.kind,
            item.name,
            item.size,
            now - item.modified,
        )
    return removed

"""Keeping a torchrun job's node-local ``CHECKPOINT_DIR`` and its store prefix in step.

A torchrun program knows nothing of the store: it writes checkpoints into
``<data_dir>/jobs/<job>/checkpoints`` on its node, as the job's unprivileged
uid.  A resize stops the job and starts it again, maybe on other nodes, so
the agent mirrors that directory to ``<job prefix>/checkpoints`` and back::

    start on a node      pull:  <prefix>/checkpoints/<rel>  ->  CHECKPOINT_DIR/<rel>
    while it runs        push every MirrorLimits.every_s (settled files only)
    when it stops        final push (everything), then the agent reports it stopped
                         push:  CHECKPOINT_DIR/<rel>  ->  <prefix>/checkpoints/<rel>

Trust: the directory is written by tenant code and the agent runs as root,
so nothing in it is trusted.  It is walked and every file opened by
descriptors that never follow a link (``workers.beneath``); only regular
files count (links, FIFOs, sockets are skipped, with why), each checked on
its open descriptor to be the file of the size that was listed, and read no
further than that size (a file that grows cannot pass the byte limit).
Pulling writes each file under a temporary name, owned by the job's uid
(``fchown`` on the descriptor, before it has a name the program could
touch), and renames it into place inside a folder opened by descriptor: a
link planted at that name is replaced, never written through; a link or a
file planted in place of a folder is unlinked and the folder made.  Names
must pass ``workers.outputs.check_job_path``; ``MirrorLimits`` bound how many
files and bytes one job mirrors.  The store's prefix is tenant-written too
where it is a directory: a link on the way refuses the upload, and the file
is skipped.

Deleting: a job spans several nodes and usually only one writes, so a
``Pusher`` deletes from the store only the objects it uploaded itself (or
pulled: its node holds them as well) whose local files are gone (the
program rotated them).  Another node's objects are never deleted.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from workers import beneath
from workers.artifacts import ArtifactStore, at_most
from workers.beneath import LinkRefused
from workers.clock import SYSTEM_CLOCK, Clock
from workers.outputs import OutputError, check_job_path

log = logging.getLogger(__name__)

FOLDER = "checkpoints"
"""The folder under a job's prefix that mirrors ``CHECKPOINT_DIR``."""

NOT_SETTLED = "modified too recently: uploaded once it settles"
"""Why a file is left for a later push (not worth a warning: it is expected)."""

Owner = tuple[int, int] | None
"""(uid, gid) the files and folders a pull makes belong to; None: the agent's own."""

Seen = Mapping[str, tuple[int, int]]
"""Relative path -> (size, mtime_ns) of the local files that match the store."""

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class MirrorLimits:
    """How much one job mirrors per node, and when.

    ``settle_s``: a file modified less than this long ago is not pushed yet
    (the program may still be writing it), except by the final push;
    ``every_s``: the period of the background pushes.
    """

    max_files: int = 1000
    max_bytes: int = 100 * 2**30
    settle_s: float = 2.0
    every_s: float = 30.0


def read_limits(env: Mapping[str, str]) -> MirrorLimits:
    """``MirrorLimits`` from ``MIRROR_MAX_FILES``, ``MIRROR_MAX_BYTES``,
    ``MIRROR_SETTLE_SECONDS`` (may be 0) and ``MIRROR_EVERY_SECONDS``; unset or
    empty: the default.  A bad value raises ``ValueError`` naming the variable."""
    default = MirrorLimits()
    return MirrorLimits(
        max_files=int(_number(env, "MIRROR_MAX_FILES", default.max_files, integer=True)),
        max_bytes=int(_number(env, "MIRROR_MAX_BYTES", default.max_bytes, integer=True)),
        settle_s=_number(env, "MIRROR_SETTLE_SECONDS", default.settle_s, zero=True),
        every_s=_number(env, "MIRROR_EVERY_SECONDS", default.every_s),
    )


def _number(
    env: Mapping[str, str], name: str, default: float, *, integer: bool = False, zero: bool = False
) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(int(raw)) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise ValueError(f"{name} must be {kind}, not {raw!r}") from None
    if not (value >= 0 if zero else value > 0) or not math.isfinite(value):
        raise ValueError(f"{name} must be {'zero or ' if zero else ''}positive, not {raw!r}")
    return value


# -- pull -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pulled:
    """What a pull wrote (relative paths), left out (with why), and the local files it
    found matching the store afterwards (to seed the ``Pusher``)."""

    written: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    seen: tuple[tuple[str, tuple[int, int]], ...]


@dataclass
class _PullRound:
    """One pull's running counts and results."""

    files: int = 0
    total: int = 0
    written: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seen: dict[str, tuple[int, int]] = field(default_factory=dict)


def pull(store: ArtifactStore, directory: Path, limits: MirrorLimits, owner: Owner) -> Pulled:
    """Copy the objects under ``checkpoints/`` of the job's ``store`` into ``directory``.

    A local regular file of the object's size is left alone; anything else
    at that name (a link, a FIFO, an older file) is replaced by a rename.
    """
    try:
        names = store.list(FOLDER)
    except (OSError, ValueError) as exc:
        return Pulled((), ((FOLDER, f"could not list the store: {exc}"),), ())
    work = _PullRound()
    with _local(directory, create=True, owner=owner) as top:
        for name in names:
            rel = name.removeprefix(f"{FOLDER}/")
            try:
                why = _name_refusal(rel) or _pull_one(store, top, rel, limits, owner, work)
            except (OSError, ValueError) as exc:  # the store or the folder refused: skip, go on
                why = f"could not pull: {exc}"
            if why:
                work.skipped.append((rel, why))
    for rel, why in work.skipped:
        log.warning("checkpoint %s not pulled: %s", rel, why)
    return Pulled(tuple(work.written), tuple(work.skipped), tuple(sorted(work.seen.items())))


def _pull_one(
    store: ArtifactStore, top: int, rel: str, limits: MirrorLimits, owner: Owner, work: _PullRound
) -> str | None:
    """Why ``rel`` was left out; None when it was written or was already there."""
    stream, size = store.open_sized(f"{FOLDER}/{rel}")
    with stream:
        if work.files >= limits.max_files:
            return f"more than {limits.max_files} files"
        if work.total + size > limits.max_bytes:
            return f"over the {limits.max_bytes}-byte limit"
        work.files += 1
        work.total += size
        *folders, name = rel.split("/")
        with _folder(top, folders, owner) as parent:
            present = _regular_state(parent, name)
            if present is not None and present[0] == size:
                work.seen[rel] = present
                return None
            work.seen[rel] = _write_owned(parent, name, at_most(stream, size), owner)
            work.written.append(rel)
    return None


def _regular_state(parent: int, name: str) -> tuple[int, int] | None:
    """(size, mtime_ns) of ``name`` in ``parent`` if it is a regular file itself."""
    try:
        info = os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        return None
    return (info.st_size, info.st_mtime_ns) if beneath.is_regular(parent, name) else None


@contextmanager
def _folder(top: int, parts: list[str], owner: Owner) -> Iterator[int]:
    """``top/parts...`` opened without following a link; what is missing (or is a link
    or a file where a folder belongs) is made, owned by ``owner``."""
    current = os.dup(top)
    try:
        for name in parts:
            child = _child_folder(current, name, owner)
            os.close(current)
            current = child
        yield current
    finally:
        os.close(current)


def _child_folder(parent: int, name: str, owner: Owner) -> int:
    try:
        return beneath.open_directory_below(parent, [name])
    except FileNotFoundError:
        pass
    except (LinkRefused, NotADirectoryError):  # planted in place of a folder: unlinked
        beneath.remove_entry(parent, name)
    with suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=parent)
    made = beneath.open_directory_below(parent, [name])
    if owner is not None:
        os.fchown(made, *owner)
    return made


def _write_owned(parent: int, name: str, chunks: Iterator[bytes], owner: Owner) -> tuple[int, int]:
    """Write ``name`` in ``parent`` through a temporary file chowned before it is
    filled, renamed into place; its (size, mtime_ns)."""
    temporary = f".{name}.{uuid.uuid4().hex}.part"
    descriptor = os.open(temporary, _CREATE_FLAGS, 0o644, dir_fd=parent)
    try:
        with os.fdopen(descriptor, "wb") as out:
            if owner is not None:
                os.fchown(out.fileno(), *owner)
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
            info = os.fstat(out.fileno())
        os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=parent)
        raise
    return info.st_size, info.st_mtime_ns


# -- push -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pushed:
    """What one push uploaded and deleted (relative paths) and left out, with why."""

    stored: tuple[str, ...]
    deleted: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]


@dataclass
class _Round:
    """One push's running counts and results."""

    files: int = 0
    total: int = 0
    stored: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


class Pusher:
    """Uploads one job's local checkpoints on one node; remembers what it uploaded."""

    def __init__(self, limits: MirrorLimits, seen: Seen | None = None) -> None:
        self._limits = limits
        self._uploaded: dict[str, tuple[int, int]] = dict(seen or {})

    @property
    def uploaded(self) -> dict[str, tuple[int, int]]:
        """Relative path -> (size, mtime_ns) of the files this pusher holds in the store."""
        return dict(self._uploaded)

    def push(
        self, store: ArtifactStore, directory: Path, now: float, final: bool = False
    ) -> Pushed:
        """Upload new or changed settled files (all of them when ``final``) to
        ``checkpoints/<rel>``; delete what this pusher uploaded whose file is gone.

        A directory that cannot be walked whole deletes nothing.
        """
        work = _Round()
        try:
            with _local(directory, create=False, owner=None) as top:
                listed = list(beneath.regular_files(top))
                for rel, _size in listed:
                    self._consider(store, top, rel, now, final, work)
        except OSError as exc:
            work.skipped.append((".", f"could not walk {directory}: {exc}"))
            return _pushed(work)
        self._rotate(store, {rel for rel, _size in listed}, work)
        return _pushed(work)

    def _consider(
        self, store: ArtifactStore, top: int, rel: str, now: float, final: bool, work: _Round
    ) -> None:
        why = _name_refusal(rel)
        if why is not None:
            work.skipped.append((rel, why))
            return
        try:
            source = os.fdopen(beneath.open_regular(top, rel.split("/")), "rb")
        except OSError as exc:  # swapped for a link or a FIFO, or gone, since it was listed
            work.skipped.append((rel, f"not opened: {exc}"))
            return
        with source:
            why = self._upload(store, rel, source, now, final, work)
        if why:
            work.skipped.append((rel, why))

    def _upload(
        self,
        store: ArtifactStore,
        rel: str,
        source: IO[bytes],
        now: float,
        final: bool,
        work: _Round,
    ) -> str | None:
        """Why ``rel`` (open as ``source``) was not counted or uploaded; None when it was."""
        info = os.fstat(source.fileno())
        state = (info.st_size, info.st_mtime_ns)
        if work.files >= self._limits.max_files:
            return f"more than {self._limits.max_files} files"
        if work.total + info.st_size > self._limits.max_bytes:
            return f"over the {self._limits.max_bytes}-byte limit"
        work.files += 1
        work.total += info.st_size
        if self._uploaded.get(rel) == state:
            return None
        if not final and now - info.st_mtime_ns / 1e9 < self._limits.settle_s:
            return NOT_SETTLED
        try:
            store.put_stream(f"{FOLDER}/{rel}", at_most(source, info.st_size))
        except (OSError, ValueError) as exc:  # a link in the store, or the store failed
            return f"could not upload: {exc}"
        self._uploaded[rel] = state
        work.stored.append(rel)
        return None

    def _rotate(self, store: ArtifactStore, present: set[str], work: _Round) -> None:
        """Delete the objects this pusher uploaded whose local files are gone."""
        for rel in sorted(set(self._uploaded) - present):
            try:
                store.delete(f"{FOLDER}/{rel}")
            except (OSError, ValueError) as exc:
                work.skipped.append((rel, f"could not delete: {exc}"))
                continue
            del self._uploaded[rel]
            work.deleted.append(rel)


def _pushed(work: _Round) -> Pushed:
    return Pushed(tuple(work.stored), tuple(work.deleted), tuple(work.skipped))


# -- shared -----------------------------------------------------------------------------


def _name_refusal(rel: str) -> str | None:
    """Why ``rel`` may not be mirrored (a bad name, a pull's temporary file); None if it may."""
    if rel.rpartition("/")[2].endswith(".part") and rel.rpartition("/")[2].startswith("."):
        return "a temporary file"
    try:
        check_job_path(f"{FOLDER}/{rel}")
    except OutputError as exc:
        return str(exc)
    return None


@contextmanager
def _local(directory: Path, *, create: bool, owner: Owner) -> Iterator[int]:
    """``directory`` opened by descriptor: its parent (the agent's) as given, the
    directory itself never through a link; made, owned by ``owner``, if ``create``."""
    with beneath.directory(str(directory.parent), create=create) as parent:
        if create:
            folder = _child_folder(parent, directory.name, owner)
        else:
            folder = beneath.open_directory_below(parent, [directory.name])
    try:
        yield folder
    finally:
        os.close(folder)


# -- the agent's adapter ----------------------------------------------------------------


@dataclass
class _Job:
    """One job's mirroring on this node: its pusher, its thread, and how to stop it."""

    directory: Path
    store_factory: Callable[[], ArtifactStore]
    pusher: Pusher
    store: ArtifactStore | None
    stop: threading.Event = field(default_factory=threading.Event)
    final: bool = False
    thread: threading.Thread | None = None


class CheckpointMirror:
    """Mirrors the checkpoint directories of this node's torchrun jobs (one thread each).

    Store errors are logged, never raised: the program's own run does not
    depend on the mirror, only a restart elsewhere does.
    """

    def __init__(self, limits: MirrorLimits, clock: Clock = SYSTEM_CLOCK) -> None:
        self._limits = limits
        self._clock = clock
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()

    def begin(
        self,
        job: str,
        store_factory: Callable[[], ArtifactStore],
        directory: Path,
        owner: Owner,
    ) -> None:
        """Pull ``job``'s checkpoints into ``directory`` (before its program starts),
        then push every ``every_s`` until ``finish``.  A job still mirrored from an
        earlier start is finished first (its final push done), so the pull sees it."""
        with self._lock:
            earlier = self._jobs.get(job)
        if earlier is not None:
            self.finish(job)
            if earlier.thread is not None:
                earlier.thread.join()
        store = _made(store_factory)
        seen: Seen = {}
        if store is not None:
            try:
                seen = dict(pull(store, directory, self._limits, owner).seen)
            except Exception:  # never into the agent: the program starts without them
                log.exception("checkpoints of %s not pulled", job)
        entry = _Job(directory, store_factory, Pusher(self._limits, seen), store)
        entry.thread = threading.Thread(
            target=self._run, args=(job, entry), name=f"mirror-{job}", daemon=True
        )
        with self._lock:
            self._jobs[job] = entry
        entry.thread.start()

    def finish(self, job: str) -> None:
        """Stop ``job``'s periodic pushes; a final push (everything) runs in its thread,
        and the job is forgotten once it is done (``busy`` says when)."""
        with self._lock:
            entry = self._jobs.get(job)
        if entry is not None:
            entry.final = True
            entry.stop.set()

    def mirrors(self, job: str) -> bool:
        """Whether ``job``'s directory is mirrored here (pushing, or its final push)."""
        with self._lock:
            return job in self._jobs

    def jobs(self) -> set[str]:
        """The jobs mirrored here (their directories must stay)."""
        with self._lock:
            return set(self._jobs)

    def busy(self, job: str) -> bool:
        """Whether ``job``'s final push is still running (it was finished, not forgotten)."""
        with self._lock:
            entry = self._jobs.get(job)
        return entry is not None and entry.final

    def close(self, timeout: float | None = None) -> None:
        """Stop every job's periodic pushes (final pushes already asked for still run)
        and wait up to ``timeout`` for the threads."""
        with self._lock:
            entries = list(self._jobs.values())
        for entry in entries:
            entry.stop.set()
        for entry in entries:
            if entry.thread is not None:
                entry.thread.join(timeout)

    def _run(self, job: str, entry: _Job) -> None:
        while not entry.stop.wait(self._limits.every_s):
            self._push(job, entry, final=False)
        if entry.final:
            self._push(job, entry, final=True)
        with self._lock:
            if self._jobs.get(job) is entry:
                del self._jobs[job]

    def _push(self, job: str, entry: _Job, *, final: bool) -> None:
        if entry.store is None:
            entry.store = _made(entry.store_factory)
        if entry.store is None:
            return
        try:
            pushed = entry.pusher.push(entry.store, entry.directory, self._clock.now(), final)
        except Exception:
            log.exception("checkpoints of %s not pushed", job)
            return
        for rel, why in pushed.skipped:
            if why != NOT_SETTLED:
                log.warning("checkpoint %s of %s not pushed: %s", rel, job, why)


def _made(store_factory: Callable[[], ArtifactStore]) -> ArtifactStore | None:
    try:
        return store_factory()
    except Exception:
        log.exception("no artifact store for checkpoints")
        return None

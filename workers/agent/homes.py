"""A session's persistent home: restored from the artifact store at start, synced back at stop.

A user's files in a session's home outlive the session, up to the tenant's
quota, and come back in the next session of the same user in that tenant.
They live under the home's prefix (``jobs.sessions.home_prefix``)::

    homes/<tenant slug>/<user id>/
        manifest.json          {"version": 1, "files": [{path, size, sha256, executable}, ...]}
        blobs/<sha256>         one object per distinct content, named by its digest
        pending/<sync>.json    a sync in progress: {"at": unix time, "digests": [...]}

The manifest is the home: restore reads only what it names.  Blobs are named
by their content, so uploading a changed file never overwrites an object the
current manifest names::

    sync:  walk src (no link followed) -> hash what fits the quota -> plan_sync (pure)
           -> write pending/<sync>.json (the digests the new manifest will name)
           -> upload the blobs the old manifest lacks, each checked against its digest
           -> write manifest.json                       (one atomic write: the commit point)
           -> delete pending/<sync>.json, then every blob that neither the manifest now
              stored nor a live pending sync names

A sync whose plan is the stored home already (nothing to upload, the same
manifest: a session idle since its last sync) writes nothing; it only sweeps.

A crash (or a store error) anywhere before the manifest is written leaves the
previous manifest and all its blobs as they were: nothing is lost, and the
orphaned uploads go at the next sync's sweep (once their pending record is
older than ``HomeLimits.stale_s``).

A sync replaces the stored home with the session's files, so that deleting a
file in a session deletes it from the home, unless the session does not hold
the stored home: its restore failed, or another session of the same user
synced since (two sessions at once).  Then it merges: the stored files it
does not replace are kept.  ``Base`` carries what a session stands on from
its restore to each of its syncs; a pending record keeps each sync's blobs
from a concurrent sync's sweep.

Trust: ``src`` is the tenant's (HOSTILE) and the agent runs as root.  The
walk opens every folder and file by descriptor relative to its parent,
never following a link (``workers.beneath``): links, FIFOs, sockets and
devices are skipped and counted; a folder or file swapped for a link between
the listing and the open is refused by ``O_NOFOLLOW``; a file is read no
further than the size its opened descriptor had.  Names must be UTF-8,
relative, without ``.``/``..``, within ``HomeLimits``; the walk looks at no more than
``max_entries`` entries, ``max_depth`` folders deep.  Given the session's uid,
a file someone else owns (a hard link to another's file) is skipped too.
Restore writes each file under a temporary name, owned by the program's uid
before any byte is written, checks its size and sha256 against the manifest,
and only then renames it into place (a corrupt blob is skipped, never
restored); a link planted where a folder belongs is unlinked.  Restored files
are private (0600, 0700 when executable; folders 0700).

Over the quota (or ``max_files``) the largest files are left out and the
result names them: many small files (notebooks, settings) outlive one large
one (a data set).  Only regular files are kept; empty folders are not.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Protocol

from workers import beneath
from workers.agent.home_plan import (
    DEFAULT_LIMITS,
    Base,
    HomeFile,
    HomeLimits,
    Manifest,
    ManifestError,
    Plan,
    Skipped,
    amount,
    fit,
    is_digest,
    manifest_bytes,
    parse_manifest,
    path_refusal,
    plan_restore,
    plan_sync,
)
from workers.artifacts import StoredObject, at_most, check_relative
from workers.beneath import LinkRefused
from workers.clock import SYSTEM_CLOCK, Clock

MANIFEST = "manifest.json"
BLOBS = "blobs"
PENDING = "pending"

Owner = tuple[int, int] | None
"""(uid, gid) the restored files and folders belong to; None: the agent's own."""

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


# -- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestoreResult:
    """What a restore wrote (relative paths) and skipped (with why), the bytes written,
    the sha256 of the manifest it read (None: no home was stored), and why it read none
    (``error``; the home then starts empty)."""

    restored: tuple[str, ...] = ()
    skipped: Skipped = ()
    bytes: int = 0
    manifest_sha256: str | None = None
    error: str | None = None

    @property
    def base(self) -> Base:
        """What this session's first sync compares with (``sync``'s ``base``)."""
        return Base(self.manifest_sha256, complete=self.error is None)

    @property
    def message(self) -> str:
        """One line for the session's events and the agent's log."""
        if self.error is not None:
            return f"home not restored: {self.error}"
        if self.manifest_sha256 is None:
            return "no home stored yet: the session starts with an empty home"
        said = f"restored {len(self.restored)} files ({amount(self.bytes)}) of the home"
        if self.skipped:
            said += f"; {len(self.skipped)} skipped: " + _some(self.skipped)
        return said


@dataclass(frozen=True)
class SyncResult:
    """What a sync stored.

    ``stored``: files whose content was uploaded; ``unchanged``: files whose content
    the store held already; ``files``/``bytes``: the home as its new manifest has it;
    ``left_out``: files of the home that did not fit (quota, file count) or changed while
    they were read; ``skipped``: what is never synced (links, FIFOs, sockets, devices,
    bad names, too deep, not the session's own file); ``deleted``: blobs removed;
    ``manifest_written``: whether the home now is this sync's (False: the previous
    manifest stands, untouched); ``merged``: the stored files the session did not have
    were kept (see ``sync``); ``base``: what the session's next sync compares with (None
    when nothing was written: the previous one still holds); ``error``: why the home was
    not written; ``identical``: the stored home was already this sync's (nothing to
    upload, the same manifest), so nothing was written (``manifest_written`` holds: the
    home is this sync's).
    """

    stored: tuple[str, ...] = ()
    unchanged: int = 0
    files: int = 0
    bytes: int = 0
    left_out: Skipped = ()
    skipped: Skipped = ()
    deleted: int = 0
    manifest_written: bool = False
    merged: bool = False
    base: Base | None = None
    error: str | None = None
    identical: bool = False

    @property
    def message(self) -> str:
        """One line for the session's events and the agent's log (says what was left out)."""
        if not self.manifest_written:
            return f"home not synced, the stored home is unchanged: {self.error}"
        if self.identical:
            said = f"home unchanged since it was stored: {self.files} files ({amount(self.bytes)})"
        else:
            said = (
                f"home synced: {self.files} files ({amount(self.bytes)}), "
                f"{len(self.stored)} uploaded, {self.unchanged} unchanged"
            )
        if self.merged:
            said += "; merged with the stored home (kept the files this session did not have)"
        if self.left_out:
            said += f"; {len(self.left_out)} left out: " + _some(self.left_out)
        if self.skipped:
            said += f"; {len(self.skipped)} skipped: " + _some(self.skipped)
        return said


def _some(items: Skipped, shown: int = 5) -> str:
    listed = ", ".join(f"{path} ({why})" for path, why in items[:shown])
    return listed + (f" and {len(items) - shown} more" if len(items) > shown else "")


class HomeStore(Protocol):
    """What homes need of the artifact store (``ArtifactStore`` is one)."""

    def put_bytes(self, rel: str, data: bytes) -> StoredObject: ...
    def put_stream(self, rel: str, chunks: Iterable[bytes]) -> StoredObject: ...
    def open_read(self, rel: str) -> IO[bytes]: ...
    def open_sized(self, rel: str) -> tuple[IO[bytes], int]: ...
    def list(self, prefix: str = "") -> list[str]: ...
    def delete(self, rel: str) -> None: ...


class _Home:
    """One home's objects in ``store``, named relative to its prefix."""

    def __init__(self, store: HomeStore, prefix: str) -> None:
        self._store = store
        self._prefix = check_relative(prefix) + "/"

    def put_bytes(self, rel: str, data: bytes) -> StoredObject:
        return self._store.put_bytes(self._prefix + rel, data)

    def put_stream(self, rel: str, chunks: Iterable[bytes]) -> StoredObject:
        return self._store.put_stream(self._prefix + rel, chunks)

    def open_read(self, rel: str) -> IO[bytes]:
        return self._store.open_read(self._prefix + rel)

    def open_sized(self, rel: str) -> tuple[IO[bytes], int]:
        return self._store.open_sized(self._prefix + rel)

    def list(self, folder: str) -> list[str]:
        """The objects under ``folder`` of the home, relative to the home."""
        return [p.removeprefix(self._prefix) for p in self._store.list(self._prefix + folder)]

    def delete(self, rel: str) -> None:
        self._store.delete(self._prefix + rel)


# -- restore ------------------------------------------------------------------------------


def restore(
    store: HomeStore,
    prefix: str,
    dest: Path,
    quota_bytes: int,
    *,
    owner: Owner = None,
    limits: HomeLimits = DEFAULT_LIMITS,
) -> RestoreResult:
    """Write the home stored at ``prefix`` into ``dest`` (made if missing, owned by
    ``owner``), each file checked against its manifest's size and sha256.

    Run before the session's program starts.  ``dest``'s parent is the agent's
    (taken as given); ``dest`` itself is never reached through a link.  Store errors
    are in the result, never raised: the session then starts with what came back.
    """
    home = _Home(store, prefix)
    _check_quota(quota_bytes)
    raw: bytes | None = None
    unread: str | None = None
    try:
        raw = _read_manifest(home, limits)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        unread = f"the manifest could not be read: {exc}"
    with _local(dest, owner) as top:
        if unread is not None:
            return RestoreResult(error=unread)
        if raw is None:
            return RestoreResult()
        try:
            manifest = parse_manifest(raw)
        except ManifestError as exc:
            return RestoreResult(error=f"the manifest is damaged: {exc}")
        accepted, refused = plan_restore(manifest, quota_bytes, limits)
        restored: list[str] = []
        skipped = list(refused)
        written = 0
        for entry in accepted:
            try:
                why = _restore_one(home, top, entry, owner)
            except (OSError, ValueError) as exc:
                why = f"not restored: {exc}"
            if why is None:
                restored.append(entry.path)
                written += entry.size
            else:
                skipped.append((entry.path, why))
    return RestoreResult(
        restored=tuple(restored),
        skipped=tuple(skipped),
        bytes=written,
        manifest_sha256=hashlib.sha256(raw).hexdigest(),
    )


def _read_manifest(home: _Home, limits: HomeLimits) -> bytes:
    stream, size = home.open_sized(MANIFEST)
    with stream:
        if size > limits.max_manifest_bytes:
            raise ManifestError(f"{size} bytes, more than the {limits.max_manifest_bytes} allowed")
        return b"".join(at_most(stream, size))


def _restore_one(home: _Home, top: int, entry: HomeFile, owner: Owner) -> str | None:
    """Why ``entry`` was not restored (None: it was)."""
    stream, size = home.open_sized(f"{BLOBS}/{entry.sha256}")
    with stream:
        if size != entry.size:
            return f"corrupt: the stored content has {size} bytes, the manifest says {entry.size}"
        *folders, name = entry.path.split("/")
        with _folder(top, folders, owner) as parent:
            return _write_checked(parent, name, stream, entry, owner)


def _write_checked(
    parent: int, name: str, stream: IO[bytes], entry: HomeFile, owner: Owner
) -> str | None:
    """Write ``entry`` as ``name`` in ``parent`` from ``stream`` through a temporary file
    owned by ``owner`` from its creation; renamed into place only if its size and sha256
    are the manifest's (else removed, and why returned)."""
    temporary = f".home-{uuid.uuid4().hex}.part"  # not from the name: a long one would not fit
    descriptor = os.open(temporary, _CREATE_FLAGS, 0o600, dir_fd=parent)
    try:
        digest = hashlib.sha256()
        with os.fdopen(descriptor, "wb") as out:
            if owner is not None:
                os.fchown(out.fileno(), *owner)
            os.fchmod(out.fileno(), 0o700 if entry.executable else 0o600)
            size = 0
            for chunk in at_most(stream, entry.size + 1):  # one more: a longer blob is corrupt
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
            # No fsync: a node that crashes now loses the session too, and its next start
            # restores again from the store; each fsync would cost the start a disk flush.
        if size != entry.size or digest.hexdigest() != entry.sha256:
            os.unlink(temporary, dir_fd=parent)
            return (
                f"corrupt: the stored content is not the manifest's ({size} bytes, "
                f"sha256 {digest.hexdigest()[:12]}...)"
            )
        os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=parent)
        raise
    return None


@contextmanager
def _local(dest: Path, owner: Owner) -> Iterator[int]:
    """``dest`` opened by descriptor (made, private, owned by ``owner``, if missing):
    its parent as given (the agent's), ``dest`` itself never through a link."""
    with beneath.directory(str(dest.parent)) as parent:
        top = _child_folder(parent, dest.name, owner, replace_planted=False)
    try:
        yield top
    finally:
        os.close(top)


@contextmanager
def _folder(top: int, parts: Sequence[str], owner: Owner) -> Iterator[int]:
    """``top/parts...`` opened without following a link; what is missing (or is a link
    or a file where a folder belongs) is made, owned by ``owner``."""
    current = os.dup(top)
    try:
        for name in parts:
            child = _child_folder(current, name, owner, replace_planted=True)
            os.close(current)
            current = child
        yield current
    finally:
        os.close(current)


def _child_folder(parent: int, name: str, owner: Owner, *, replace_planted: bool) -> int:
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError as exc:  # a link (ELOOP, or ENOTDIR with O_DIRECTORY) or a file there
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        if not replace_planted:
            raise LinkRefused(errno.ELOOP, "not a directory reached without a link", name) from None
        beneath.remove_entry(parent, name)
    with suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent)
    made = os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    try:
        if owner is not None:
            os.fchown(made, *owner)
        os.fchmod(made, 0o700)
    except BaseException:
        os.close(made)
        raise
    return made


# -- sync ---------------------------------------------------------------------------------


@dataclass
class _Walk:
    """One walk's running counts: the regular files found and what was skipped."""

    limits: HomeLimits
    uid: int | None
    entries: int = 0
    found: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def sync(
    store: HomeStore,
    prefix: str,
    src: Path,
    quota_bytes: int,
    *,
    owner: Owner = None,
    limits: HomeLimits = DEFAULT_LIMITS,
    clock: Clock = SYSTEM_CLOCK,
    base: Base | None = None,
) -> SyncResult:
    """Store the files of ``src`` (the session's home: the tenant's, hostile) as the home at
    ``prefix``, within ``quota_bytes`` and ``limits``; see the module docstring.

    ``owner``: the session program's (uid, gid): a file another uid owns is skipped.
    ``base``: the session's ``RestoreResult.base``, then each ``SyncResult.base`` (a
    sync every few minutes, then the last at stop).  When the session lacks stored
    files (its restore failed) or another session has synced the home since (the
    stored manifest is not its base's), the stored files it does not have are kept
    (``merge``): its files alone would drop them.  None: the session's files replace
    the stored home.  ``src``'s parent is the agent's (its path is
    taken as given); ``src`` itself is never reached through a link.  Store errors
    before the manifest is written are in the result (the stored home unchanged);
    other exceptions propagate, with the same guarantee.
    """
    home = _Home(store, prefix)
    _check_quota(quota_bytes)
    try:
        old, current = _stored_manifest(home, limits)
        held = frozenset(blob.removeprefix(f"{BLOBS}/") for blob in home.list(BLOBS))
    except (OSError, ValueError) as exc:
        return SyncResult(error=f"the stored home could not be read: {exc}")
    merge = base is not None and (not base.complete or base.manifest_sha256 != current)
    work = _Walk(limits, owner[0] if owner is not None else None)
    try:
        with beneath.directory(str(src.parent)) as parent:
            top = os.open(src.name, _DIRECTORY_FLAGS, dir_fd=parent)
    except OSError as exc:
        return SyncResult(error=f"the home folder could not be opened: {exc}")
    try:
        _walk(top, "", 0, work)
        candidates = [HomeFile(path, size, "") for path, size in work.found]
        hashed, left_early = _hash_fitting(top, candidates, quota_bytes, work)
        plan = plan_sync(old, hashed, quota_bytes, limits.max_files, merge=merge, held=held)
        left_out = (*left_early, *plan.left_out)
        if _stored_already(plan, current):
            done = _identical(home, plan, left_out, work, clock)
        else:
            done = _carry_out(home, top, plan, left_out, work, clock)
    finally:
        os.close(top)
    if done.base is None:
        return done
    merged = merge and old is not None
    return replace(done, merged=merged, base=replace(done.base, complete=not merge))


def _stored_manifest(home: _Home, limits: HomeLimits) -> tuple[Manifest | None, str | None]:
    """The home's manifest and its sha256; (None, None) if there is none, or (None, its
    sha256) if it is damaged (its blobs then go at the sweep: it restores nothing anyway)."""
    try:
        raw = _read_manifest(home, limits)
    except FileNotFoundError:
        return None, None
    except ManifestError:  # too large to read: damaged as far as any restore goes
        return None, None
    digest = hashlib.sha256(raw).hexdigest()
    try:
        return parse_manifest(raw), digest
    except ManifestError:
        return None, digest


def _check_quota(quota_bytes: int) -> None:
    if isinstance(quota_bytes, bool) or not isinstance(quota_bytes, int) or quota_bytes < 0:
        raise ValueError(f"a home's quota is a whole number of bytes >= 0, not {quota_bytes!r}")


def _walk(directory: int, prefix: str, depth: int, work: _Walk) -> None:
    """Add the regular files below ``directory`` to ``work.found`` (path, size), and what
    is skipped to ``work.skipped``; no link is followed, no entry beyond the limits read."""
    limits = work.limits
    try:
        names = _names(directory, prefix, work)
    except OSError as exc:  # unreadable to the agent (an agent that is not root)
        work.skipped.append((prefix or ".", f"not listed: {exc.strerror or exc}"))
        return
    folders = []
    for name in sorted(names):
        rel = prefix + name
        why = path_refusal(rel, limits)
        try:
            info = os.lstat(name, dir_fd=directory)
        except FileNotFoundError:
            continue  # gone since it was listed
        except OSError as exc:
            work.skipped.append((rel, f"not looked at: {exc.strerror or exc}"))
            continue
        kind = _kind(info.st_mode)
        if kind == "file" and why is None:
            if work.uid is not None and info.st_uid != work.uid:
                why = "not the session's own file (a hard link to another's?)"
            else:
                work.found.append((rel, info.st_size))
        elif kind == "folder" and why is None:
            folders.append(name)
        elif why is None:
            why = f"{kind}, never followed or opened"
        if why is not None:
            work.skipped.append((rel, why))
    for name in folders:
        rel = prefix + name
        if depth + 1 > limits.max_depth:
            work.skipped.append((rel, f"deeper than {limits.max_depth} folders"))
            continue
        try:
            below = os.open(name, _DIRECTORY_FLAGS, dir_fd=directory)
        except FileNotFoundError:
            continue
        except OSError as exc:  # swapped for a link (ELOOP, ENOTDIR) since it was listed
            work.skipped.append((rel, f"not opened as a folder: {exc.strerror}"))
            continue
        try:
            _walk(below, rel + "/", depth + 1, work)
        finally:
            os.close(below)


def _names(directory: int, prefix: str, work: _Walk) -> list[str]:
    """The names in ``directory``, no more than the walk's ``max_entries`` allow."""
    names: list[str] = []
    with os.scandir(directory) as listing:
        for entry in listing:
            if work.entries >= work.limits.max_entries:
                work.skipped.append(
                    (
                        prefix or ".",
                        f"the walk stopped after "
                        f"{work.limits.max_entries} entries: the rest is not synced",
                    )
                )
                break
            work.entries += 1
            names.append(entry.name)
    return names


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def _hash_fitting(
    top: int, candidates: list[HomeFile], quota: int, work: _Walk
) -> tuple[list[HomeFile], Skipped]:
    """The candidates that fit (by their listed sizes) hashed, each through a fresh
    no-follow open, read no further than its opened size; those that cannot fit are
    left out unread (a huge file costs no reading)."""
    kept, fitting_left = fit(candidates, quota, work.limits.max_files)
    left = list(fitting_left)
    hashed = []
    for candidate in kept:
        try:
            source, info = _open_file(top, candidate.path, work.uid)
            with source:
                if info.st_size > quota:  # grew since it was listed: never read past the quota
                    left.append((candidate.path, f"over the home's quota of {amount(quota)}"))
                    continue
                digest = hashlib.sha256()
                for chunk in at_most(source, info.st_size):
                    digest.update(chunk)
                size = source.tell()
        except OSError as exc:  # gone, or swapped for a link or a FIFO, since it was listed
            work.skipped.append((candidate.path, f"not read: {exc.strerror or exc}"))
            continue
        executable = bool(info.st_mode & stat.S_IXUSR)
        hashed.append(HomeFile(candidate.path, size, digest.hexdigest(), executable))
    return hashed, tuple(left)


def _open_file(top: int, path: str, uid: int | None) -> tuple[IO[bytes], os.stat_result]:
    """``top/path`` open for reading (the caller closes it), walked without a link, a
    regular file (checked on the descriptor) of ``uid`` if given, and its ``fstat``."""
    source = os.fdopen(beneath.open_regular(top, path.split("/")), "rb")
    try:
        info = os.fstat(source.fileno())
        if uid is not None and info.st_uid != uid:
            raise PermissionError(errno.EPERM, "not the session's own file", path)
    except BaseException:
        source.close()
        raise
    return source, info


def _stored_already(plan: Plan, current: str | None) -> bool:
    """Whether the store holds ``plan``'s home already: no content to upload, and the
    stored manifest (sha256 ``current``) is the one the plan would write."""
    if plan.uploads or current is None:
        return False
    return hashlib.sha256(manifest_bytes(plan.manifest)).hexdigest() == current


def _identical(home: _Home, plan: Plan, left_out: Skipped, work: _Walk, clock: Clock) -> SyncResult:
    """A sync of a home the store holds already (a session idle since its last sync): no
    pending record, no upload, no manifest written; only the sweep of what crashed or
    concurrent syncs left (which reads, and deletes only garbage)."""
    manifest = plan.manifest
    return SyncResult(
        unchanged=len(manifest.files),
        files=len(manifest.files),
        bytes=manifest.total,
        left_out=left_out,
        skipped=tuple(work.skipped),
        deleted=_sweep(home, None, clock, work.limits),
        manifest_written=True,
        base=Base(hashlib.sha256(manifest_bytes(manifest)).hexdigest()),
        identical=True,
    )


def _carry_out(
    home: _Home,
    top: int,
    plan: Plan,
    left_out: Skipped,
    work: _Walk,
    clock: Clock,
) -> SyncResult:
    """Upload, write the manifest, sweep: the plan's side effects, in the safe order."""
    sync_id = uuid.uuid4().hex
    pending = f"{PENDING}/{sync_id}.json"
    left = list(left_out)
    manifest = plan.manifest
    try:
        home.put_bytes(pending, _pending_bytes(clock.now(), manifest.digests))
        stored: list[str] = []
        for upload in plan.uploads:
            why = _upload(home, top, upload, work.uid)
            if why is None:
                stored.append(upload.path)
                continue
            dropped = [f for f in manifest.files if f.sha256 == upload.sha256]
            left += [(f.path, why) for f in dropped]
            manifest = replace(manifest, files=tuple(f for f in manifest.files if f not in dropped))
        written = manifest_bytes(manifest)
        home.put_bytes(MANIFEST, written)
    except (OSError, ValueError) as exc:
        with suppress(OSError, ValueError):  # its uploads go at a later sweep, not stale_s later
            home.delete(pending)
        return SyncResult(
            left_out=tuple(left),
            skipped=tuple(work.skipped),
            error=f"the store refused the sync: {exc}",
        )
    deleted = _sweep(home, pending, clock, work.limits)
    uploaded = {f.sha256 for f in plan.uploads if f.path in stored}
    return SyncResult(
        stored=tuple(f.path for f in manifest.files if f.sha256 in uploaded),
        unchanged=sum(1 for f in manifest.files if f.sha256 not in uploaded),
        files=len(manifest.files),
        bytes=manifest.total,
        left_out=tuple(left),
        skipped=tuple(work.skipped),
        deleted=deleted,
        manifest_written=True,
        base=Base(hashlib.sha256(written).hexdigest()),
    )


def _upload(home: _Home, top: int, upload: HomeFile, uid: int | None) -> str | None:
    """Upload ``upload``'s content to its blob; why not (the file changed since it was
    hashed, or went), None when the stored blob is its digest.  Store errors raise."""
    blob = f"{BLOBS}/{upload.sha256}"
    try:
        source, info = _open_file(top, upload.path, uid)
    except OSError as exc:
        return f"gone or replaced while it was synced: {exc.strerror or exc}"
    with source:
        if info.st_size < upload.size:
            return "changed while it was synced (it shrank)"
        stored = home.put_stream(blob, at_most(source, upload.size))
    if (stored.size, stored.sha256) != (upload.size, upload.sha256):
        home.delete(blob)  # named by no manifest: its name must not lie about its content
        return "changed while it was synced"
    return None


def _pending_bytes(now: float, digests: Iterable[str]) -> bytes:
    return json.dumps({"at": now, "digests": sorted(digests)}).encode()


def _sweep(home: _Home, pending: str | None, clock: Clock, limits: HomeLimits) -> int:
    """After the manifest: forget this sync's pending record (if any), then delete every blob that
    neither the manifest now stored (this one, or a later sync's) nor a live pending sync
    names, and pending records older than ``stale_s``.  Errors leave garbage, never a
    home short of a blob; the count of blobs deleted."""
    try:
        if pending is not None:
            home.delete(pending)
        current = _read_manifest(home, limits)
        keep = set(parse_manifest(current).digests)
        now = clock.now()
        for record in home.list(PENDING):
            at, digests = _pending_record(home, record)
            if at is not None and now - at <= limits.stale_s:
                keep |= digests
            else:
                home.delete(record)
        deleted = 0
        for blob in home.list(BLOBS):
            if blob.removeprefix(f"{BLOBS}/") not in keep:
                home.delete(blob)
                deleted += 1
    except (OSError, ValueError):
        return 0  # the next sync sweeps
    return deleted


def _pending_record(home: _Home, record: str) -> tuple[float | None, set[str]]:
    """(when, digests) of a pending sync's record; (None, {}) when it is unreadable."""
    try:
        with home.open_read(record) as stream:
            raw: Any = json.loads(b"".join(at_most(stream, 64 << 20)))
        at = raw["at"]
        digests = {d for d in raw["digests"] if is_digest(d)}
        if isinstance(at, bool) or not isinstance(at, int | float):
            return None, set()
    except (OSError, ValueError, KeyError, TypeError):
        return None, set()
    return float(at), digests

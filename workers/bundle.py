"""Code bundles: the archive a tenant uploads with its training program, checked and unpacked.

A bundle is a ``.tar.gz``/``.tgz`` or ``.zip`` archive, known by the sha256 of
its bytes.  The portal calls :func:`inspect` when it is uploaded (every entry is
decompressed as a stream and counted, nothing is written), and a node agent
calls :func:`extract` before it starts the program.  Both walk the same entries
under the same rules, so whatever an upload accepts a node can unpack:

    archive ──magic──> tar.gz | zip | refused
       │
       └─ every entry: a safe relative path, a regular file or a directory,
          not seen before, within max_files; every file's bytes counted as
          they come out of the decompressor, refused the moment the total
          passes max_unpacked_bytes (a bomb never reaches the disk)

Anything else (links, devices, FIFOs, absolute or ``..`` paths, encrypted
zip entries) is refused with a :class:`BundleError` naming the entry.
Pure: no Django, usable on a GPU node without the portal.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, NamedTuple, Protocol, cast

MiB = 1024 * 1024
CHUNK = 1 * MiB  # bytes read from a decompressor at a time
NOT_AN_ARCHIVE = "not an archive (.tar.gz, .tgz or .zip)"

ArchiveKind = Literal["tar.gz", "zip"]

_DRIVE = re.compile(r"^[A-Za-z]:")
_TAR_SLACK_PER_ENTRY = 3 * 512  # a header, a pax header, padding: tar's own bytes per entry


class BundleError(ValueError):
    """An archive refused as a code bundle; the message is one sentence for the tenant."""


@dataclass(frozen=True)
class BundleLimits:
    """How big a bundle may be: entries, archive bytes, and bytes once unpacked."""

    max_files: int = 10_000
    max_bytes: int = 50 * MiB
    max_unpacked_bytes: int = 500 * MiB


class BundleFile(NamedTuple):
    """One regular file of a bundle: its relative path and unpacked size."""

    path: str
    size: int


@dataclass(frozen=True)
class BundleInfo:
    """What an accepted bundle is: its id (sha256 of the archive), sizes and file list."""

    sha256: str
    size: int
    kind: ArchiveKind
    files: tuple[BundleFile, ...]
    unpacked_bytes: int


def sha256_file(path: Path) -> str:
    """The hex sha256 of the file at ``path`` (a bundle's id), read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def archive_kind(path: Path) -> ArchiveKind:
    """Whether the file at ``path`` is a gzip'd tar or a zip, by its first bytes, not its name."""
    with path.open("rb") as stream:
        magic = stream.read(4)
    if magic[:2] == b"\x1f\x8b":
        return "tar.gz"
    if magic in (b"PK\x03\x04", b"PK\x05\x06"):  # a zip, or an empty one
        return "zip"
    raise BundleError(f"The upload is {NOT_AN_ARCHIVE}.")


def inspect(path: Path, limits: BundleLimits | None = None) -> BundleInfo:
    """Check the archive at ``path`` by decompressing every entry in memory; write nothing."""
    return _unpack(path, limits or BundleLimits(), None)


def extract(path: Path, dest: Path, limits: BundleLimits | None = None) -> BundleInfo:
    """Unpack the archive at ``path`` into the new directory ``dest``, read-only.

    Files get mode 0o444 and directories (``dest`` included) 0o555 once filled.
    On a refusal ``dest`` may hold part of the tree: callers extract into a
    scratch directory and remove it (:func:`remove_tree`).
    """
    dest.mkdir(mode=0o755)
    info = _unpack(path, limits or BundleLimits(), dest)
    for directory, _, _ in sorted(os.walk(dest), key=lambda entry: -len(entry[0])):
        os.chmod(directory, 0o555)
    return info


def remove_tree(path: Path) -> None:
    """Remove a read-only tree (made by :func:`extract`, or an environment the agent built),
    its read-only directories included; a link is removed, never followed."""
    if not path.exists():
        return
    for directory, _, _ in os.walk(path):
        os.chmod(directory, 0o755)
    for directory, subdirectories, names in os.walk(path, topdown=False):
        for name in names:
            os.unlink(os.path.join(directory, name))
        for name in subdirectories:  # os.walk lists a link to a directory here, unfollowed
            if os.path.islink(os.path.join(directory, name)):
                os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


# --- one walk over the entries, shared by inspect and extract -------------------------


class _Entry(NamedTuple):
    """An entry as the archive names it, before the rules are applied."""

    name: str
    is_dir: bool
    refusal: str | None  # why its type is not allowed ("a symlink"), None if allowed
    open: Callable[[], IO[bytes]] | None  # its bytes, for a regular file


class _Tree:
    """The paths seen so far: refuses duplicates and files used as directories."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.dirs: set[str] = set()

    def add(self, path: str, is_dir: bool) -> None:
        parts = path.split("/")
        for end in range(1, len(parts)):
            parent = "/".join(parts[:end])
            if parent in self.files:
                raise BundleError(f"Entry {path!r} is inside {parent!r}, which is a file.")
            self.dirs.add(parent)
        if path in self.files or (not is_dir and path in self.dirs):
            raise BundleError(f"Entry {path!r} appears more than once.")
        (self.dirs if is_dir else self.files).add(path)


def _safe_path(name: str) -> str:
    """``name`` as a clean relative path ('' for the root), or a refusal naming it."""
    if not name or "\x00" in name:
        raise BundleError(f"Entry {name!r} has an empty or invalid name.")
    if "\\" in name or _DRIVE.match(name):
        raise BundleError(f"Entry {name!r} uses a backslash or a drive letter.")
    if name.startswith("/"):
        raise BundleError(f"Entry {name!r} has an absolute path.")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise BundleError(f"Entry {name!r} points outside the bundle ('..').")
    return "/".join(parts)


def _unpack(path: Path, limits: BundleLimits, dest: Path | None) -> BundleInfo:
    size = path.stat().st_size
    if size > limits.max_bytes:
        raise BundleError(
            f"The archive is {size} bytes, over the limit of {limits.max_bytes} bytes."
        )
    kind = archive_kind(path)
    tree = _Tree()
    files: list[BundleFile] = []
    unpacked = 0
    entries = _tar_entries(path, limits) if kind == "tar.gz" else _zip_entries(path, limits)
    for count, entry in enumerate(entries, start=1):
        if count > limits.max_files:
            raise BundleError(f"The archive has more than {limits.max_files} entries.")
        if entry.refusal:
            raise BundleError(
                f"Entry {entry.name!r} is {entry.refusal}; a bundle holds only plain files "
                "and folders."
            )
        rel = _safe_path(entry.name)
        if not rel:
            continue  # the archive's root directory itself
        tree.add(rel, entry.is_dir)
        if entry.is_dir:
            if dest is not None:
                (dest / rel).mkdir(parents=True, exist_ok=True)
            continue
        assert entry.open is not None
        with entry.open() as stream:
            written = _copy(stream, rel, dest, limits.max_unpacked_bytes - unpacked, limits)
        unpacked += written
        files.append(BundleFile(rel, written))
    if not files:
        raise BundleError("The archive contains no files.")
    return BundleInfo(
        sha256=sha256_file(path),
        size=size,
        kind=kind,
        files=tuple(files),
        unpacked_bytes=unpacked,
    )


def _copy(stream: IO[bytes], rel: str, dest: Path | None, budget: int, limits: BundleLimits) -> int:
    """Read one file's bytes as they are decompressed (writing them under ``dest``)."""
    out: IO[bytes] | None = None
    target = None if dest is None else dest / rel
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        out = os.fdopen(os.open(target, flags, 0o600), "wb")
    total = 0
    try:
        with _reading(f"Entry {rel!r} is corrupt"):
            while chunk := stream.read(CHUNK):
                total += len(chunk)
                if total > budget:  # checked before the chunk is written
                    raise BundleError(
                        f"Entry {rel!r} takes the bundle over {limits.max_unpacked_bytes} "
                        "bytes unpacked."
                    )
                if out is not None:
                    out.write(chunk)
    finally:
        if out is not None and target is not None:
            out.close()
            os.chmod(target, 0o444)
    return total


@contextmanager
def _reading(what: str) -> Iterator[None]:
    """Turn a decompressor's complaint into a refusal: ``what`` and the reason."""
    try:
        yield
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise BundleError(f"{what} ({exc}).") from exc


# --- tar.gz ---------------------------------------------------------------------------


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _Counted:
    """A decompressed stream that refuses to yield more than ``limit`` bytes in all.

    tar's own headers (long names, pax records) are read through it too, so a
    header that claims gigabytes is stopped like file data.
    """

    def __init__(self, raw: _Readable, limit: int) -> None:
        self.raw = raw
        self.limit = limit
        self.seen = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(CHUNK if size < 0 else min(size, CHUNK))
        self.seen += len(data)
        if self.seen > self.limit:
            raise BundleError(f"The archive unpacks to more than {self.limit} bytes.")
        return data


def _tar_entries(path: Path, limits: BundleLimits) -> Iterator[_Entry]:
    # tar reads ahead of the entry being counted: leave room so that entry is the one named.
    limit = limits.max_unpacked_bytes + (limits.max_files + 2) * _TAR_SLACK_PER_ENTRY + 2 * CHUNK
    with path.open("rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
        tar = _open_tar(_Counted(unzipped, limit))
        with tar, _reading("The archive is corrupt"):
            for member in tar:
                yield _tar_entry(tar, member)


def _open_tar(stream: _Counted) -> tarfile.TarFile:
    """A tar read as a stream, front to back (no seeking), or a refusal."""
    try:
        return tarfile.open(fileobj=cast(IO[bytes], stream), mode="r|")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise BundleError(f"The upload is {NOT_AN_ARCHIVE}.") from exc


def _tar_entry(tar: tarfile.TarFile, member: tarfile.TarInfo) -> _Entry:
    refusal = None
    if member.issym():
        refusal = f"a symbolic link (to {member.linkname!r})"
    elif member.islnk():
        refusal = f"a hard link (to {member.linkname!r})"
    elif member.ischr() or member.isblk():
        refusal = "a device file"
    elif member.isfifo():
        refusal = "a FIFO"
    elif member.issparse():
        refusal = "a sparse file"
    elif not (member.isreg() or member.isdir()):
        refusal = "a special entry"

    def open_member() -> IO[bytes]:
        stream = tar.extractfile(member)
        assert stream is not None  # a regular file always has a stream
        return stream

    return _Entry(member.name, member.isdir(), refusal, open_member if member.isreg() else None)


# --- zip ------------------------------------------------------------------------------


def _zip_entries(path: Path, limits: BundleLimits) -> Iterator[_Entry]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise BundleError(f"The upload is {NOT_AN_ARCHIVE}.") from exc
    with archive:
        infos = archive.infolist()
        if len(infos) > limits.max_files:
            raise BundleError(f"The archive has more than {limits.max_files} entries.")
        for info in infos:
            yield _zip_entry(archive, info)


def _zip_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> _Entry:
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    is_dir = info.is_dir() or stat.S_ISDIR(mode)
    refusal = None
    if stat.S_ISLNK(kind):
        refusal = "a symbolic link"
    elif kind and not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
        refusal = "a device, FIFO or socket"
    elif info.flag_bits & 0x1:
        refusal = "an encrypted file"

    def open_member() -> IO[bytes]:
        return archive.open(info)

    return _Entry(info.filename, is_dir, refusal, None if is_dir else open_member)

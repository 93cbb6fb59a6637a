"""The pure rules of a session's persistent home (``workers.agent.homes`` does the I/O).

Which files a home keeps within its quota, what a sync uploads and what it may
delete, what a restore writes and refuses, how a manifest is written and read
back, and what a session's sync compares with (``Base``).  Plain data in, plain
data out: no file, no store, no clock, so every rule is tested on its own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

MANIFEST_VERSION = 1

Skipped = tuple[tuple[str, str], ...]
"""(relative path, why) of what was left out."""

_HEX = frozenset("0123456789abcdef")


class ManifestError(ValueError):
    """A stored manifest that is not one this module wrote (the message says what is wrong)."""


@dataclass(frozen=True)
class HomeLimits:
    """How much of a home one sync or restore handles.

    ``max_files``: files a home holds; ``max_entries``: directory entries one
    walk looks at (files, folders, links, anything: a home of a million empty
    folders ends the walk, not the agent); ``max_depth``: folders below the
    home's top; ``max_path_bytes``: a relative path's length in UTF-8 bytes;
    ``stale_s``: a pending sync older than this has crashed, so its uploads
    may be swept.
    """

    max_files: int = 10_000
    max_entries: int = 100_000
    max_depth: int = 32
    max_path_bytes: int = 1024
    stale_s: float = 24 * 3600.0

    @property
    def max_manifest_bytes(self) -> int:
        """The largest manifest a restore reads (every file at the longest path, and room)."""
        return self.max_files * (2 * self.max_path_bytes + 200) + 4096


DEFAULT_LIMITS = HomeLimits()
"""The limits a caller that names none gets (frozen: one shared value is safe)."""


def read_limits(env: Mapping[str, str]) -> HomeLimits:
    """``HomeLimits`` from ``SESSION_HOME_MAX_FILES``, ``SESSION_HOME_MAX_ENTRIES``,
    ``SESSION_HOME_MAX_DEPTH``, ``SESSION_HOME_MAX_PATH_BYTES`` and
    ``SESSION_HOME_STALE_SECONDS``; unset or empty: the default.  A bad value
    raises ``ValueError`` naming the variable."""
    default = HomeLimits()
    return HomeLimits(
        max_files=int(_positive(env, "SESSION_HOME_MAX_FILES", default.max_files, integer=True)),
        max_entries=int(
            _positive(env, "SESSION_HOME_MAX_ENTRIES", default.max_entries, integer=True)
        ),
        max_depth=int(_positive(env, "SESSION_HOME_MAX_DEPTH", default.max_depth, integer=True)),
        max_path_bytes=int(
            _positive(env, "SESSION_HOME_MAX_PATH_BYTES", default.max_path_bytes, integer=True)
        ),
        stale_s=_positive(env, "SESSION_HOME_STALE_SECONDS", default.stale_s),
    )


def _positive(env: Mapping[str, str], name: str, default: float, *, integer: bool = False) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(int(raw)) if integer else float(raw)
    except ValueError:
        raise ValueError(
            f"{name} must be {'a whole number' if integer else 'a number'}, not {raw!r}"
        ) from None
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be positive, not {raw!r}")
    return value


# -- the pure core ------------------------------------------------------------------------


@dataclass(frozen=True)
class HomeFile:
    """One file of a home: as a manifest names it, or as a sync found it in ``src``."""

    path: str
    size: int
    sha256: str
    executable: bool = False


@dataclass(frozen=True)
class Manifest:
    """What a stored home holds: its files, sorted by path."""

    files: tuple[HomeFile, ...] = ()

    @property
    def digests(self) -> frozenset[str]:
        """The blobs this manifest needs."""
        return frozenset(f.sha256 for f in self.files)

    @property
    def total(self) -> int:
        """The bytes of its files (what counts against the quota)."""
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Plan:
    """What a sync does: the new manifest, the files whose content the store lacks (one per
    digest), what is left out of the home (with why), and the digests the old manifest
    named that the new one does not (deleted once the new manifest is written)."""

    manifest: Manifest
    uploads: tuple[HomeFile, ...]
    left_out: Skipped
    unused: frozenset[str]


def path_refusal(path: str, limits: HomeLimits) -> str | None:
    """Why ``path`` may not be a home's file (None: it may): absolute, ``.``/``..`` or empty
    components, not UTF-8, too long or too deep."""
    if not path:
        return "an empty name"
    if path.startswith("/"):
        return "an absolute name"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "a name with an empty, '.' or '..' component"
    if "\0" in path:
        return "a name with a NUL byte"
    try:
        length = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        return "a name that is not UTF-8"
    if length > limits.max_path_bytes:
        return f"a name longer than {limits.max_path_bytes} bytes"
    if len(parts) - 1 > limits.max_depth:
        return f"deeper than {limits.max_depth} folders"
    return None


def fit(files: Iterable[HomeFile], quota: int, max_files: int) -> tuple[list[HomeFile], Skipped]:
    """The files a home of ``quota`` bytes and ``max_files`` files keeps, smallest first
    (ties by path), and those left out, with why: the largest go first, so many small
    files (notebooks, settings) outlive one large one (a data set)."""
    kept: list[HomeFile] = []
    left: list[tuple[str, str]] = []
    total = 0
    for found in sorted(files, key=lambda f: (f.size, f.path)):
        if len(kept) >= max_files:
            left.append((found.path, f"more than {max_files} files"))
        elif total + found.size > quota:
            left.append(
                (
                    found.path,
                    f"over the home's quota of {amount(quota)} "
                    f"({amount(found.size)}, {amount(total)} kept before it)",
                )
            )
        else:
            kept.append(found)
            total += found.size
    return sorted(kept, key=lambda f: f.path), tuple(left)


def plan_sync(
    old: Manifest | None,
    local: Sequence[HomeFile],
    quota: int,
    max_files: int,
    *,
    merge: bool = False,
    held: frozenset[str] | None = None,
) -> Plan:
    """What a sync stores: the local files that fit (``fit``), uploading each content the
    old manifest does not name (once per digest); the old manifest's other digests are
    unused.  ``held``: the blobs the store holds (None: every one the old manifest
    names): content it lost is uploaded again.  ``merge``: the old manifest's files that
    no local file replaces (same name, or a name one's folder takes) and whose content
    is held are candidates too (a session whose restore failed must not drop the stored
    home; see ``sync``)."""
    named = old.digests if old is not None else frozenset()
    stored = named if held is None else named & held
    candidates = list(local)
    if merge and old is not None:
        candidates += [f for f in _not_shadowed(old.files, local) if f.sha256 in stored]
    kept, left_out = fit(candidates, quota, max_files)
    uploads: dict[str, HomeFile] = {}
    for found in kept:
        if found.sha256 not in stored and found.sha256 not in uploads:
            uploads[found.sha256] = found
    manifest = Manifest(tuple(kept))
    return Plan(
        manifest=manifest,
        uploads=tuple(uploads.values()),
        left_out=left_out,
        unused=named - manifest.digests,
    )


def _not_shadowed(files: Iterable[HomeFile], local: Sequence[HomeFile]) -> list[HomeFile]:
    """The ``files`` no local file replaces: none of the same name, none whose folder has
    their name, and none named like one of their folders."""
    names = {f.path for f in local}
    folders = {folder for f in local for folder in _folders(f.path)}
    return [
        f
        for f in files
        if f.path not in names
        and f.path not in folders
        and not any(folder in names for folder in _folders(f.path))
    ]


def _folders(path: str) -> Iterator[str]:
    """The folders ``path`` lies in, outermost first (``a/b/c`` -> ``a``, ``a/b``)."""
    parts = path.split("/")
    for depth in range(1, len(parts)):
        yield "/".join(parts[:depth])


def plan_restore(
    manifest: Manifest, quota: int, limits: HomeLimits
) -> tuple[list[HomeFile], Skipped]:
    """The manifest's files a restore writes, and those it refuses with why: bad names,
    a second file of one name, a file where another's folder is, or beyond the quota and
    file count (which may have shrunk since the sync: the smallest files come back)."""
    named: list[HomeFile] = []
    refused: list[tuple[str, str]] = []
    seen: set[str] = set()
    for entry in sorted(manifest.files, key=lambda f: f.path):
        why = path_refusal(entry.path, limits)
        if why is None and entry.path in seen:
            why = "named twice in the manifest"
        if why is not None:
            refused.append((entry.path, why))
            continue
        seen.add(entry.path)
        named.append(entry)
    folders = {folder for f in named for folder in _folders(f.path)}
    clear = []
    for entry in named:
        if entry.path in folders:
            refused.append((entry.path, "a file where another file's folder is"))
        else:
            clear.append(entry)
    kept, left = fit(clear, quota, limits.max_files)
    return kept, (*refused, *left)


def manifest_bytes(manifest: Manifest) -> bytes:
    """``manifest`` as stored (JSON, files sorted by path)."""
    files = [
        {"path": f.path, "size": f.size, "sha256": f.sha256, "executable": f.executable}
        for f in sorted(manifest.files, key=lambda f: f.path)
    ]
    return json.dumps({"version": MANIFEST_VERSION, "files": files}, sort_keys=True).encode()


def parse_manifest(data: bytes) -> Manifest:
    """The manifest stored as ``data``; ``ManifestError`` if it is not one this module wrote.

    Names are checked by ``plan_restore`` (a bad one is skipped, not the whole home).
    """
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("version") != MANIFEST_VERSION:
        raise ManifestError(f"not a version {MANIFEST_VERSION} manifest")
    entries = raw.get("files")
    if not isinstance(entries, list):
        raise ManifestError("'files' is not a list")
    files = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ManifestError(f"file {index} is not an object")
        path, size, sha, executable = (
            entry.get(k) for k in ("path", "size", "sha256", "executable")
        )
        if not isinstance(path, str):
            raise ManifestError(f"file {index}: 'path' is not a string")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ManifestError(f"file {index}: 'size' is not a byte count")
        if not is_digest(sha):
            raise ManifestError(f"file {index}: 'sha256' is not 64 lower-case hex digits")
        if not isinstance(executable, bool):
            raise ManifestError(f"file {index}: 'executable' is not true or false")
        files.append(HomeFile(path, size, str(sha), executable))
    return Manifest(tuple(files))


def is_digest(value: object) -> bool:
    """Whether ``value`` is a sha256 as a manifest names one (64 lower-case hex digits)."""
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def amount(size: int) -> str:
    """``size`` bytes for a person to read (``1.5 KiB``)."""
    if size >= 1 << 20:
        return f"{size / (1 << 20):.1f} MiB"
    if size >= 1 << 10:
        return f"{size / (1 << 10):.1f} KiB"
    return f"{size} bytes"


@dataclass(frozen=True)
class Base:
    """The stored home a session's files stand on, for its next sync to compare with.

    ``manifest_sha256``: the manifest the session restored from or last wrote (None: no
    home was stored); ``complete``: whether the session holds every file of it (False
    after a failed restore or a merge: its next sync must keep the stored files).
    """

    manifest_sha256: str | None
    complete: bool = True

    def encode(self) -> str:
        """As a short JSON text, for the agent to keep from a session's start to its stop
        (a worker record, a file of the job's own folder)."""
        return json.dumps({"manifest_sha256": self.manifest_sha256, "complete": self.complete})

    @classmethod
    def decode(cls, text: str) -> Base:
        """The ``Base`` that ``encode`` wrote; ``ValueError`` for anything else."""
        try:
            raw = json.loads(text)
            digest, complete = raw["manifest_sha256"], raw["complete"]
        except (ValueError, TypeError, KeyError):
            raise ValueError(f"not a home's base: {text[:100]!r}") from None
        if (digest is not None and not is_digest(digest)) or not isinstance(complete, bool):
            raise ValueError(f"not a home's base: {text[:100]!r}")
        return cls(digest, complete)

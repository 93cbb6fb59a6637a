"""Packing a directory into the archive a code bundle is made of.

::

    project/                         .gitignore / .portalignore (gitignore syntax, both
      .gitignore   "data/"           read from the directory's top) say what stays out;
      .portalignore "*.ckpt"         .git/ always does, and so do symlinks and other
      train.py            ──►        non-regular files.  The archive is deterministic
      data/...  (left out)           (sorted names, zero mtimes and owners), so the same
                                     files give the same sha256 — the bundle's id — and a
                                     second upload of unchanged code is skipped.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pathspec

IGNORE_FILES = (".gitignore", ".portalignore")
ALWAYS_IGNORED = (".git/",)
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".zip")


@dataclass(frozen=True)
class Packed:
    """An archive ready to upload: its bytes, their sha256 and the files in it."""

    data: bytes
    sha256: str
    files: tuple[str, ...]


def ignore_spec(root: Path) -> pathspec.GitIgnoreSpec:
    """The exclusion rules of ``root``: its .gitignore, then its .portalignore (which may re-include)."""
    lines: list[str] = list(ALWAYS_IGNORED)
    for name in IGNORE_FILES:
        path = root / name
        if path.is_file():
            lines.extend(path.read_text(encoding="utf-8", errors="replace").splitlines())
    return pathspec.GitIgnoreSpec.from_lines(lines)


def included_files(root: Path) -> list[str]:
    """The relative paths (``/``-separated, sorted) of the regular files that go in the archive."""
    spec = ignore_spec(root)
    found: list[str] = []
    for current, dirs, files in os.walk(root):
        rel_dir = Path(current).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirs[:] = sorted(
            d
            for d in dirs
            if not (Path(current) / d).is_symlink() and not spec.match_file(prefix + d + "/")
        )
        for name in files:
            rel = prefix + name
            path = Path(current) / name
            if path.is_symlink() or not path.is_file() or spec.match_file(rel):
                continue
            found.append(rel)
    return sorted(found)


def pack_directory(root: str | os.PathLike[str]) -> Packed:
    """A deterministic .tar.gz of ``root``'s included files."""
    base = Path(root)
    if not base.is_dir():
        raise NotADirectoryError(f"{base} is not a directory")
    files = included_files(base)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            path = base / rel
            info = tarfile.TarInfo(rel)
            info.size = path.stat().st_size
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.mtime = 0
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    data = gzip.compress(raw.getvalue(), mtime=0)
    return Packed(data=data, sha256=hashlib.sha256(data).hexdigest(), files=tuple(files))


def read_archive(path: str | os.PathLike[str]) -> Packed:
    """An archive made elsewhere (.tar.gz, .tgz or .zip), uploaded as it is."""
    archive = Path(path)
    if not archive.name.endswith(ARCHIVE_SUFFIXES):
        raise ValueError(f"{archive} is not a .tar.gz, .tgz or .zip archive")
    data = archive.read_bytes()
    return Packed(data=data, sha256=hashlib.sha256(data).hexdigest(), files=())

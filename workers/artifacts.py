"""The artifact store: where the cluster keeps files that outlive a job's processes.

It holds the tenants' code bundles now, and checkpoints and logs later.  The
portal writes an uploaded bundle here and a node agent reads it back, so both
sides name objects by the same relative path (``tenants/<slug>/bundles/<sha>.zip``).
The store is a directory today (``file:///abs/dir`` or a plain path); it is
built on ``fsspec`` so that an object store (``s3://...``) can take its place.

Writes are atomic: an object is written under a temporary name next to its
final one, then renamed, so a reader sees the whole object or none of it.
"""

from __future__ import annotations

import uuid
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

import fsspec


class ArtifactPathError(ValueError):
    """A relative object path that would leave the store (absolute, ``..``, empty)."""


class ArtifactStore:
    """Objects under one root URL, named by relative POSIX paths."""

    def __init__(self, url: str) -> None:
        fs, root = fsspec.core.url_to_fs(url)
        self.url = url
        self._fs: Any = fs
        self._root = str(root).rstrip("/")

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    def _path(self, rel: str) -> str:
        pure = PurePosixPath(rel)
        if not rel or pure.is_absolute() or ".." in pure.parts or "\\" in rel:
            raise ArtifactPathError(f"not a relative object path inside the store: {rel!r}")
        return f"{self._root}/{pure}"

    def put_file(self, rel: str, local_src: Path) -> None:
        """Copy the local file ``local_src`` to ``rel``, atomically (replacing any object)."""
        target = self._path(rel)
        parent, _, name = target.rpartition("/")
        self._fs.makedirs(parent, exist_ok=True)
        temporary = f"{parent}/.{name}.{uuid.uuid4().hex}.part"
        try:
            self._fs.put_file(str(local_src), temporary)
            self._fs.mv(temporary, target)
        finally:
            if self._fs.exists(temporary):
                self._fs.rm(temporary)

    def exists(self, rel: str) -> bool:
        """Whether an object is stored at ``rel``."""
        return bool(self._fs.exists(self._path(rel)))

    def open_read(self, rel: str) -> IO[bytes]:
        """The object at ``rel``, open for binary reading (the caller closes it)."""
        return cast(IO[bytes], self._fs.open(self._path(rel), "rb"))

    def get_file(self, rel: str, local_dst: Path) -> None:
        """Copy the object at ``rel`` to the local file ``local_dst``."""
        source = self._path(rel)
        if not self._fs.exists(source):
            raise FileNotFoundError(f"no object {rel!r} in {self.url}")
        self._fs.get_file(source, str(local_dst))

    def delete(self, rel: str) -> None:
        """Remove the object at ``rel``; nothing happens if there is none."""
        target = self._path(rel)
        if self._fs.exists(target):
            self._fs.rm(target)

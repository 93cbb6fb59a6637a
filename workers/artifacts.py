"""The artifact store: where the cluster keeps files that outlive a job's processes.

Code bundles, checkpoints, user artifacts and job logs all live here, named by
relative POSIX paths under one root URL, so that the portal, every node agent
and every training process agree on a name whatever machine they run on::

    <ARTIFACT_URL>/
        tenants/<slug>/bundles/<sha>.<ext>            code bundles
        tenants/<slug>/jobs/<pk>/                     job_prefix(slug, pk)
            checkpoints/step-000000050.pt (+ .json)   the elastic runtime's checkpoints
            artifacts/<name>                          ctx.save_artifact
            logs/job.log                              the job's log

The root is a directory (``file:///abs/dir`` or a plain path: a local disk,
or an NFS/Lustre mount every node sees) or S3-compatible object storage
(``s3://bucket/prefix``, through ``s3fs``; credentials and endpoint from
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION`` and
``AWS_ENDPOINT_URL``).  Both go through ``fsspec``.

Writes are atomic, so a reader sees the whole object or none of it: in a
directory an object is written under a temporary name next to its final one,
fsynced, then renamed; on object storage one PUT (or one completed multipart
upload) is atomic by itself, and a failed upload is aborted.  Every write
returns the object's size and sha256, computed while the bytes go out;
``read_verified`` checks them on the way back.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

import fsspec

CHUNK = 1 << 20
"""Bytes per read or write when copying a stream."""

_LOCAL_PROTOCOLS = frozenset({"file", "local"})


class ArtifactPathError(ValueError):
    """A relative object path that would leave the store (absolute, ``..``, empty)."""


class ArtifactCorrupt(ValueError):
    """A stored object whose size or sha256 is not what was recorded when it was written."""


@dataclass(frozen=True)
class StoredObject:
    """One object as written: its path relative to the store, its size and sha256 (hex)."""

    path: str
    size: int
    sha256: str


def job_prefix(slug: str, job_pk: int) -> str:
    """The store prefix of one job's checkpoints, artifacts and logs: ``tenants/<slug>/jobs/<pk>``."""
    if not slug or "/" in slug or "\\" in slug or slug in (".", ".."):
        raise ArtifactPathError(f"not a tenant slug: {slug!r}")
    if isinstance(job_pk, bool) or not isinstance(job_pk, int) or job_pk < 0:
        raise ArtifactPathError(f"not a job primary key: {job_pk!r}")
    return f"tenants/{slug}/jobs/{job_pk}"


def check_relative(rel: str) -> str:
    """``rel`` normalised, if it names a path inside a store; raise ``ArtifactPathError``."""
    pure = PurePosixPath(rel)
    if not rel or pure.is_absolute() or ".." in pure.parts or "\\" in rel or str(pure) == ".":
        raise ArtifactPathError(f"not a relative object path inside the store: {rel!r}")
    return str(pure)


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".part")


class ArtifactStore:
    """Objects under one root URL, named by relative POSIX paths."""

    def __init__(self, url: str) -> None:
        # A fresh instance (no fsspec instance cache): a store must see what other
        # processes wrote, not a listing an earlier instance of this process cached.
        fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True, **_options(url))
        self._setup(url, fs, str(root))

    @classmethod
    def _on(cls, url: str, fs: Any, root: str) -> ArtifactStore:
        store = cls.__new__(cls)
        store._setup(url, fs, root)
        return store

    def _setup(self, url: str, fs: Any, root: str) -> None:
        self.url = url
        self._fs: Any = fs
        self._root = root.rstrip("/")
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        self._local = bool(_LOCAL_PROTOCOLS & set(protocols))

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    def _path(self, rel: str) -> str:
        return f"{self._root}/{check_relative(rel)}"

    def _fresh(self, path: str) -> None:
        """Forget cached listings (s3fs keeps them) before a question about ``path``."""
        self._fs.invalidate_cache(path)

    # -- writing ---------------------------------------------------------------------
    def put_file(self, rel: str, local_src: Path) -> StoredObject:
        """Copy the local file ``local_src`` to ``rel``, atomically (replacing any object)."""
        target = self._path(rel)  # a bad path is refused before the source is opened
        if self._local:
            self._fs.makedirs(target.rpartition("/")[0], exist_ok=True)
        with open(local_src, "rb") as source:
            return self.put_stream(rel, iter(lambda: source.read(CHUNK), b""))

    def put_bytes(self, rel: str, data: bytes) -> StoredObject:
        """Store ``data`` at ``rel``, atomically (replacing any object)."""
        return self.put_stream(rel, [data])

    def put_stream(self, rel: str, chunks: Iterable[bytes]) -> StoredObject:
        """Store the concatenated ``chunks`` at ``rel``, atomically; an error stores nothing."""
        target = self._path(rel)
        digest = hashlib.sha256()
        size = 0
        if self._local:
            parent, _, name = target.rpartition("/")
            self._fs.makedirs(parent, exist_ok=True)
            temporary = f"{parent}/.{name}.{uuid.uuid4().hex}.part"
            try:
                with open(temporary, "wb") as out:
                    for chunk in chunks:
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temporary, target)
            finally:
                if os.path.exists(temporary):
                    os.unlink(temporary)
        else:
            out = self._fs.open(target, "wb")
            try:
                for chunk in chunks:
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            except BaseException:
                out.discard()  # abort the multipart upload: nothing becomes visible
                out.closed = True  # and never upload the rest when the object is collected
                raise
            out.close()  # the PUT (or the upload's completion) makes the object appear
            self._fresh(target)
        return StoredObject(path=check_relative(rel), size=size, sha256=digest.hexdigest())

    # -- reading ---------------------------------------------------------------------
    def exists(self, rel: str) -> bool:
        """Whether an object is stored at ``rel``."""
        path = self._path(rel)
        self._fresh(path)
        return bool(self._fs.isfile(path))

    def size(self, rel: str) -> int:
        """The size in bytes of the object at ``rel``; ``FileNotFoundError`` if there is none."""
        path = self._path(rel)
        self._fresh(path)
        return int(self._fs.size(path))

    def open_read(self, rel: str) -> IO[bytes]:
        """The object at ``rel``, open for binary reading (the caller closes it)."""
        path = self._path(rel)
        self._fresh(path)
        return cast(IO[bytes], self._fs.open(path, "rb"))

    def open_range(self, rel: str, start: int, length: int) -> IO[bytes]:
        """Bytes ``start`` .. ``start + length - 1`` of the object at ``rel``, as a stream.

        For HTTP range requests: the stream ends after ``length`` bytes (or at
        the object's end); the caller closes it.
        """
        if start < 0 or length < 0:
            raise ValueError("a range needs start >= 0 and length >= 0")
        whole = self.open_read(rel)
        whole.seek(start)
        return io.BufferedReader(_Window(whole, length), buffer_size=CHUNK)

    def read_verified(self, rel: str, size: int, sha256: str) -> bytes:
        """The bytes of ``rel`` if they have this size and sha256; else ``ArtifactCorrupt``."""
        with self.open_read(rel) as stream:
            data = stream.read(size + 1)  # one more: a longer object is corrupt too
        if len(data) != size:
            raise ArtifactCorrupt(f"{rel}: {len(data)} bytes, expected {size}")
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256.lower():
            raise ArtifactCorrupt(f"{rel}: sha256 {actual}, expected {sha256}")
        return data

    def get_file(self, rel: str, local_dst: Path) -> None:
        """Copy the object at ``rel`` to the local file ``local_dst``."""
        source = self._path(rel)
        self._fresh(source)
        if not self._fs.isfile(source):
            raise FileNotFoundError(f"no object {rel!r} in {self.url}")
        self._fs.get_file(source, str(local_dst))

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Relative paths of the objects under ``prefix`` ("" for all), sorted; files only."""
        base = self._path(prefix) if prefix else self._root
        self._fresh(base)
        if not self._fs.exists(base):
            return []
        if self._fs.isfile(base):
            found: Iterator[str] = iter([base])
        else:
            found = iter(self._fs.find(base))
        root = self._fs._strip_protocol(self._root).rstrip("/") + "/"
        out = []
        for path in found:
            path = self._fs._strip_protocol(path)
            if path.startswith(root) and not _is_temporary(path.rpartition("/")[2]):
                out.append(path[len(root) :])
        return sorted(out)

    # -- deleting ----------------------------------------------------------------------
    def delete(self, rel: str) -> None:
        """Remove the object at ``rel``; nothing happens if there is none."""
        target = self._path(rel)
        self._fresh(target)
        if self._fs.isfile(target):
            self._fs.rm(target)
            self._fresh(target)

    def delete_prefix(self, prefix: str) -> builtins.list[str]:
        """Remove every object under ``prefix`` (not the whole store); return what was removed."""
        doomed = self.list(prefix)
        for rel in doomed:
            self.delete(rel)
        if self._local:  # directories left empty would pile up; object stores have none
            path = self._path(prefix)
            if self._fs.isdir(path):
                self._fs.rm(path, recursive=True)
        return doomed

    # -- naming ------------------------------------------------------------------------
    def url_of(self, rel: str) -> str:
        """The full URL of ``rel`` (a store built on it names the same object)."""
        return str(self._fs.unstrip_protocol(self._path(rel)))

    def child(self, rel_prefix: str) -> ArtifactStore:
        """A store rooted at ``rel_prefix`` of this one (a job's prefix, its checkpoints)."""
        path = self._path(rel_prefix)
        return ArtifactStore._on(str(self._fs.unstrip_protocol(path)), self._fs, path)


class _Window(io.RawIOBase):
    """At most ``length`` bytes of an open stream, from its current position."""

    def __init__(self, stream: IO[bytes], length: int) -> None:
        self._stream = stream
        self._left = length

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._left)
        if want <= 0:
            return 0
        data = self._stream.read(want)
        buffer[: len(data)] = data
        self._left -= len(data)
        return len(data)

    def close(self) -> None:
        self._stream.close()
        super().close()


def _options(url: str) -> dict[str, Any]:
    """Filesystem options for ``url``: the S3 endpoint from ``AWS_ENDPOINT_URL``, if set.

    Newer botocore reads that variable itself; passing it keeps older ones
    (and s3fs's own client) on the same endpoint.
    """
    if not url.startswith(("s3://", "s3a://")):
        return {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    return {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}

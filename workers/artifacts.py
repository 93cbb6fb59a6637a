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

Below the root of a directory store nothing follows a symbolic link: a job's
prefix is bound read-write into its sandbox, so its program may plant links
(and FIFOs) there, and this code runs as root on the nodes and as the web
server.  The root is resolved once, when the store is made (it may be a link
the operator chose); every operation then walks from it one component at a
time through ``workers.beneath``, reads and lists regular files only, and
raises ``workers.beneath.LinkRefused`` (an ``OSError``) at a link below the
root.  A child store (``child``) keeps walking from its parent's root, so a
link in the middle of its prefix is refused too.
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

from workers import beneath
from workers.beneath import LinkRefused

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
    def _on(cls, url: str, fs: Any, root: str, base: str, below: tuple[str, ...]) -> ArtifactStore:
        store = cls.__new__(cls)
        store._setup(url, fs, root, base, below)
        return store

    def _setup(
        self, url: str, fs: Any, root: str, base: str | None = None, below: tuple[str, ...] = ()
    ) -> None:
        self.url = url
        self._fs: Any = fs
        self._root = root.rstrip("/")
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        self._local = bool(_LOCAL_PROTOCOLS & set(protocols))
        # A directory store walks from ``_base`` (the configured root, resolved once: it
        # may be a link) through ``_below`` (a child store's prefix), never following a
        # link below ``_base``.
        if base is None:
            base = os.path.realpath(self._root or "/") if self._local else self._root
        self._base = base
        self._below = below

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    def _path(self, rel: str) -> str:
        return f"{self._root}/{check_relative(rel)}"

    def _parts(self, rel: str) -> tuple[str, ...]:
        """The components of ``rel`` below the resolved root of a directory store."""
        return self._below + tuple(check_relative(rel).split("/"))

    def _fresh(self, path: str) -> None:
        """Forget cached listings (s3fs keeps them) before a question about ``path``."""
        self._fs.invalidate_cache(path)

    # -- writing ---------------------------------------------------------------------
    def put_file(self, rel: str, local_src: Path) -> StoredObject:
        """Copy the local file ``local_src`` to ``rel``, atomically (replacing any object)."""
        self._path(rel)  # a bad path is refused before the source is opened
        if self._local:  # and its folder is made (or a link on the way refused) first too
            with beneath.directory(self._base, self._parts(rel)[:-1], create=True):
                pass
        with open(local_src, "rb") as source:
            return self.put_stream(rel, iter(lambda: source.read(CHUNK), b""))

    def put_bytes(self, rel: str, data: bytes) -> StoredObject:
        """Store ``data`` at ``rel``, atomically (replacing any object)."""
        return self.put_stream(rel, [data])

    def put_stream(self, rel: str, chunks: Iterable[bytes]) -> StoredObject:
        """Store the concatenated ``chunks`` at ``rel``, atomically; an error stores nothing.

        In a directory store a link on the way raises ``LinkRefused`` and
        writes nothing; a link at ``rel`` itself is replaced, its target untouched.
        """
        target = self._path(rel)
        digest = hashlib.sha256()
        size = 0

        def counted() -> Iterator[bytes]:
            nonlocal size
            for chunk in chunks:
                digest.update(chunk)
                size += len(chunk)
                yield chunk

        if self._local:
            *folder, name = self._parts(rel)
            temporary = f".{name}.{uuid.uuid4().hex}.part"
            with beneath.directory(self._base, folder, create=True) as parent:
                beneath.write_atomically(parent, name, temporary, counted())
        else:
            out = self._fs.open(target, "wb")
            try:
                for chunk in counted():
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
        """Whether an object is stored at ``rel`` (in a directory: a regular file reached
        without a link; a link or a FIFO is no object)."""
        path = self._path(rel)
        if self._local:
            *folder, name = self._parts(rel)
            try:
                with beneath.directory(self._base, folder) as parent:
                    return beneath.is_regular(parent, name)
            except (FileNotFoundError, NotADirectoryError, LinkRefused):
                return False
        self._fresh(path)
        return bool(self._fs.isfile(path))

    def size(self, rel: str) -> int:
        """The size in bytes of the object at ``rel``; ``FileNotFoundError`` if there is none."""
        if self._local:
            with self.open_read(rel) as stream:
                return os.fstat(stream.fileno()).st_size
        path = self._path(rel)
        self._fresh(path)
        return int(self._fs.size(path))

    def open_read(self, rel: str) -> IO[bytes]:
        """The object at ``rel``, open for binary reading (the caller closes it).

        In a directory store: a regular file reached without a link, else
        ``LinkRefused`` (``FileNotFoundError`` if there is nothing).
        """
        path = self._path(rel)
        if self._local:
            with beneath.directory(self._base) as top:
                return os.fdopen(beneath.open_regular(top, self._parts(rel)), "rb")
        self._fresh(path)
        return cast(IO[bytes], self._fs.open(path, "rb"))

    def open_sized(self, rel: str) -> tuple[IO[bytes], int]:
        """The object at ``rel`` open for reading, and its size as the opened object has it.

        The size comes from the open descriptor (``fstat``) in a directory, so
        it describes the very bytes that will be read, not a path looked up
        before.
        """
        stream = self.open_read(rel)
        try:
            if self._local:
                return stream, os.fstat(stream.fileno()).st_size
            return stream, int(cast(Any, stream).size)
        except BaseException:
            stream.close()
            raise

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
            return verified(stream, rel, size, sha256)

    def get_file(self, rel: str, local_dst: Path) -> None:
        """Copy the object at ``rel`` to the local file ``local_dst``."""
        source = self._path(rel)
        if self._local:
            try:
                stream = self.open_read(rel)
            except IsADirectoryError:
                raise FileNotFoundError(f"no object {rel!r} in {self.url}") from None
            with stream, open(local_dst, "wb") as out:
                for chunk in iter(lambda: stream.read(CHUNK), b""):
                    out.write(chunk)
            return
        self._fresh(source)
        if not self._fs.isfile(source):
            raise FileNotFoundError(f"no object {rel!r} in {self.url}")
        self._fs.get_file(source, str(local_dst))

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Relative paths of the objects under ``prefix`` ("" for all), sorted; files only.

        A directory store lists regular files only, never through a link; a
        prefix that is a link lists nothing, one that passes through a link
        raises ``LinkRefused``.
        """
        if self._local:
            return sorted(self._list_local(prefix))
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

    def _list_local(self, prefix: str) -> Iterator[str]:
        parts = self._parts(prefix) if prefix else self._below
        shown = f"{check_relative(prefix)}/" if prefix else ""
        try:
            with beneath.directory(self._base, parts[:-1]) as parent:
                if parts and beneath.is_regular(parent, parts[-1]):
                    if not _is_temporary(parts[-1]):
                        yield check_relative(prefix)
                    return
                with beneath.directory(self._base, parts) as top:
                    for path, _size in beneath.regular_files(top, shown):
                        if not _is_temporary(path.rpartition("/")[2]):
                            yield path
        except (FileNotFoundError, NotADirectoryError):
            return
        except LinkRefused as refused:
            if refused.filename != "/".join(parts):
                raise  # a link on the way to the prefix: the caller is told
            return  # the prefix itself is a link: nothing is listed through it

    # -- deleting ----------------------------------------------------------------------
    def delete(self, rel: str) -> None:
        """Remove the object at ``rel``; nothing happens if there is none.

        In a directory store a link at ``rel`` is removed as a link; a link on
        the way raises ``LinkRefused`` and removes nothing.
        """
        target = self._path(rel)
        if self._local:
            *folder, name = self._parts(rel)
            try:
                with beneath.directory(self._base, folder) as parent:
                    beneath.remove_entry(parent, name)
            except (FileNotFoundError, NotADirectoryError):
                pass
            return
        self._fresh(target)
        if self._fs.isfile(target):
            self._fs.rm(target)
            self._fresh(target)

    def delete_prefix(self, prefix: str) -> builtins.list[str]:
        """Remove every object under ``prefix`` (not the whole store); return what was removed.

        In a directory store the folder goes too, removed without following a
        link: a link in it (or the prefix itself, if it is one) is unlinked,
        its target untouched; a link on the way to the prefix raises
        ``LinkRefused`` and removes nothing.
        """
        if self._local:
            *folder, name = self._parts(prefix)
            above = check_relative(prefix).rpartition("/")[0]
            try:
                with beneath.directory(self._base, folder) as parent:
                    removed = beneath.remove_tree(parent, name)
            except (FileNotFoundError, NotADirectoryError):
                return []
            return sorted(
                f"{above}/{path}" if above else path
                for path in removed
                if not _is_temporary(path.rpartition("/")[2])
            )
        doomed = self.list(prefix)
        for rel in doomed:
            self.delete(rel)
        return doomed

    # -- naming ------------------------------------------------------------------------
    def url_of(self, rel: str) -> str:
        """The full URL of ``rel`` (a store built on it names the same object)."""
        return str(self._fs.unstrip_protocol(self._path(rel)))

    def child(self, rel_prefix: str) -> ArtifactStore:
        """A store rooted at ``rel_prefix`` of this one (a job's prefix, its checkpoints).

        A directory child walks from this store's resolved root, so a link
        anywhere in ``rel_prefix`` is refused as it would be here.
        """
        path = self._path(rel_prefix)
        url = str(self._fs.unstrip_protocol(path))
        return ArtifactStore._on(url, self._fs, path, self._base, self._parts(rel_prefix))


def verified(stream: IO[bytes], rel: str, size: int, sha256: str) -> bytes:
    """The bytes of ``stream`` (the object ``rel``) if they have this size and sha256; else
    ``ArtifactCorrupt``."""
    data = stream.read(size + 1)  # one more: a longer object is corrupt too
    if len(data) != size:
        raise ArtifactCorrupt(f"{rel}: {len(data)} bytes, expected {size}")
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256.lower():
        raise ArtifactCorrupt(f"{rel}: sha256 {actual}, expected {sha256}")
    return data


def at_most(source: IO[bytes], size: int) -> Iterator[bytes]:
    """At most ``size`` bytes of ``source``, a chunk at a time (fewer if it ends first): a
    file that grows while it is copied cannot pass a limit checked on its size."""
    left = size
    while left > 0:
        data = source.read(min(CHUNK, left))
        if not data:
            return
        left -= len(data)
        yield data


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

"""A job's prefix of the artifact store, as its programs reach it: through their agent's door.

A tenant's program never holds the artifact store: no writable bind of a
directory store, no object-store credentials.  Its node's agent serves the
job's own prefix (``tenants/<slug>/jobs/<pk>``) on a Unix socket bound
read-only into the sandbox (``workers.agent.door``), and the elastic runtime's
``store_url`` names that socket::

    door+unix:///run/portal-door/<id>/store.sock

The protocol is plain HTTP/1.0 (one request per connection), object paths
relative to the job's prefix::

    GET    /objects/<path>       200 the bytes (Content-Length) | 404 | 403 a link | 400 a bad path
    HEAD   /objects/<path>       200 with Content-Length, no body | 404
    PUT    /objects/<path>       Content-Length required; 201 {"path", "size", "sha256"} | 413
    DELETE /objects/<path>       204
    GET    /list?prefix=<path>   200 ["path", ...] (files only, sorted)

``open_store`` gives a door store for such a URL and an ``ArtifactStore``
for any other, so the runtime's checkpoints and artifacts work the same
whether the agent runs it behind a door (a job with a store prefix) or on a
node-local directory.  ``DoorStore`` has the ``ArtifactStore`` methods the
runtime and the ``edl`` SDK use (``ObjectStore``).

The door is the agent's, and an agent may restart while its programs train
on: a request that finds no door (no socket, or no one listening) tries
again until ``AGENT_AWAY_S``.  Nothing was sent by then, so every request,
a PUT too, is safe to try again.
"""

from __future__ import annotations

import builtins
import hashlib
import http.client
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, Protocol, cast
from urllib.parse import quote, urlencode, urlsplit

from workers.artifacts import (
    CHUNK,
    ArtifactCorrupt,
    ArtifactPathError,
    ArtifactStore,
    StoredObject,
    check_relative,
    verified,
)
from workers.beneath import LinkRefused

SCHEME = "door+unix"
SPOOL_BYTES = 64 << 20
"""A ``put_stream`` of unknown length is held in memory up to this, then in a temporary file
(the door needs its length before the first byte)."""
TIMEOUT_S = 300.0
"""How long a request waits on the door for the next byte (a large object is many)."""
AGENT_AWAY_S = 120.0
"""How long a request waits for the door to open again: the agent that serves it may be
restarting (its processes train on, and a restarted agent opens their doors again)."""


class ObjectStore(Protocol):
    """What the runtime needs of a store: ``ArtifactStore`` and ``DoorStore`` both are one."""

    url: str

    def put_file(self, rel: str, local_src: Path) -> StoredObject: ...
    def put_bytes(self, rel: str, data: bytes) -> StoredObject: ...
    def put_stream(self, rel: str, chunks: Iterable[bytes]) -> StoredObject: ...
    def exists(self, rel: str) -> bool: ...
    def size(self, rel: str) -> int: ...
    def open_read(self, rel: str) -> IO[bytes]: ...
    def read_verified(self, rel: str, size: int, sha256: str) -> bytes: ...
    def get_file(self, rel: str, local_dst: Path) -> None: ...
    def list(self, prefix: str = "") -> builtins.list[str]: ...
    def delete(self, rel: str) -> None: ...


def door_url(socket_path: Path) -> str:
    """The store URL of the door listening on ``socket_path``."""
    return f"{SCHEME}://{socket_path}"


def open_store(url: str) -> ObjectStore:
    """The store ``url`` names: a job's door, else a directory or object store."""
    if url.startswith(f"{SCHEME}://"):
        return DoorStore(url)
    return ArtifactStore(url)


class DoorError(OSError):
    """The door answered with an error this client has no better exception for."""


class DoorStore:
    """A job's prefix of the artifact store behind its agent's door (see the module docstring)."""

    def __init__(self, url: str, away_s: float = AGENT_AWAY_S) -> None:
        parts = urlsplit(url)
        if parts.scheme != SCHEME or not parts.path.startswith("/"):
            raise ValueError(f"not a store door URL: {url!r}")
        self.url = url
        self._socket = parts.path
        self._away_s = away_s

    def __repr__(self) -> str:
        return f"DoorStore({self.url!r})"

    # -- writing ---------------------------------------------------------------------
    def put_file(self, rel: str, local_src: Path) -> StoredObject:
        """Copy the local file ``local_src`` to ``rel``, atomically (replacing any object)."""
        check_relative(rel)
        with open(local_src, "rb") as source:
            return self._put(rel, source, os.fstat(source.fileno()).st_size)

    def put_bytes(self, rel: str, data: bytes) -> StoredObject:
        """Store ``data`` at ``rel``, atomically (replacing any object)."""
        return self.put_stream(rel, [data])

    def put_stream(self, rel: str, chunks: Iterable[bytes]) -> StoredObject:
        """Store the concatenated ``chunks`` at ``rel``, atomically; an error stores nothing."""
        check_relative(rel)
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            for chunk in chunks:
                spool.write(chunk)
            size = spool.tell()
            spool.seek(0)
            return self._put(rel, cast(IO[bytes], spool), size)

    def _put(self, rel: str, body: IO[bytes], size: int) -> StoredObject:
        connection = self._connect()
        try:
            connection.putrequest("PUT", _object_path(rel), skip_accept_encoding=True)
            connection.putheader("Content-Length", str(size))
            connection.endheaders()
            try:
                digest = _send(connection, body, size, rel)
            except (BrokenPipeError, ConnectionResetError):
                # The door refused before reading it all (413): its answer says why.
                _answer(connection.getresponse(), rel)
                raise
            answer = _answer(connection.getresponse(), rel)
        finally:
            connection.close()
        stored = StoredObject(**json.loads(answer))
        if (stored.path, stored.size, stored.sha256) != (
            check_relative(rel),
            size,
            digest.hexdigest(),
        ):
            raise ArtifactCorrupt(f"{rel}: the door stored {stored}, not what was sent")
        return stored

    # -- reading ---------------------------------------------------------------------
    def exists(self, rel: str) -> bool:
        """Whether an object is stored at ``rel``."""
        try:
            self.size(rel)
        except (FileNotFoundError, LinkRefused):
            return False
        return True

    def size(self, rel: str) -> int:
        """The size in bytes of the object at ``rel``; ``FileNotFoundError`` if there is none."""
        connection = self._connect()
        try:
            connection.request("HEAD", _object_path(rel))
            response = connection.getresponse()
            _answer(response, rel)
            return int(response.getheader("Content-Length") or 0)
        finally:
            connection.close()

    def open_read(self, rel: str) -> IO[bytes]:
        """The object at ``rel``, open for binary reading (the caller closes it)."""
        connection = self._connect()
        try:
            connection.request("GET", _object_path(rel))
            response = connection.getresponse()
            if response.status != http.client.OK:
                _answer(response, rel)
        except BaseException:
            connection.close()
            raise
        return cast(IO[bytes], _Body(response, connection))

    def read_verified(self, rel: str, size: int, sha256: str) -> bytes:
        """The bytes of ``rel`` if they have this size and sha256; else ``ArtifactCorrupt``."""
        with self.open_read(rel) as stream:
            return verified(stream, rel, size, sha256)

    def get_file(self, rel: str, local_dst: Path) -> None:
        """Copy the object at ``rel`` to the local file ``local_dst``."""
        with self.open_read(rel) as stream, open(local_dst, "wb") as out:
            for chunk in iter(lambda: stream.read(CHUNK), b""):
                out.write(chunk)

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Relative paths of the objects under ``prefix`` ("" for all), sorted; files only."""
        query = urlencode({"prefix": check_relative(prefix)}) if prefix else ""
        connection = self._connect()
        try:
            connection.request("GET", f"/list?{query}")
            found = json.loads(_answer(connection.getresponse(), prefix or "/"))
        finally:
            connection.close()
        if not isinstance(found, builtins.list) or not all(isinstance(p, str) for p in found):
            raise DoorError(f"the door's listing of {prefix!r} is not a list of paths")
        return sorted(found)

    # -- deleting ----------------------------------------------------------------------
    def delete(self, rel: str) -> None:
        """Remove the object at ``rel``; nothing happens if there is none."""
        connection = self._connect()
        try:
            connection.request("DELETE", _object_path(rel))
            _answer(connection.getresponse(), rel)
        finally:
            connection.close()

    def _connect(self) -> _UnixConnection:
        return _UnixConnection(self._socket, self._away_s)


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the door's Unix socket, waiting up to ``away_s`` for a door that is closed."""

    def __init__(self, path: str, away_s: float) -> None:
        super().__init__("door", timeout=TIMEOUT_S)
        self._path = path
        self._away_s = away_s

    def connect(self) -> None:
        deadline = time.monotonic() + self._away_s
        pause = 0.05
        while True:
            try:
                self.sock = _open_socket(self._path, self.timeout)
                return
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)  # the agent is restarting: its door opens again
                pause = min(pause * 2, 2.0)


def _open_socket(path: str, timeout: float | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


class _Body:
    """An object's bytes as the door sends them; closing it closes the connection."""

    def __init__(self, response: http.client.HTTPResponse, connection: _UnixConnection) -> None:
        self._response = response
        self._connection = connection

    def read(self, size: int = -1) -> bytes:
        return self._response.read(None if size < 0 else size)

    def close(self) -> None:
        self._response.close()
        self._connection.close()

    def __enter__(self) -> _Body:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _send(connection: _UnixConnection, body: IO[bytes], size: int, rel: str) -> Any:
    """Send ``size`` bytes of ``body``; their sha256 (a hashlib object)."""
    digest = hashlib.sha256()
    left = size
    while left > 0:
        data = body.read(min(CHUNK, left))
        if not data:
            raise OSError(f"{rel}: the source ended {left} bytes early")
        digest.update(data)
        connection.send(data)
        left -= len(data)
    return digest


def _object_path(rel: str) -> str:
    return "/objects/" + quote(check_relative(rel), safe="/")


def _answer(response: http.client.HTTPResponse, rel: str) -> bytes:
    """The body of a successful answer; the matching exception for an error."""
    body = response.read()
    status = response.status
    if status < 300:
        return body
    why = body.decode("utf-8", "replace")[:500] or response.reason
    if status == 404:
        raise FileNotFoundError(f"no object {rel!r} behind the door")
    if status == 403:
        raise LinkRefused(f"{rel}: {why}")
    if status == 400:
        raise ArtifactPathError(f"{rel}: {why}")
    raise DoorError(f"{rel}: the door answered {status}: {why}")

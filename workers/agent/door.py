"""The store door: the agent serves a job's prefix of the artifact store to that job's programs.

A tenant's program gets neither a writable bind of the store nor its
credentials.  Per job on a node the agent listens on a Unix socket::

    <door root>/<id>/            the agent's, 0755, bound read-only into the job's sandboxes
        store.sock               0600, owned by the job's uid (the agent's when it is not root)

and answers the protocol of ``workers.store_door`` against the job's prefix,
with its own access to the store (a directory it walks without following
links, or S3 with its own credentials).  Nothing outside the prefix can be
named: every path passes ``check_relative`` and is resolved in the job's
child store, so ``..``, absolute paths and links planted in the prefix are
refused as they are for the agent's own uploads.  Bounds, so one program
cannot take the agent's threads or the store's space with one request: at
most ``DoorLimits.max_connections`` requests at once per job (the rest are
closed at once), ``max_object_bytes`` per object (413 before a byte is
read), an idle connection dropped after ``timeout_s``.  A request that ends
early stores nothing (the store's writes are atomic).

One thread per job accepts; each request runs in its own daemon thread, so
a slow store never delays the agent's supervision pass.
"""

from __future__ import annotations

import contextlib
import hashlib
import http
import json
import logging
import os
import shutil
import socketserver
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from workers.artifacts import CHUNK, ArtifactPathError, ArtifactStore, at_most, check_relative
from workers.beneath import LinkRefused
from workers.store_door import door_url

log = logging.getLogger(__name__)

SOCKET_NAME = "store.sock"


@dataclass(frozen=True)
class DoorLimits:
    """What one job's door allows (``SANDBOX_DOOR_*``; see the module docstring)."""

    max_connections: int = 16
    max_object_bytes: int = 64 << 30
    timeout_s: float = 120.0


def door_id(scope: str, job: str) -> str:
    """A short name for ``job``'s door of the agent ``scope`` names (its data directory and
    node: several agents may share a host); a socket's path must stay under 108 bytes."""
    return hashlib.sha256(f"{scope}\0{job}".encode()).hexdigest()[:16]


def default_root(euid: int | None = None) -> Path:
    """Where an agent keeps its doors: ``/run/portal-door`` as root, else a folder of its
    user's under the temporary directory."""
    uid = os.geteuid() if euid is None else euid
    if uid == 0:
        return Path("/run/portal-door")
    return Path(tempfile.gettempdir()) / f"portal-door-{uid}"


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str, store: ArtifactStore, limits: DoorLimits) -> None:
        self.store = store
        self.limits = limits
        self._active = threading.BoundedSemaphore(limits.max_connections)
        super().__init__(path, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._active.acquire(blocking=False):
            self.shutdown_request(request)  # too many at once: closed, not queued
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._active.release()


class _Handler(BaseHTTPRequestHandler):
    """One request on a job's door (HTTP/1.0: the connection closes after the answer)."""

    server: _Server
    server_version = "portal-store-door"

    def setup(self) -> None:
        self.request.settimeout(self.server.limits.timeout_s)
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("store door: " + format, *args)

    # -- the verbs -------------------------------------------------------------------
    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/list":
            self._answer(self._list)
        else:
            self._answer(self._get)

    def do_HEAD(self) -> None:
        self._answer(lambda: self._get(body=False))

    def do_PUT(self) -> None:
        self._answer(self._put)

    def do_DELETE(self) -> None:
        self._answer(self._delete)

    # -- what they do ----------------------------------------------------------------
    def _object(self) -> str:
        parts = urlsplit(self.path)
        if not parts.path.startswith("/objects/") or parts.query:
            raise ArtifactPathError(f"not an object: {self.path!r}")
        return check_relative(unquote(parts.path.removeprefix("/objects/")))

    def _get(self, body: bool = True) -> None:
        stream, size = self.server.store.open_sized(self._object())
        with stream:
            self.send_response(http.HTTPStatus.OK)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if body:
                for chunk in at_most(stream, size):
                    self.wfile.write(chunk)

    def _put(self) -> None:
        rel = self._object()
        size = self._length()
        stored = self.server.store.put_stream(rel, _exactly(self.rfile, size))
        self._json(http.HTTPStatus.CREATED, stored.__dict__)

    def _length(self) -> int:
        raw = self.headers.get("Content-Length")
        if raw is None or not raw.isdigit():
            raise _Refused(http.HTTPStatus.LENGTH_REQUIRED, "a PUT needs its Content-Length")
        size = int(raw)
        if size > self.server.limits.max_object_bytes:
            raise _Refused(
                http.HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"an object may hold at most {self.server.limits.max_object_bytes} bytes",
            )
        return size

    def _delete(self) -> None:
        self.server.store.delete(self._object())
        self.send_response(http.HTTPStatus.NO_CONTENT)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _list(self) -> None:
        given = parse_qs(urlsplit(self.path).query).get("prefix", [""])
        prefix = check_relative(given[0]) if given[0] else ""
        self._json(http.HTTPStatus.OK, self.server.store.list(prefix))

    # -- answers ---------------------------------------------------------------------
    def _answer(self, action: Callable[[], None]) -> None:
        """Run ``action``; an error becomes its status (nothing of it reaches the agent)."""
        try:
            action()
        except _Refused as refused:
            self._error(refused.status, refused.why)
        except ArtifactPathError as exc:
            self._error(http.HTTPStatus.BAD_REQUEST, str(exc))
        except LinkRefused as exc:
            self._error(http.HTTPStatus.FORBIDDEN, f"refused: {exc}")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self._error(http.HTTPStatus.NOT_FOUND, "no such object")
        except _ShortBody as exc:
            self._error(http.HTTPStatus.BAD_REQUEST, str(exc))
        except (OSError, ValueError) as exc:
            log.warning("store door: %s %s failed: %s", self.command, self.path, exc)
            self._error(http.HTTPStatus.BAD_GATEWAY, "the store could not do it")

    def _error(self, status: http.HTTPStatus, why: str) -> None:
        with contextlib.suppress(OSError):  # the program may have gone
            data = why.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

    def _json(self, status: http.HTTPStatus, value: object) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Refused(Exception):
    def __init__(self, status: http.HTTPStatus, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


class _ShortBody(ValueError):
    """The request's body ended before its Content-Length."""


def _exactly(source: Any, size: int) -> Iterator[bytes]:
    """``size`` bytes of a request body, or ``_ShortBody`` (so nothing is stored)."""
    left = size
    while left > 0:
        data = source.read(min(CHUNK, left))
        if not data:
            raise _ShortBody(f"the body ended {left} bytes before its Content-Length")
        left -= len(data)
        yield data


class StoreDoors:
    """This node's open doors, one per job (an adapter: sockets, threads)."""

    def __init__(self, root: Path, scope: str, limits: DoorLimits = DoorLimits()) -> None:
        self.root = root
        self.scope = scope
        self.limits = limits
        self._open: dict[str, tuple[_Server, threading.Thread]] = {}
        self._lock = threading.Lock()

    def directory(self, job: str) -> Path:
        """The folder of ``job``'s door here (bound read-only into its sandboxes)."""
        return self.root / door_id(self.scope, job)

    def open(self, job: str, store_url: str, owner: tuple[int, int] | None) -> str:
        """Serve ``store_url`` (the job's prefix) to ``job``'s programs, if not yet served;
        the store URL they use.  ``owner``: the uid and gid the socket is for."""
        with self._lock:
            if job not in self._open:
                self._open[job] = self._serve(job, store_url, owner)
        return door_url(self.directory(job) / SOCKET_NAME)

    def _serve(
        self, job: str, store_url: str, owner: tuple[int, int] | None
    ) -> tuple[_Server, threading.Thread]:
        # The folder stays as it is when a restarted agent opens the door again: running
        # sandboxes bound that very directory, so only the socket in it is replaced.  The
        # socket is made in a private folder and moved in once it is the job's alone.
        folder = self.directory(job)
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        folder.mkdir(mode=0o755, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".door-", dir=self.root))  # 0700
        try:
            made = staging / SOCKET_NAME
            server = _Server(str(made), ArtifactStore(store_url), self.limits)
            os.chmod(made, 0o600)
            if owner is not None:
                os.chown(made, *owner)
            os.replace(made, folder / SOCKET_NAME)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.5},
            daemon=True,
            name=f"door-{job}",
        )
        thread.start()
        return server, thread

    def serves(self, job: str) -> bool:
        """Whether ``job`` has a door here."""
        with self._lock:
            return job in self._open

    def close(self, job: str) -> None:
        """Close ``job``'s door and remove its folder (nothing of the job runs here)."""
        with self._lock:
            served = self._open.pop(job, None)
        if served is not None:
            server, thread = served
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        shutil.rmtree(self.directory(job), ignore_errors=True)

    def close_all(self) -> None:
        """Close every door (the agent stops)."""
        with self._lock:
            jobs = list(self._open)
        for job in jobs:
            self.close(job)

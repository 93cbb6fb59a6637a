"""The only door out of a job's network: the agent's forward to Redis.

A job's namespace (``network``) has no route to the host.  What its programs
are given to reach, the agent forwards, copying bytes between each of their
connections and one of its own:

- **Redis**, through a Unix socket in a directory bound into the sandbox
  (``open_unix``): ``unix://<job user>:<password>@<socket>?db=N``.  Redis still
  checks the job's user, so the socket grants nothing the credentials do not.

(The artifact store is not forwarded: the agent serves the job's prefix itself,
``workers.agent.door``.)

A job may hold at most ``max_connections`` at once over all its doors (the
rest are closed at once), so one program cannot use up the server's
``maxclients``.  One asyncio loop in a daemon thread serves every job of the
agent.  After an agent restart the doors are opened again (on adoption): the
programs' clients ride out the gap as they would a server's restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
DEFAULT_MAX_CONNECTIONS = 64
CHUNK = 1 << 16


@dataclass(frozen=True)
class Upstream:
    """Where the agent's own connections go: the server of its ``REDIS_URL``."""

    host: str
    port: int
    tls: bool = False
    path: str | None = None

    @classmethod
    def from_url(cls, url: str) -> Upstream:
        parts = urlsplit(url)
        if parts.scheme == "unix":
            return cls(host="", port=0, path=parts.path)
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 6379,
            tls=parts.scheme == "rediss",
        )


def socket_url(job_url: str, socket: Path) -> str:
    """``job_url``'s credentials and database, through ``socket`` (redis-py's ``unix://``)."""
    parts = urlsplit(job_url)
    database = parts.path.strip("/") or "0"
    user = quote(unquote(parts.username or ""), safe="")
    password = quote(unquote(parts.password or ""), safe="")
    return urlunsplit(("unix", f"{user}:{password}@", str(socket), f"db={database}", ""))


class Forwarder:
    """Per-job listeners, each forwarded to its upstream (see the module docstring)."""

    def __init__(self, max_connections: int = DEFAULT_MAX_CONNECTIONS):
        self.max_connections = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._servers: dict[str, dict[str, asyncio.Server]] = {}
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="job-doors", daemon=True).start()
                self._loop = loop
            return self._loop

    def open_unix(
        self, job: str, path: Path, owner: tuple[int, int] | None, upstream: Upstream
    ) -> None:
        """Listen on ``path`` for ``job`` (again, after a restart); ``owner``: (uid, gid)
        that alone may connect (None: the agent's own uid)."""
        if self.serves(job, str(path)):
            return
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._listen(
            job,
            str(path),
            lambda serve: asyncio.start_unix_server(serve, path=str(path), limit=CHUNK),
            upstream,
        )
        os.chmod(path, 0o600)
        if owner is not None:
            os.chown(path, *owner)

    def _listen(
        self,
        job: str,
        door: str,
        start: Callable[[Handler], Coroutine[Any, Any, asyncio.Server]],
        upstream: Upstream,
    ) -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(job, upstream, reader, writer)

        future = asyncio.run_coroutine_threadsafe(start(serve), self._running_loop())
        self._servers.setdefault(job, {})[door] = future.result(timeout=10)

    def serves(self, job: str, door: str | None = None) -> bool:
        """Whether ``job`` has a listener here (``door``: that one, a path or address:port)."""
        doors = self._servers.get(job, {})
        return bool(doors) if door is None else door in doors

    def close(self, job: str) -> None:
        """Stop listening for ``job`` (its open connections end with it)."""
        doors = self._servers.pop(job, {})
        if self._loop is None:
            return
        for door, server in doors.items():
            if door.startswith("/"):
                with contextlib.suppress(OSError):
                    os.unlink(door)
            asyncio.run_coroutine_threadsafe(_shut(server), self._loop).result(timeout=10)

    async def _serve(
        self,
        job: str,
        upstream: Upstream,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        if self._open.get(job, 0) >= self.max_connections:
            writer.close()
            return
        self._open[job] = self._open.get(job, 0) + 1
        try:
            up_reader, up_writer = await _connect(upstream)
        except OSError:
            self._open[job] -= 1
            writer.close()
            return
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            self._open[job] -= 1
            for end in (writer, up_writer):
                end.close()


async def _connect(up: Upstream) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if up.path is not None:
        return await asyncio.open_unix_connection(up.path, limit=CHUNK)
    tls = ssl.create_default_context() if up.tls else None
    return await asyncio.open_connection(up.host, up.port, ssl=tls, limit=CHUNK)


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy ``source`` to ``sink`` until either end closes."""
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            sink.close()


async def _shut(server: asyncio.Server) -> None:
    server.close()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(server.wait_closed(), timeout=5)

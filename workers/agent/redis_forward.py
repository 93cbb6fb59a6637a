"""The agent's Unix sockets through which a job in its own network reaches Redis.

A job's namespace (``network``) has no route to the host, so its programs
reach the portal's Redis through a socket in a directory bound into their
sandbox: ``unix://<job user>:<password>@<socket>?db=N``.  The agent copies
bytes between each connection and a TCP (or TLS) connection of its own to the
server; Redis still checks the job's user, so the socket grants nothing the
credentials do not.  A job may hold at most ``max_connections`` at once (the
rest are closed at once), so one program cannot use up the server's
``maxclients``.

One asyncio loop in a daemon thread serves every job of the agent.  After an
agent restart the sockets are made again (``open`` on adoption): the programs'
clients ride out the gap as they would a Redis restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

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
    user = quote(parts.username or "", safe="")
    password = quote(parts.password or "", safe="")
    return urlunsplit(("unix", f"{user}:{password}@", str(socket), f"db={database}", ""))


class RedisForwarder:
    """Per-job Unix sockets forwarded to ``upstream`` (see the module docstring)."""

    def __init__(self, upstream: Upstream, max_connections: int = DEFAULT_MAX_CONNECTIONS):
        self.upstream = upstream
        self.max_connections = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._servers: dict[str, asyncio.Server] = {}
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="redis-forward", daemon=True).start()
                self._loop = loop
            return self._loop

    def open(self, job: str, path: Path, owner: tuple[int, int] | None) -> None:
        """Listen on ``path`` for ``job`` (again, after a restart); ``owner``: (uid, gid)
        that alone may connect (None: the agent's own uid)."""
        if job in self._servers:
            return
        loop = self._running_loop()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_unix_server(
                lambda r, w: self._serve(job, r, w), path=str(path), limit=CHUNK
            ),
            loop,
        )
        self._servers[job] = future.result(timeout=10)
        os.chmod(path, 0o600)
        if owner is not None:
            os.chown(path, *owner)

    def serves(self, job: str) -> bool:
        """Whether ``job`` has a socket here."""
        return job in self._servers

    def close(self, job: str) -> None:
        """Stop listening for ``job`` (its open connections end with it)."""
        server = self._servers.pop(job, None)
        if server is None or self._loop is None:
            return
        for socket in server.sockets:
            with contextlib.suppress(OSError):
                os.unlink(socket.getsockname())
        asyncio.run_coroutine_threadsafe(_shut(server), self._loop).result(timeout=10)

    def close_all(self) -> None:
        for job in list(self._servers):
            self.close(job)

    async def _serve(
        self, job: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self._open.get(job, 0) >= self.max_connections:
            writer.close()
            return
        self._open[job] = self._open.get(job, 0) + 1
        try:
            up_reader, up_writer = await self._connect()
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

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        up = self.upstream
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

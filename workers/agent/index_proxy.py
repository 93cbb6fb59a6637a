"""The only network of an environment build: an HTTP proxy that reaches the operator's index alone.

A build runs tenant code (a package's build backend, ``setup.py``) in a
sandbox whose network namespace holds loopback only.  Its one way out is
this proxy, on a Unix socket bound into the sandbox (a relay inside turns it
into ``127.0.0.1:PORT`` for uv, ``workers/build_relay.py``).  It serves

- ``CONNECT host:port`` (HTTPS): a tunnel, if ``(host, port)`` is allowed;
- ``GET http://host[:port]/path`` (plain HTTP): sent on with
  ``Connection: close`` (one request per connection, so a kept-alive
  connection cannot be reused for another host), if allowed;

and answers anything else ``403`` naming what was refused.  The allowed
hosts are the operator's (``allowed_hosts``): the hosts of the configured
index URLs, their well-known file hosts, and ``ENVIRONMENT_NETWORK_ALLOW``.
A host is matched by name, before any resolution, and the proxy resolves it
itself: the build cannot reach an address by naming it.  An operator's own
upstream proxy (the agent's ``HTTPS_PROXY``) is used in turn for tunnels.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from workers.build_relay import relay

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
CHUNK = 1 << 16
CONNECT_TIMEOUT_S = 30.0
PYPI_HOSTS = (("pypi.org", 443), ("files.pythonhosted.org", 443))
"""uv's default index and the host its files are served from."""
Host = tuple[str, int]


class Refused(ValueError):
    """A request the proxy does not carry: the reason goes back as the answer's body."""


@dataclass(frozen=True)
class Request:
    """The head of one proxied request: where it goes and how to send it on."""

    host: str
    port: int
    tunnel: bool
    head: bytes = b""
    """For plain HTTP: the head to send upstream (origin-form, ``Connection: close``)."""


def allowed_hosts(
    index_url: str, extra_index_urls: Iterable[str], find_links: str, no_index: bool,
    extra: Iterable[str] = (),
) -> frozenset[Host]:  # fmt: skip
    """The hosts a build may reach: each URL's host (a local path or ``file://`` needs
    none), PyPI's two when uv's default index is in use, and ``extra`` (``host[:port]``)."""
    urls = [*extra_index_urls, find_links]
    hosts: set[Host] = set()
    if not no_index:
        urls.append(index_url)
        if not index_url:
            hosts.update(PYPI_HOSTS)
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.hostname:
            hosts.add((parts.hostname.lower(), parts.port or _default_port(parts.scheme)))
    for item in extra:
        hosts.add(parse_host(item, 443))
    return frozenset(hosts)


def parse_host(text: str, default_port: int) -> Host:
    """``host`` or ``host:port`` (``[v6]:port``) as a pair; ValueError when malformed."""
    parts = urlsplit(f"//{text.strip()}")
    try:
        port = parts.port or default_port
    except ValueError:
        raise ValueError(f"{text!r} is not host[:port]") from None
    if not parts.hostname or parts.path or parts.username or parts.query:
        raise ValueError(f"{text!r} is not host[:port]")
    return parts.hostname.lower(), port


def parse_request(head: bytes, allowed: frozenset[Host]) -> Request:
    """The request a build sent, if it goes to an allowed host; Refused otherwise (pure)."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise Refused("the request's head is not ASCII") from None
    lines = text.split("\r\n")
    words = lines[0].split(" ")
    if len(words) != 3 or not words[2].startswith("HTTP/1."):
        raise Refused(f"not an HTTP/1 request line: {lines[0][:100]!r}")
    method, target, version = words
    if method == "CONNECT":
        host = parse_host(target, 443) if ":" in target else None
        if host is None:
            raise Refused(f"CONNECT needs host:port, not {target[:100]!r}")
        _check(host, allowed)
        return Request(host=host[0], port=host[1], tunnel=True)
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise Refused(f"a proxied request names an http:// URL, not {target[:100]!r}")
    try:
        host = (parts.hostname.lower(), parts.port or 80)
    except ValueError:
        raise Refused(f"{target[:100]!r} has no valid port") from None
    _check(host, allowed)
    path = parts.path or "/"
    if parts.query:
        path += f"?{parts.query}"
    kept = [
        line
        for line in lines[1:]
        if line
        and line.split(":", 1)[0].strip().lower()
        not in ("connection", "proxy-connection", "proxy-authorization", "keep-alive")
    ]
    out = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""])
    return Request(host=host[0], port=host[1], tunnel=False, head=out.encode("ascii"))


def _check(host: Host, allowed: frozenset[Host]) -> None:
    if host not in allowed:
        raise Refused(f"{host[0]}:{host[1]} is not the operator's package index")


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


# --------------------------------------------------------------------------- the adapter


class IndexProxy:
    """The proxy of one build, listening on ``path`` while its ``with`` block runs.

    ``owner``: the (uid, gid) that alone may connect (the build's; None: the
    agent's).  ``refused`` lists what the build asked for and did not get, for
    its log.  ``upstream``: the operator's own proxy (``host:port``), if any.
    """

    def __init__(
        self,
        path: Path,
        allowed: frozenset[Host],
        owner: tuple[int, int] | None = None,
        upstream: str | None = None,
        public_only: frozenset[Host] = frozenset(),
    ) -> None:
        self.path = path
        self.allowed = allowed
        self.public_only = public_only
        """Allowed hosts a job named (its own index): reached only at a public address."""
        self.owner = owner
        self.upstream = parse_host(upstream, 3128) if upstream else None
        self.refused: list[str] = []
        self._server: socketserver.ThreadingUnixStreamServer | None = None

    def __enter__(self) -> IndexProxy:
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy.serve(self.request)

        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        server.daemon_threads = True
        os.chmod(self.path, 0o600)
        if self.owner is not None:
            os.chown(self.path, *self.owner)
        threading.Thread(target=server.serve_forever, name="index-proxy", daemon=True).start()
        self._server = server
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def serve(self, client: socket.socket) -> None:
        """One connection of the build's: refuse it, or carry it to its host."""
        try:
            head, rest = _read_head(client)
            request = parse_request(head, self.allowed)
        except Refused as refused:
            self.refused.append(str(refused))
            _answer(client, 403, str(refused))
            return
        except OSError:
            return
        try:
            upstream = self._open(request)
        except OSError as exc:
            _answer(client, 502, f"{request.host}:{request.port}: {exc}")
            return
        with upstream:
            if request.tunnel:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(request.head)
            if rest:
                upstream.sendall(rest)
            relay(client, upstream)

    def _open(self, request: Request) -> socket.socket:
        if (request.host, request.port) in self.public_only:
            return _connect_public(request.host, request.port)
        if self.upstream is None or not request.tunnel:
            return socket.create_connection((request.host, request.port), CONNECT_TIMEOUT_S)
        conn = socket.create_connection(self.upstream, CONNECT_TIMEOUT_S)
        target = f"{request.host}:{request.port}"
        conn.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head, _rest = _read_head(conn)
        if b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
            conn.close()
            raise OSError(f"the upstream proxy refused: {head[:100]!r}")
        return conn


def public_addresses(infos: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The ``getaddrinfo`` answers that are global addresses (not loopback, private,
    link-local such as the metadata address, or reserved): pure."""
    return [info for info in infos if ipaddress.ip_address(info[4][0]).is_global]


def _connect_public(host: str, port: int) -> socket.socket:
    """A connection to ``host`` at one of its public addresses (a job named it: it must not
    lead to the node's loopback, the cluster's network or the metadata address)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    public = public_addresses(infos)
    if not public:
        raise OSError(f"{host} resolves to no public address")
    family, kind, proto, _, address = public[0]
    conn = socket.socket(family, kind, proto)
    conn.settimeout(CONNECT_TIMEOUT_S)
    try:
        conn.connect(address)
    except OSError:
        conn.close()
        raise
    conn.settimeout(None)
    return conn


def _read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    """The head (through the blank line) and what came after it; Refused past the bound."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            raise Refused(f"a request head over {MAX_HEAD_BYTES} bytes")
        chunk = conn.recv(4096)
        if not chunk:
            raise OSError("closed before the request's head ended")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _answer(client: socket.socket, status: int, body: str) -> None:
    text = body.encode("utf-8", errors="replace") + b"\n"
    reason = {403: "Forbidden", 502: "Bad Gateway"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(text)}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        client.sendall(head.encode() + text)

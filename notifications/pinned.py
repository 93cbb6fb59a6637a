"""One HTTP/1.1 POST to the very address that was checked, within one deadline.

A general HTTP client resolves the host itself, after any check of ours (DNS
rebinding), follows what it is told, and times each read, not the whole
exchange. This one does only what a webhook needs::

    resolve once ─▶ every address allowed? (notifications.addresses) ─▶ connect to that IP
      ─▶ TLS with SNI and certificate check for the URL's host ─▶ POST, Host: the URL's host
      ─▶ read the status line and headers (at most RESPONSE_MAX_BYTES) ─▶ close

The whole exchange, connection and TLS included, ends by one deadline; a
redirect is just a status (never followed); the response body is never read.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from notifications.addresses import IPAddress, IPNetwork, checked_addresses

RESPONSE_MAX_BYTES = 16 * 1024
"""The most of an answer read: its status line and headers (the body is never read)."""


class PostError(OSError):
    """An attempt that got no HTTP status: refused address, timeout, TLS, connection, garbage."""


@dataclass(frozen=True)
class Target:
    """Where a URL points: scheme, host (for Host and SNI), port and request path."""

    https: bool
    host: str
    port: int
    path: str

    @classmethod
    def of(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PostError(f"not an http(s) URL: {url[:100]!r}")
        https = parts.scheme == "https"
        try:
            port = parts.port or (443 if https else 80)
        except ValueError:
            raise PostError("the URL's port is not a number from 0 to 65535") from None
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(https, parts.hostname, port, path)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.https else 80
        return host if self.port == default else f"{host}:{self.port}"


def post(
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    deadline_s: float,
    allowed: Sequence[IPNetwork] = (),
) -> int:
    """POST ``body`` to ``url`` once and return the HTTP status; PostError when there is none."""
    end = time.monotonic() + deadline_s
    target = Target.of(url)
    addresses = _checked_within(target, allowed, end)
    request = _request(target, body, headers)
    last: Exception | None = None
    for address in addresses:
        try:
            with _connect(str(address), target, end) as conn:
                _send_all(conn, request, end)
                return _read_status(conn, end)
        except PostError:
            raise
        except (OSError, ssl.SSLError) as exc:
            last = exc
            if _left(end) <= 0:
                break
    kind = type(last).__name__ if last else "Timeout"
    raise PostError(f"{kind}: {last or 'no time left'}")


def _checked_within(target: Target, allowed: Sequence[IPNetwork], end: float) -> list[IPAddress]:
    """The host's checked addresses, resolved in a helper thread so the deadline holds.

    ``getaddrinfo`` takes no timeout: a resolver that never answers would hold
    the attempt past its deadline. The thread is left to finish on its own.
    """
    found: list[list[IPAddress] | BaseException] = []
    done = threading.Event()

    def work() -> None:
        try:
            found.append(checked_addresses(target.host, target.port, allowed))
        except BaseException as exc:  # handed to the caller
            found.append(exc)
        finally:
            done.set()

    threading.Thread(target=work, name="webhook-resolve", daemon=True).start()
    if not done.wait(_timeout(end)):
        raise PostError(f"timed out resolving {target.host!r}")
    result = found[0]
    if isinstance(result, ValueError):
        raise PostError(str(result)) from None
    if isinstance(result, BaseException):
        raise PostError(f"{type(result).__name__}: {result}") from None
    return result


def _left(end: float) -> float:
    return end - time.monotonic()


def _timeout(end: float) -> float:
    left = _left(end)
    if left <= 0:
        raise PostError("timed out: the delivery's deadline passed")
    return left


def _connect(address: str, target: Target, end: float) -> socket.socket:
    sock = socket.create_connection((address, target.port), timeout=_timeout(end))
    if not target.https:
        return sock
    context = ssl.create_default_context()
    sock.settimeout(_timeout(end))
    try:
        return context.wrap_socket(sock, server_hostname=target.host)
    except BaseException:
        sock.close()
        raise


def _request(target: Target, body: bytes, headers: Mapping[str, str]) -> bytes:
    lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.host_header}"]
    for name, value in headers.items():
        if "\r" in name + value or "\n" in name + value:
            raise PostError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}")
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


def _send_all(conn: socket.socket, data: bytes, end: float) -> None:
    view = memoryview(data)
    while view:
        conn.settimeout(_timeout(end))
        sent = conn.send(view)
        view = view[sent:]


def _read_status(conn: socket.socket, end: float) -> int:
    """The status of the answer, from its first line; headers read up to the cap, no body."""
    received = b""
    while b"\r\n" not in received:
        if len(received) >= RESPONSE_MAX_BYTES:
            raise PostError(f"no status line in the first {RESPONSE_MAX_BYTES} bytes")
        conn.settimeout(_timeout(end))
        chunk = conn.recv(RESPONSE_MAX_BYTES - len(received))
        if not chunk:
            break
        received += chunk
    line = received.split(b"\r\n", 1)[0]
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise PostError(f"not an HTTP answer: {line[:80]!r}")
    status = int(parts[1])
    if not 100 <= status <= 599:
        raise PostError(f"not an HTTP status: {status}")
    return status

"""Request bodies are refused (413) past their limit before they are stored: issue 35.

Anyone, signed in or not, could fill the disk: daphne spools a whole body (to a temporary
file past 100 kB) before the application, and so before authentication, sees a byte of
it, and a chunked body declares no length for any check to refuse. Here:

- daphne's own request, as ``portal.asgi`` makes daphne build it, driven in-process
  (Twisted's HTTP parser on a test transport);
- the ASGI middleware, for servers that stream bodies to the application;
- a real ``daphne`` process: a chunked body over the limit is a 413, and no temporary
  file was opened for it.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import daphne.server
import pytest
from django.test import override_settings
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

import portal.asgi
from devtools.stack import ROOT, free_port
from portal.body_limit import (
    DRAIN_BYTES,
    SPOOL_MEMORY_BYTES,
    BodyLimitMiddleware,
    limit_for,
    upload_paths,
)

LIMIT = 64 * 1024
UPLOAD = 256 * 1024
SMALL = override_settings(MAX_REQUEST_BODY_BYTES=LIMIT, MAX_UPLOAD_BODY_BYTES=UPLOAD)


def chunked(data: bytes, size: int = 8192) -> bytes:
    """``data`` in chunked transfer coding, without the final zero-length chunk."""
    return b"".join(
        b"%x\r\n%s\r\n" % (len(data[i : i + size]), data[i : i + size])
        for i in range(0, len(data), size)
    )


def head(method: str, path: str, *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]
    return "\r\n".join(lines).encode()


# --------------------------------------------------------------------------- the policy


def test_code_uploads_alone_get_the_larger_allowance() -> None:
    assert upload_paths() == {"/api/v1/code/", "/code/", "/jobs/new/"}
    with SMALL:
        for path in ("/api/v1/code/", "/code/", "/jobs/new/"):
            assert limit_for("POST", path) == UPLOAD
            assert limit_for("PUT", path) == LIMIT
        for path in ("/api/v1/jobs/", "/login/", "/api/v1/code", "/api/v1/code/x/"):
            assert limit_for("POST", path) == LIMIT


def test_the_upload_allowance_holds_the_largest_archive(settings: Any) -> None:
    assert settings.MAX_UPLOAD_BODY_BYTES >= settings.CODE_MAX_BYTES + settings.API_MAX_JSON_BYTES
    assert settings.MAX_REQUEST_BODY_BYTES >= settings.DATA_UPLOAD_MAX_MEMORY_SIZE


# --------------------------------------------------------------------------- daphne


class Server:
    """What daphne's request asks of its server; records the applications it starts."""

    proxy_forwarded_address_header = None
    root_path = ""
    request_buffer_size = 8192

    def __init__(self) -> None:
        self.started: list[tuple[dict[str, Any], queue.Queue[dict[str, Any]]]] = []

    def protocol_connected(self, protocol: Any) -> None:
        pass

    def protocol_disconnected(self, protocol: Any) -> None:
        pass

    def create_application(self, protocol: Any, scope: dict[str, Any]) -> Any:
        inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.started.append((scope, inbox))
        return inbox

    def body_of(self, index: int = 0) -> bytes:
        inbox = self.started[index][1]
        parts = []
        while not inbox.empty():
            parts.append(inbox.get_nowait()["body"])
        return b"".join(parts)


class Connection:
    """One client connection to daphne's HTTP protocol, as the portal's server builds it."""

    def __init__(self) -> None:
        self.server = Server()
        self.clock = Clock()
        factory = daphne.server.HTTPFactory(self.server)
        self.protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        self.channel = self.protocol._channel  # Twisted's HTTP/1.1 channel inside
        self.channel.callLater = self.clock.callLater
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "10.0.0.9", 5555))
        self.protocol.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    @property
    def answer(self) -> bytes:
        return bytes(self.transport.value())


@pytest.fixture
def temp_files(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every temporary file opened (Twisted's spool, and a spooled file's rollover)."""
    opened: list[Any] = []
    real = tempfile.TemporaryFile

    def recording(*args: Any, **kwargs: Any) -> Any:
        made = real(*args, **kwargs)
        opened.append(made)
        return made

    monkeypatch.setattr(tempfile, "TemporaryFile", recording)
    return opened


def assert_refused(answer: bytes, limit: int) -> None:
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 413 Content Too Large", answer[:200]
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"Connection: close" in headers
    assert json.loads(body) == {
        "message": f"The request body is over the limit of {limit} bytes.",
        "errors": {},
    }


@SMALL
def test_daphne_refuses_a_chunked_body_as_it_passes_the_limit(temp_files: list[Any]) -> None:
    conn = Connection()
    conn.send(head("POST", "/api/v1/jobs/", "Transfer-Encoding: chunked"))
    conn.send(chunked(b"x" * LIMIT))  # exactly the limit: still counting
    assert conn.answer == b""
    conn.send(chunked(b"x"))  # one byte more
    assert_refused(conn.answer, LIMIT)
    assert conn.server.started == []  # the application never ran
    assert temp_files == []  # nothing went to disk
    request = conn.channel.requests[-1]
    assert request.content.getvalue() == b""  # what was kept is gone
    # The client may go on sending: read and dropped, never stored, then the door closes.
    conn.send(chunked(b"y" * (DRAIN_BYTES + 10)))
    assert conn.transport.disconnecting
    assert temp_files == [] and conn.server.started == []


@SMALL
def test_daphne_refuses_a_declared_length_over_the_limit_with_the_headers(
    temp_files: list[Any],
) -> None:
    conn = Connection()
    conn.send(head("POST", "/login/", f"Content-Length: {10**12}", "Expect: 100-continue"))
    assert_refused(conn.answer, LIMIT)  # and no "100 Continue" before or after it
    assert b"100 Continue" not in conn.answer
    assert temp_files == [] and conn.server.started == []
    conn.clock.advance(10)  # a client that sends nothing more is not waited for
    assert conn.transport.disconnecting


@SMALL
def test_daphne_passes_bodies_within_the_limit(temp_files: list[Any]) -> None:
    conn = Connection()
    conn.send(head("POST", "/api/v1/jobs/", "Transfer-Encoding: chunked"))
    conn.send(chunked(b"a" * LIMIT) + b"0\r\n\r\n")
    assert conn.answer == b""
    assert len(conn.server.started) == 1
    scope, _ = conn.server.started[0]
    assert (scope["method"], scope["path"]) == ("POST", "/api/v1/jobs/")
    assert conn.server.body_of() == b"a" * LIMIT
    assert temp_files == []  # under SPOOL_MEMORY_BYTES: in memory
    assert LIMIT < SPOOL_MEMORY_BYTES


@SMALL
def test_daphne_gives_code_uploads_their_allowance(temp_files: list[Any]) -> None:
    body = b"z" * (UPLOAD - 10)
    conn = Connection()
    conn.send(head("POST", "/api/v1/code/", f"Content-Length: {len(body)}") + body)
    assert conn.answer == b""
    assert conn.server.body_of() == body
    temp_files.clear()  # that one was over 100 kB: Twisted's file, within the allowance
    over = Connection()
    over.send(head("POST", "/api/v1/code/", "Transfer-Encoding: chunked"))
    over.send(chunked(b"z" * (UPLOAD + 1)))
    assert_refused(over.answer, UPLOAD)
    assert over.server.started == []
    # A larger chunked upload spilled to one temporary file, closed once refused.
    assert len(temp_files) == 1 and temp_files[0].closed


# --------------------------------------------------------------------------- ASGI


class Recorder:
    """An ASGI application that reads its whole body, then answers 200."""

    def __init__(self) -> None:
        self.body = b""
        self.disconnected = False
        self.called = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.called = True
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                await send({"type": "http.response.start", "status": 499, "headers": []})
                return
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def run_asgi(app: Any, path: str, chunks: list[bytes], headers: list[Any] | None = None) -> Any:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": headers or [],
        "query_string": b"",
    }
    messages = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    given = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal given
        if given < len(messages):
            given += 1
            return messages[given - 1]
        await asyncio.sleep(3600)  # the client sends nothing more
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=10))
    return sent, given


@SMALL
def test_the_middleware_refuses_a_streamed_body_before_the_application_reads_past_it() -> None:
    inner = Recorder()
    sent, given = run_asgi(BodyLimitMiddleware(inner), "/api/v1/jobs/", [b"x" * 40_000] * 5)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [413]
    assert json.loads(sent[-1]["body"])["message"].endswith(f"limit of {LIMIT} bytes.")
    assert len(inner.body) <= LIMIT and inner.disconnected  # told the client left
    assert given == 2  # nothing was read past the chunk that crossed the limit


@SMALL
def test_the_middleware_refuses_a_declared_length_before_calling_the_application() -> None:
    inner = Recorder()
    headers = [(b"content-length", str(LIMIT + 1).encode())]
    sent, given = run_asgi(BodyLimitMiddleware(inner), "/login/", [b"x"], headers)
    assert sent[0]["status"] == 413 and not inner.called and given == 0


@SMALL
def test_the_middleware_passes_bodies_within_the_limit_and_other_scopes() -> None:
    inner = Recorder()
    sent, _ = run_asgi(BodyLimitMiddleware(inner), "/code/", [b"x" * 100_000, b"y" * 100_000])
    assert sent[0]["status"] == 200 and len(inner.body) == 200_000  # an upload's allowance


@SMALL
def test_django_behind_the_middleware_never_spools_past_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The portal's own ASGI application: Django's handler reads (and spools) the body
    before any view or authentication; it is handed no byte past the limit."""
    written: list[int] = []
    real = tempfile.SpooledTemporaryFile

    class Counting(real):  # type: ignore[misc, valid-type]
        def write(self, data: Any) -> int:
            written.append(len(data))
            return int(super().write(data))

    monkeypatch.setattr(tempfile, "SpooledTemporaryFile", Counting)
    sent, _ = run_asgi(portal.asgi.application, "/api/v1/jobs/", [b"{" * 30_000] * 10)
    assert sent[0]["status"] == 413
    assert sum(written) <= LIMIT


# --------------------------------------------------------------------------- a real daphne


@pytest.fixture
def daphne_process(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes], Path]]:
    """``python -m daphne portal.asgi:application`` as the image runs it, small limits."""
    spool = tmp_path / "spool"
    spool.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings.dev",
        "DEBUG": "0",
        "SECRET_KEY": "body-limit-test-key-" + "x" * 40,
        "ALLOWED_HOSTS": "127.0.0.1",
        "PORTAL_DATA_DIR": str(tmp_path),
        "MAX_REQUEST_BODY_BYTES": str(LIMIT),
        "TMPDIR": str(spool),
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    log = (tmp_path / "daphne.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "portal.asgi:application"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, (tmp_path / "daphne.log").read_text()
                assert time.monotonic() < deadline, "daphne did not listen within 60 s"
                time.sleep(0.2)
        yield port, process, spool
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def open_spool_files(pid: int, spool: Path) -> list[str]:
    """Files under ``spool`` that process ``pid`` holds open (unlinked ones included)."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(spool)):
            found.append(target)
    return found


def read_answer(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            part = sock.recv(65536)
            if not part:
                break
            data += part
    except TimeoutError:
        pass
    return data


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="reads /proc/<pid>/fd")
def test_a_real_daphne_refuses_a_chunked_body_without_spooling_it(
    daphne_process: tuple[int, subprocess.Popen[bytes], Path],
) -> None:
    port, process, spool = daphne_process
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head("POST", "/api/v1/jobs/", "Transfer-Encoding: chunked"))
        time.sleep(0.5)  # the headers are in: daphne has made its place for the body
        assert open_spool_files(process.pid, spool) == []
        sock.sendall(chunked(b"x" * (LIMIT + 1)))  # no final chunk: the body never ends
        answer = read_answer(sock)
        assert_refused(answer, LIMIT)
        assert open_spool_files(process.pid, spool) == []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head("PUT", "/api/v1/jobs/1/", f"Content-Length: {10**15}"))
        assert_refused(read_answer(sock), LIMIT)
    # A code upload's allowance: past the default limit, the body reaches the application
    # (which asks who is sending it: no credentials here).
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head("POST", "/api/v1/code/", "Transfer-Encoding: chunked"))
        sock.sendall(chunked(b"x" * (4 * LIMIT)) + b"0\r\n\r\n")
        answer = read_answer(sock)
        assert answer.split(b"\r\n", 1)[0] in (
            b"HTTP/1.1 401 Unauthorized",
            b"HTTP/1.1 403 Forbidden",
        )
    assert process.poll() is None

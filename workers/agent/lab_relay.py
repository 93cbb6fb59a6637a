"""The agent's end of one session's lab: Redis streams to Jupyter's Unix socket and back.

::

    agent:<node>:lab:<job>:in ──XREAD── LabRelay.run ──┬─ h/b/e ──> _HttpExchange (a thread)
                                                      │              HTTP/1.1 over lab.sock
                                                      └─ o/w/c/p ─> _WsExchange (two threads)
                                                                     WebSocket over lab.sock
    agent:<node>:lab:<job>:out:<x> <──XADD── each exchange's answer (workers.lab_protocol)

``lab.sock`` lives in the worker's scratch folder, which the tenant's program writes: it
is never followed as a link.  Every connection opens it ``O_PATH | O_NOFOLLOW`` beneath the
job's directory (``workers.beneath``: no component on the way may be a link either),
checks that what it got is a socket with one name (not a link, not a hard link to someone
else's socket), and connects through ``/proc/self/fd/<n>``: the inode checked is the one
connected to.  Jupyter gets its token from the relay on every request (the browser never
does, ``TokenScrubber``), and never the portal's cookies or CSRF headers
(``forwarded_request_headers``).

Every ``ACTIVITY_EVERY_S`` the relay reads Jupyter's ``/api/status`` and hands the result
to ``on_activity`` (the agent sends it to the portal as a ``LabActivity`` report).
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import logging
import os
import queue
import socket
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
import websocket

from workers import beneath
from workers.lab_protocol import (
    HEAD_WAIT_S,
    LAB_STREAM_MAXLEN,
    LAB_STREAM_TTL_S,
    MAX_CHUNK,
    MAX_REQUEST_BODY_BYTES,
    WS_SILENT_S,
    Entry,
    LabFrameError,
    MessageJoiner,
    TokenScrubber,
    encode_headers,
    forwarded_request_headers,
    lab_in_key,
    lab_out_key,
    message_entries,
    parse_in,
    returned_response_headers,
)
from workers.protocol import shell_entries

log = logging.getLogger(__name__)

LAB_SOCKET = "lab.sock"
CONNECT_TIMEOUT_S = 10.0
RESPONSE_TIMEOUT_S = 300.0
BODY_WAIT_S = 60.0
"""How long an HTTP exchange waits for the next piece of its request body."""
MAX_EXCHANGES = 128
"""Exchanges one lab serves at once; one more fails at once (the browser retries)."""
QUEUE_ENTRIES = 512


class LabUnreachable(OSError):
    """Jupyter cannot be reached: no socket yet, or what is there is not one to trust."""


def connect_lab(job_dir: Path, worker_id: str, timeout: float = CONNECT_TIMEOUT_S) -> socket.socket:
    """A connected socket to ``job_dir/scratch/<worker_id>/lab.sock``, never through a link.

    Raises ``beneath.LinkRefused`` for a link anywhere below ``job_dir``, ``LabUnreachable``
    for something that is not a socket of one name, ``FileNotFoundError`` while Jupyter has
    not bound it yet and ``ConnectionRefusedError`` when nothing listens on it.
    """
    with beneath.directory(str(job_dir), ["scratch", worker_id]) as scratch:
        fd = os.open(LAB_SOCKET, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=scratch)
        try:
            found = os.fstat(fd)
            if stat.S_ISLNK(found.st_mode):
                raise beneath.LinkRefused(
                    errno.ELOOP, "a symbolic link, never followed", f"scratch/{worker_id}/lab.sock"
                )
            if not stat.S_ISSOCK(found.st_mode):
                raise LabUnreachable(f"scratch/{worker_id}/{LAB_SOCKET} is not a socket")
            if found.st_nlink != 1:
                raise LabUnreachable(f"scratch/{worker_id}/{LAB_SOCKET} has other names")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.settimeout(timeout)
            try:
                sock.connect(f"/proc/self/fd/{fd}")
            except BaseException:
                sock.close()
                raise
            return sock
        finally:
            os.close(fd)


Connect = Callable[[], socket.socket]


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a socket that ``connect_lab`` opened."""

    def __init__(self, connect: Connect, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._open = connect

    def connect(self) -> None:
        """The lab's socket, checked (never a TCP connection)."""
        self.sock = self._open()
        self.sock.settimeout(self.timeout)


@dataclass(frozen=True)
class LabStatus:
    """What Jupyter's ``/api/status`` says: its last activity (Unix time), clients, kernels."""

    last_activity: float
    connections: int
    kernels: int


def parse_status(body: bytes) -> LabStatus:
    """``/api/status``'s JSON as a ``LabStatus``; ValueError when it is not one."""
    data = json.loads(body[:65536])
    if not isinstance(data, dict):
        raise ValueError("the status is not a JSON object")
    stamp = str(data.get("last_activity") or data.get("started") or "")
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    connections, kernels = data.get("connections", 0), data.get("kernels", 0)
    if not isinstance(connections, int) or not isinstance(kernels, int):
        raise ValueError("connections and kernels must be numbers")
    return LabStatus(last_activity=when, connections=max(0, connections), kernels=max(0, kernels))


class LabRelay:
    """Serves one session's lab: reads its ``in`` stream, runs its exchanges, polls status."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        node: str,
        job: str,
        job_dir: Path,
        worker_id: str,
        token: str,
        base_url: str,
        on_activity: Callable[[LabStatus], object] = lambda status: None,
        activity_every_s: float = 30.0,
    ) -> None:
        self.client = client
        self.node, self.job = node, job
        self.in_key = lab_in_key(node, job)
        self.token = token
        self.base_url = base_url
        self.on_activity = on_activity
        self.activity_every_s = activity_every_s
        self.connect: Connect = lambda: connect_lab(job_dir, worker_id)
        self.exchanges: dict[str, _Exchange] = {}
        self.stopping = threading.Event()
        self.dropped = 0
        self._thread: threading.Thread | None = None
        self._start_id = "0-0"
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        """Serve in a thread of its own (idempotent), from the entries of the last
        ``HEAD_WAIT_S`` on: the portal still awaits those (a request sent while the lab was
        starting, before this relay existed), and has given up on older ones.  The window is
        read off Redis's clock, which wrote the entries' ids."""
        if self._thread is None:
            seconds, micros = self.client.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            self._start_id = f"{max(0, now_ms - int(HEAD_WAIT_S * 1000))}-0"
            self._thread = threading.Thread(target=self.run, name=f"lab-{self.job}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop serving: every open exchange is ended."""
        self.stopping.set()
        with self._lock:
            exchanges = list(self.exchanges.values())
        for exchange in exchanges:
            exchange.abort()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def run(self) -> None:
        """Read the ``in`` stream until stopped; poll Jupyter's status on the way."""
        last = self._start_id
        next_poll = time.monotonic()
        while not self.stopping.is_set():
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.activity_every_s
                self.poll_status()
            try:
                answer = self.client.xread({self.in_key: last}, count=200, block=500)
            except redis.RedisError:
                log.exception("lab of %s: reading its stream failed", self.job)
                self.stopping.wait(1.0)
                continue
            for entry_id, fields in shell_entries(answer):
                last = entry_id
                self.dispatch(fields)

    def poll_status(self) -> LabStatus | None:
        """Jupyter's status now, handed to ``on_activity`` (None while it cannot say)."""
        try:
            status, _headers, body = self.request("GET", f"{self.base_url}api/status")
            if status != 200:
                return None
            found = parse_status(body)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            log.debug("lab of %s: no status: %s", self.job, exc)
            return None
        self.on_activity(found)
        return found

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, Any, bytes]:
        """One small request of the relay's own (status, headers, body)."""
        connection = _UnixHTTPConnection(self.connect, CONNECT_TIMEOUT_S)
        try:
            connection.request(
                method,
                path,
                body=body or None,
                headers=dict(forwarded_request_headers([], self.token)),
            )
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read(1024 * 1024)
        finally:
            connection.close()

    # ------------------------------------------------------------------ entries
    def dispatch(self, fields: Mapping[bytes, bytes]) -> None:
        """One entry of the ``in`` stream to its exchange; a bad one is dropped and counted."""
        try:
            entry = parse_in(fields, self.base_url)
        except LabFrameError as exc:
            self.dropped += 1
            log.warning("lab of %s: dropped an entry: %s", self.job, exc)
            return
        with self._lock:
            self.exchanges = {x: e for x, e in self.exchanges.items() if e.alive}
            exchange = self.exchanges.get(entry.exchange)
            if exchange is None and entry.type in ("h", "o"):
                out = _Output(self.client, lab_out_key(self.node, self.job, entry.exchange))
                if len(self.exchanges) >= MAX_EXCHANGES:
                    out.emit({"t": "f", "r": f"the lab serves {MAX_EXCHANGES} requests already"})
                    return
                kind = _HttpExchange if entry.type == "h" else _WsExchange
                exchange = kind(self, entry, out)
                self.exchanges[entry.exchange] = exchange
                exchange.begin()
                return
        if exchange is not None:
            exchange.put(entry)


class _Output:
    """One exchange's answer stream, trimmed and expiring."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client = client
        self.key = key

    def emit(self, fields: Mapping[str, bytes | str]) -> None:
        entry: dict[Any, Any] = dict(fields)
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.key, entry, maxlen=LAB_STREAM_MAXLEN, approximate=True)
        pipe.expire(self.key, LAB_STREAM_TTL_S)
        pipe.execute()


class _Exchange:
    """One request or WebSocket in flight: its entries queue up for its thread."""

    def __init__(self, relay: LabRelay, first: Entry, out: _Output) -> None:
        self.relay = relay
        self.first = first
        self.out = out
        self.inbox: queue.Queue[Entry] = queue.Queue(QUEUE_ENTRIES)
        self.done = threading.Event()

    @property
    def alive(self) -> bool:
        return not self.done.is_set()

    def put(self, entry: Entry) -> None:
        """An entry for this exchange; ``c`` (the client left) ends it at once, even while its
        response is still streaming."""
        if entry.type == "c":
            self.abort()
            return
        try:
            self.inbox.put_nowait(entry)
        except queue.Full:  # a client that floods its own exchange loses it
            self.abort()

    def begin(self) -> None:
        threading.Thread(
            target=self._run, name=f"lab-x-{self.first.exchange[:8]}", daemon=True
        ).start()

    def _run(self) -> None:
        try:
            self.serve()
        except (
            OSError,
            redis.RedisError,
            http.client.HTTPException,
            websocket.WebSocketException,
            ValueError,
        ) as exc:
            log.info("lab of %s: exchange %s failed: %s", self.relay.job, self.first.exchange, exc)
            with contextlib.suppress(redis.RedisError):
                self.out.emit({"t": "f", "r": _reason(exc)})
        finally:
            self.done.set()

    def serve(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        self.done.set()
        with contextlib.suppress(queue.Full):
            self.inbox.put_nowait(Entry("c", self.first.exchange))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
        return "the lab is starting"
    if isinstance(exc, beneath.LinkRefused | LabUnreachable):
        return "the lab's socket is not to be trusted"
    return f"{type(exc).__name__}: {exc}"[:300]


class _HttpExchange(_Exchange):
    """An HTTP request: its body gathered (bounded), sent, the response streamed back."""

    def serve(self) -> None:
        body = bytearray()
        while True:
            try:
                entry = self.inbox.get(timeout=BODY_WAIT_S)
            except queue.Empty:
                raise TimeoutError("the request's body stopped arriving") from None
            if entry.type == "c":
                return
            if entry.type == "e":
                break
            if entry.type == "b":
                body += entry.data
                if len(body) > MAX_REQUEST_BODY_BYTES:
                    self.out.emit({"t": "h", "s": "413", "hd": "[]"})
                    self.out.emit({"t": "e"})
                    return
        self.forward(bytes(body))

    def forward(self, body: bytes) -> None:
        first = self.first
        relay = self.relay
        connection = _UnixHTTPConnection(relay.connect, RESPONSE_TIMEOUT_S)
        try:
            connection.putrequest(first.method, first.path, skip_accept_encoding=True)
            for name, value in forwarded_request_headers(first.headers, relay.token):
                connection.putheader(name, value)
            if body or first.method in ("POST", "PUT", "PATCH"):
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body or None)
            response = connection.getresponse()
            headers = returned_response_headers(response.getheaders())
            self.out.emit({"t": "h", "s": str(response.status), "hd": encode_headers(headers)})
            scrubber = TokenScrubber(relay.token.encode())
            while not self.done.is_set():
                data = response.read1(MAX_CHUNK)
                if not data:
                    break
                clean = scrubber.feed(data)
                if clean:
                    self.out.emit({"t": "b", "d": clean})
            rest = scrubber.flush()
            if rest:
                self.out.emit({"t": "b", "d": rest})
            self.out.emit({"t": "e"})
        finally:
            connection.close()


class _WsExchange(_Exchange):
    """A WebSocket to Jupyter: the portal's messages in, Jupyter's out, until one side closes."""

    def serve(self) -> None:
        first = self.first
        relay = self.relay
        headers = forwarded_request_headers(first.headers, relay.token)
        protocols = [
            p.strip()
            for name, value in first.headers
            if name.lower() == "sec-websocket-protocol"
            for p in value.split(",")
            if p.strip()
        ]
        plain = [f"{n}: {v}" for n, v in headers if n.lower() != "sec-websocket-protocol"]
        ws = websocket.WebSocket(enable_multithread=True, skip_utf8_validation=True)
        ws.connect(  # type: ignore[no-untyped-call]
            f"ws://localhost{first.path}",
            socket=relay.connect(),
            header=plain,
            subprotocols=protocols or None,
            suppress_origin=True,
            timeout=CONNECT_TIMEOUT_S,
        )
        ws.settimeout(None)
        self.out.emit({"t": "o", "sp": ws.getsubprotocol() or ""})
        reader = threading.Thread(target=self._pump_out, args=(ws,), daemon=True)
        reader.start()
        try:
            self._pump_in(ws)
        finally:
            with contextlib.suppress(Exception):
                ws.close(timeout=1)
            reader.join(timeout=5)

    def _pump_in(self, ws: websocket.WebSocket) -> None:
        joiner = MessageJoiner()
        heard = time.monotonic()
        while not self.done.is_set():
            try:
                entry = self.inbox.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() - heard > WS_SILENT_S:
                    log.info("lab of %s: socket %s abandoned", self.relay.job, self.first.exchange)
                    return
                continue
            heard = time.monotonic()
            if entry.type == "c":
                return
            if entry.type != "w":
                continue
            try:
                whole = joiner.add(entry)
            except LabFrameError:
                return
            if whole is not None:
                opcode = (
                    websocket.ABNF.OPCODE_TEXT
                    if entry.kind == "t"
                    else websocket.ABNF.OPCODE_BINARY
                )
                ws.send(whole, opcode)

    def _pump_out(self, ws: websocket.WebSocket) -> None:
        code = 1000
        try:
            while True:
                opcode, data = ws.recv_data()
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    if len(data) >= 2:
                        code = int.from_bytes(data[:2], "big")
                    break
                kind = "t" if opcode == websocket.ABNF.OPCODE_TEXT else "b"
                for fields in message_entries(bytes(data), kind):
                    self.out.emit(fields)
        except (websocket.WebSocketException, OSError, ValueError) as exc:
            log.debug("lab of %s: socket %s ended: %s", self.relay.job, self.first.exchange, exc)
        finally:
            with contextlib.suppress(redis.RedisError):
                self.out.emit({"t": "c", "cc": str(code if 1000 <= code <= 4999 else 1000)})
            self.abort()

"""The lab relay (``workers.agent.lab_relay``) against a real JupyterLab on a real Unix socket.

Jupyter starts the way the agent starts it (``lab_launch.lab_argv`` and ``lab_env``, in the
worker's scratch folder) without the sandbox around it; the test plays the portal's part on
the lab's Redis streams (``workers.lab_protocol``): a page, the REST API, a kernel's
WebSocket running a cell.  A ``lab.sock`` that is a link to another socket is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from workers import beneath
from workers.agent.lab_launch import lab_argv, lab_env, new_token
from workers.agent.lab_relay import LabRelay, LabStatus, connect_lab
from workers.lab_protocol import (
    HEAD_WAIT_S,
    Entry,
    MessageJoiner,
    encode_headers,
    lab_in_key,
    lab_out_key,
    message_entries,
    parse_out,
)
from workers.protocol import shell_entries

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

NODE, JOB, BASE = "n1", "job-7", "/sessions/7/lab/"


@contextlib.contextmanager
def running_lab(job_dir: Path, base: str) -> Iterator[str]:
    """A JupyterLab on ``<job_dir>/scratch/w0/lab.sock`` under ``base``, started the way the
    agent starts it (without the sandbox); yields its token."""
    home = job_dir / "scratch" / "w0"
    home.mkdir(parents=True, exist_ok=True)
    token = new_token()
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        **lab_env(home, token),
    }
    log = open(job_dir / "lab.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        lab_argv(sys.executable, base, home), cwd=home, env=env, stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                connect_lab(job_dir, "w0").close()
                break
            except OSError:
                assert process.poll() is None, (job_dir / "lab.log").read_text()[-3000:]
                assert time.monotonic() < deadline, (job_dir / "lab.log").read_text()[-3000:]
                time.sleep(0.2)
        yield token
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A JupyterLab of ``JOB``: (the job's directory, its token)."""
    job_dir = tmp_path_factory.mktemp("job")
    with running_lab(job_dir, BASE) as token:
        yield job_dir, token


@pytest.fixture
def redis_url() -> str:
    """The test settings' Redis (as the sandbox and shell tests use)."""
    return str(settings.REDIS_URL)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def relay(client: redis.Redis, lab: tuple[Path, str]) -> Iterator[tuple[LabRelay, list[LabStatus]]]:
    job_dir, token = lab
    seen: list[LabStatus] = []
    r = LabRelay(
        client,
        node=NODE,
        job=JOB,
        job_dir=job_dir,
        worker_id="w0",
        token=token,
        base_url=BASE,
        on_activity=seen.append,
        activity_every_s=0.5,
    )
    r.start()
    yield r, seen
    r.stop()


class Portal:
    """The portal's part: entries in, an exchange's entries out."""

    def __init__(
        self, client: redis.Redis, node: str = NODE, job: str = JOB, base: str = BASE
    ) -> None:
        self.client = client
        self.node, self.job, self.base = node, job, base

    def send(self, x: str, **fields: bytes | str) -> None:
        entry: dict[Any, Any] = {"x": x, **fields}
        self.client.xadd(lab_in_key(self.node, self.job), entry)

    def read(self, x: str, until: str, timeout: float = 60) -> list[Entry]:
        out: list[Entry] = []
        last = "0-0"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answer = self.client.xread({lab_out_key(self.node, self.job, x): last}, block=500)
            for entry_id, fields in shell_entries(answer):
                last = entry_id
                entry = parse_out(fields)
                out.append(entry)
                if entry.type in (until, "f"):
                    return out
        raise AssertionError(f"no {until!r} within {timeout} s: {out}")

    def http(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: list[tuple[str, str]] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        x = uuid.uuid4().hex
        self.send(x, t="h", m=method, p=self.base + path, hd=encode_headers(headers or []))
        if body:
            self.send(x, t="b", d=body)
        self.send(x, t="e")
        entries = self.read(x, "e")
        assert entries[0].type == "h", entries
        return (
            entries[0].status,
            {n.lower(): v for n, v in entries[0].headers},
            b"".join(e.data for e in entries if e.type == "b"),
        )


def test_page_and_api_through_the_relay_never_show_the_token(
    client: redis.Redis, relay: tuple[LabRelay, list[LabStatus]], lab: tuple[Path, str]
) -> None:
    _job_dir, token = lab
    portal = Portal(client)
    status, headers, page = portal.http(
        "GET", "lab", headers=[("Cookie", "sessionid=portal-secret; csrftoken=abc")]
    )
    assert status == 200, page[:500]
    assert b"jupyter-config-data" in page
    assert token.encode() not in page  # JupyterLab writes it into its page config
    assert "set-cookie" not in headers
    status, _h, body = portal.http(
        "PUT",
        "api/contents/hello.txt",
        json.dumps({"type": "file", "format": "text", "content": "hi from the relay"}).encode(),
        [("Content-Type", "application/json")],
    )
    assert status in (200, 201), body
    assert (lab[0] / "scratch" / "w0" / "hello.txt").read_text() == "hi from the relay"
    status, _h, body = portal.http("GET", "api/contents/hello.txt")
    assert json.loads(body)["content"] == "hi from the relay"


def test_without_the_relay_token_jupyter_refuses(lab: tuple[Path, str]) -> None:
    job_dir, _token = lab
    with connect_lab(job_dir, "w0") as sock:
        sock.sendall(f"GET {BASE}api/contents HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        assert sock.recv(100).split(b" ")[1] in (b"403", b"401", b"302")


def run_cell(portal: Portal, code: str, until: str, timeout: float = 90) -> str:
    """Start a kernel through the relay, run ``code`` over its WebSocket, and return its
    printed output once it holds ``until``; then close the socket and the kernel."""
    status, _h, body = portal.http(
        "POST", "api/kernels", b"{}", [("Content-Type", "application/json")]
    )
    assert status == 201, body
    kernel = json.loads(body)["id"]
    x = uuid.uuid4().hex
    portal.send(x, t="o", p=f"{portal.base}api/kernels/{kernel}/channels", hd=encode_headers([]))
    opened = portal.read(x, "o")
    assert opened[-1].type == "o", opened
    request = {
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": "t",
                   "session": uuid.uuid4().hex, "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False},
    }  # fmt: skip
    for piece in message_entries(json.dumps(request).encode(), "t"):
        portal.send(x, **piece)
    joiner = MessageJoiner()
    last = "0-0"
    text = ""
    deadline = time.monotonic() + timeout
    while until not in text:
        assert time.monotonic() < deadline, f"no {until!r} in the cell's output: {text[:2000]}"
        answer = portal.client.xread({lab_out_key(portal.node, portal.job, x): last}, block=500)
        for entry_id, fields in shell_entries(answer):
            last = entry_id
            entry = parse_out(fields)
            if entry.type != "w":
                continue
            whole = joiner.add(entry)
            if whole is None:
                continue
            message = json.loads(whole)
            if message.get("msg_type") == "stream":
                text += message["content"]["text"]
            elif message.get("msg_type") == "error":
                text += "\n".join(message["content"]["traceback"])
    portal.send(x, t="c", cc="1000")
    assert portal.read(x, "c")[-1].type == "c"
    status, _h, _b = portal.http("DELETE", f"api/kernels/{kernel}")
    assert status == 204
    return text


def test_a_kernel_runs_a_cell_over_the_relayed_websocket(
    client: redis.Redis, relay: tuple[LabRelay, list[LabStatus]]
) -> None:
    text = run_cell(Portal(client), "print('relayed', 6 * 7, 'x' * 300000)", "relayed 42")
    assert len(text) > 300000  # an output bigger than one entry came back whole


def test_the_relay_reports_jupyters_activity(
    relay: tuple[LabRelay, list[LabStatus]],
) -> None:
    _relay, seen = relay
    deadline = time.monotonic() + 20
    while not seen:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert abs(seen[-1].last_activity - time.time()) < 3600
    assert seen[-1].kernels >= 0


def test_a_lab_sock_that_is_a_link_to_another_socket_is_refused(
    tmp_path: Path, client: redis.Redis
) -> None:
    """The tenant swaps ``lab.sock`` for a link to a socket outside its sandbox: the agent,
    root, would otherwise connect there on the tenant's behalf."""
    outside = tmp_path / "outside.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(outside))
    listener.listen(4)
    listener.settimeout(0.5)
    job_dir = tmp_path / "job"
    scratch = job_dir / "scratch" / "w0"
    scratch.mkdir(parents=True)
    os.symlink(outside, scratch / "lab.sock")
    with pytest.raises(beneath.LinkRefused):
        connect_lab(job_dir, "w0")
    # A link on the way (the worker's folder itself) is refused the same way.
    (job_dir / "scratch" / "w0").rename(job_dir / "elsewhere")
    os.symlink(tmp_path, job_dir / "scratch" / "w0")
    (tmp_path / "lab.sock").symlink_to(outside)
    with pytest.raises(beneath.LinkRefused):
        connect_lab(job_dir, "w0")
    # Through the relay: the exchange fails, saying why; nothing reached the socket.
    relay = LabRelay(
        client, node=NODE, job="job-8", job_dir=job_dir, worker_id="w0", token="t" * 48,
        base_url="/sessions/8/lab/", activity_every_s=3600,
    )  # fmt: skip
    relay.start()
    try:
        x = uuid.uuid4().hex
        client.xadd(
            lab_in_key(NODE, "job-8"),
            {"x": x, "t": "h", "m": "GET", "p": "/sessions/8/lab/api/status", "hd": "[]"},
        )
        client.xadd(lab_in_key(NODE, "job-8"), {"x": x, "t": "e"})
        deadline = time.monotonic() + 20
        entries: list[Entry] = []
        while not entries:
            assert time.monotonic() < deadline
            answer = client.xread({lab_out_key(NODE, "job-8", x): "0-0"}, block=500)
            entries = [parse_out(f) for _i, f in shell_entries(answer)]
        assert entries[0].type == "f" and "not to be trusted" in entries[0].reason
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        relay.stop()
        listener.close()


def test_a_regular_file_or_fifo_named_lab_sock_is_not_connected(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch" / "w0"
    scratch.mkdir(parents=True)
    os.mkfifo(scratch / "lab.sock")
    with pytest.raises(OSError, match="not a socket"):
        connect_lab(tmp_path, "w0")


def test_a_request_sent_before_the_relay_started_is_answered_and_a_stale_one_is_not(
    client: redis.Redis, lab: tuple[Path, str]
) -> None:
    """The portal may send as soon as the session runs, before the agent's next pass gives
    its lab a relay: that request is still awaited and must be served.  One older than the
    portal's wait (``HEAD_WAIT_S``, read off Redis's clock) was given up and is not."""
    job_dir, token = lab
    portal = Portal(client, job="job-early")
    seconds, micros = client.time()
    stale_ms = int(seconds) * 1000 + int(micros) // 1000 - int(HEAD_WAIT_S * 1000) - 5000
    stale = uuid.uuid4().hex
    key = lab_in_key(NODE, "job-early")
    client.xadd(key, {"x": stale, "t": "h", "m": "GET", "p": BASE + "api/status",
                      "hd": encode_headers([])},
                id=f"{stale_ms}-0")  # fmt: skip
    client.xadd(key, {"x": stale, "t": "e"}, id=f"{stale_ms}-1")
    early = uuid.uuid4().hex
    portal.send(early, t="h", m="GET", p=BASE + "api/status", hd=encode_headers([]))
    portal.send(early, t="e")
    relay = LabRelay(client, node=NODE, job="job-early", job_dir=job_dir, worker_id="w0",
                     token=token, base_url=BASE)  # fmt: skip
    relay.start()
    try:
        entries = portal.read(early, "e")
        assert entries[0].type == "h" and entries[0].status == 200, entries
        assert not client.exists(lab_out_key(NODE, "job-early", stale))
    finally:
        relay.stop()
        client.delete(key)

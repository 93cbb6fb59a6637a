"""The store door: a job's programs reach their own prefix of the store, and nothing else."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from workers.agent.door import DoorLimits, StoreDoors
from workers.artifacts import ArtifactPathError, ArtifactStore
from workers.beneath import LinkRefused
from workers.elastic.checkpoint import Checkpoints
from workers.store_door import DoorError, DoorStore, open_store

PREFIX = "tenants/acme/jobs/7"


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    (root / PREFIX).mkdir(parents=True)
    (root / "tenants/other/jobs/8").mkdir(parents=True)
    (root / "tenants/other/jobs/8/secret.txt").write_text("another tenant's")
    return root


@pytest.fixture
def doors(tmp_path: Path) -> Iterator[StoreDoors]:
    opened = StoreDoors(tmp_path / "doors", "node-0", DoorLimits(max_object_bytes=1 << 20))
    yield opened
    opened.close_all()


def _door(doors: StoreDoors, store_root: Path, job: str = "job-7") -> DoorStore:
    url = doors.open(job, f"file://{store_root}/{PREFIX}", None)
    store = open_store(url)
    assert isinstance(store, DoorStore)
    return store


def test_every_operation_of_the_runtime_goes_through_the_door(
    doors: StoreDoors, store_root: Path, tmp_path: Path
) -> None:
    store = _door(doors, store_root)
    stored = store.put_bytes("checkpoints/a.json", b'{"step": 1}')
    assert stored.sha256 == hashlib.sha256(b'{"step": 1}').hexdigest()
    assert (store_root / PREFIX / "checkpoints/a.json").read_bytes() == b'{"step": 1}'
    source = tmp_path / "model.bin"
    source.write_bytes(os.urandom(300_000))
    assert store.put_file("artifacts/model.bin", source).size == 300_000
    assert store.list() == ["artifacts/model.bin", "checkpoints/a.json"]
    assert store.list("checkpoints") == ["checkpoints/a.json"]
    assert store.exists("checkpoints/a.json") and not store.exists("checkpoints/b.json")
    assert store.size("artifacts/model.bin") == 300_000
    copy = tmp_path / "copy.bin"
    store.get_file("artifacts/model.bin", copy)
    assert copy.read_bytes() == source.read_bytes()
    with pytest.raises(FileNotFoundError):
        store.open_read("checkpoints/none.json")
    store.delete("checkpoints/a.json")
    store.delete("checkpoints/a.json")  # twice: nothing happens
    assert store.list("checkpoints") == []


def test_the_runtime_checkpoints_and_resumes_through_the_door(
    doors: StoreDoors, store_root: Path
) -> None:
    torch.set_num_threads(1)
    saved = Checkpoints(_door(doors, store_root), keep=1)
    saved.save(10, {"w": torch.arange(4.0), "step": 10})
    saved.save(20, {"w": torch.arange(4.0) * 2, "step": 20})
    restored, skipped = Checkpoints(ArtifactStore(str(store_root / PREFIX))).load_latest()
    assert restored is not None and restored.step == 20 and skipped == []
    assert torch.equal(restored.state["w"], torch.arange(4.0) * 2)
    again, _ = Checkpoints(_door(doors, store_root)).load_latest()  # and back through it
    assert again is not None and again.step == 20
    assert ArtifactStore(str(store_root / PREFIX)).list("checkpoints") == [
        "checkpoints/step-000000020.json",
        "checkpoints/step-000000020.pt",
    ]


@pytest.mark.parametrize(
    "path",
    [
        "/objects/../../other/jobs/8/secret.txt",
        "/objects/%2e%2e/%2e%2e/other/jobs/8/secret.txt",
        "/objects//etc/passwd",
        "/objects/a/../../8/secret.txt",
        "/objects/a%5c..%5c..%5csecret.txt",
        "/list?prefix=..",
        "/elsewhere",
    ],
)
def test_no_path_leaves_the_jobs_prefix(doors: StoreDoors, store_root: Path, path: str) -> None:
    store = _door(doors, store_root)
    status, body = _raw(store, f"GET {path} HTTP/1.0\r\n\r\n".encode())
    assert status == 400, body
    assert b"another tenant" not in body


def test_a_link_planted_in_the_prefix_is_never_followed(
    doors: StoreDoors, store_root: Path
) -> None:
    store = _door(doors, store_root)
    job = store_root / PREFIX
    (job / "artifacts").symlink_to(store_root / "tenants/other/jobs/8")
    (job / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(LinkRefused):
        store.open_read("artifacts/secret.txt")
    with pytest.raises(LinkRefused):
        store.put_bytes("artifacts/planted.txt", b"through the link")
    assert not (store_root / "tenants/other/jobs/8/planted.txt").exists()
    assert not store.exists("passwd")
    assert store.list() == []


def test_an_object_over_the_limit_is_refused_before_a_byte_is_stored(
    doors: StoreDoors, store_root: Path
) -> None:
    store = _door(doors, store_root)
    with pytest.raises(DoorError, match="413"):
        store.put_bytes("checkpoints/huge.pt", b"x" * ((1 << 20) + 1))
    assert not (store_root / PREFIX / "checkpoints").exists()


def test_a_body_that_ends_early_stores_nothing(doors: StoreDoors, store_root: Path) -> None:
    store = _door(doors, store_root)
    request = b"PUT /objects/checkpoints/x.pt HTTP/1.0\r\nContent-Length: 1000\r\n\r\nonly this"
    status, _body = _raw(store, request, shut=True)
    assert status == 400
    assert ArtifactStore(str(store_root / PREFIX)).list() == []


def test_a_put_without_a_length_is_refused(doors: StoreDoors, store_root: Path) -> None:
    status, _ = _raw(_door(doors, store_root), b"PUT /objects/x HTTP/1.0\r\n\r\n")
    assert status == 411


def test_connections_over_the_cap_are_closed_and_the_door_still_serves(
    tmp_path: Path, store_root: Path
) -> None:
    doors = StoreDoors(tmp_path / "doors", "node-0", DoorLimits(max_connections=2, timeout_s=5))
    try:
        store = _door(doors, store_root)
        path = str(doors.directory("job-7") / "store.sock")
        held = [_half_request(path) for _ in range(2)]  # two requests that never finish
        refused = _half_request(path, closed_ok=True)
        refused.settimeout(2)
        assert _closed(refused)  # the third is closed at once
        for each in (*held, refused):
            each.close()
        threading.Event().wait(0.2)  # the server's threads see their peers go
        assert store.list() == []
    finally:
        doors.close_all()


def test_each_job_has_its_own_socket_and_closing_removes_it(
    doors: StoreDoors, store_root: Path
) -> None:
    first = doors.open("job-7", f"file://{store_root}/{PREFIX}", None)
    other = doors.open("job-8", f"file://{store_root}/tenants/other/jobs/8", None)
    assert first != other
    assert doors.open("job-7", "file:///elsewhere", None) == first  # opened once
    socket_dir = doors.directory("job-7")
    assert oct(socket_dir.stat().st_mode & 0o777) == "0o755"
    assert oct((socket_dir / "store.sock").stat().st_mode & 0o777) == "0o600"
    assert open_store(other).list() == ["secret.txt"]
    doors.close("job-7")
    assert not socket_dir.exists()
    assert not doors.serves("job-7") and doors.serves("job-8")


def test_bad_paths_are_refused_on_the_client_before_anything_is_sent(
    doors: StoreDoors, store_root: Path
) -> None:
    store = _door(doors, store_root)
    for bad in ("../x", "/etc/passwd", ""):
        with pytest.raises(ArtifactPathError):
            store.put_bytes(bad, b"x")


def _raw(store: DoorStore, request: bytes, shut: bool = False) -> tuple[int, bytes]:
    """Send ``request`` as it is (no client-side checks); the status and body of the answer."""
    path = store.url.removeprefix("door+unix://")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(request)
        if shut:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _half_request(path: str, *, closed_ok: bool = False) -> socket.socket:
    """A connection with a request's head sent and its body never.  ``closed_ok``: the door
    may close it before the head is written (over its cap, on a loaded machine), which the
    caller then finds with :func:`_closed`."""
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    try:
        sock.sendall(b"PUT /objects/slow HTTP/1.0\r\nContent-Length: 10\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        if not closed_ok:
            raise
    return sock


def _closed(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` (a reset, with a request unread, counts)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_request_waits_for_a_restarting_agent_to_open_the_door_again(
    doors: StoreDoors, store_root: Path
) -> None:
    url = doors.open("job-7", f"file://{store_root}/{PREFIX}", None)
    doors.close("job-7")  # the agent died: its programs train on
    reopen = threading.Timer(
        0.5, lambda: doors.open("job-7", f"file://{store_root}/{PREFIX}", None)
    )
    reopen.start()
    try:
        assert DoorStore(url).put_bytes("checkpoints/late.pt", b"saved").size == 5
    finally:
        reopen.join()
    assert (store_root / PREFIX / "checkpoints/late.pt").read_bytes() == b"saved"
    doors.close("job-7")
    with pytest.raises(FileNotFoundError):  # gone for longer than it waits: the caller is told
        DoorStore(url, away_s=0.3).list()


def test_a_restarted_agent_opens_the_door_in_the_folder_sandboxes_already_bound(
    tmp_path: Path, store_root: Path
) -> None:
    first = StoreDoors(tmp_path / "doors", "node-0")
    url = first.open("job-7", f"file://{store_root}/{PREFIX}", None)
    folder = first.directory("job-7")
    inode = folder.stat().st_ino
    first._open.clear()  # the agent died: nothing of it closed the door
    again = StoreDoors(tmp_path / "doors", "node-0")
    try:
        assert again.open("job-7", f"file://{store_root}/{PREFIX}", None) == url
        assert folder.stat().st_ino == inode  # the same directory a running sandbox bound
        assert DoorStore(url).list() == []
        assert [p.name for p in (tmp_path / "doors").iterdir()] == [folder.name]  # no staging
    finally:
        again.close_all()

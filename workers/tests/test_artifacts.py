"""The artifact store on a directory and on S3 (moto's server on loopback): the same behaviour."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.artifacts import (
    ArtifactCorrupt,
    ArtifactPathError,
    ArtifactStore,
    StoredObject,
    job_prefix,
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_put_returns_size_and_sha_and_reads_back(root_url: str, tmp_path: Path) -> None:
    store = ArtifactStore(root_url)
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 3_000_000)  # more than one chunk
    stored = store.put_file("a/b/c.bin", src)
    assert stored == StoredObject("a/b/c.bin", 3_000_000, sha(src.read_bytes()))
    assert store.put_bytes("a/d.txt", b"hello") == StoredObject("a/d.txt", 5, sha(b"hello"))
    assert store.exists("a/b/c.bin") and store.size("a/d.txt") == 5
    assert store.read_verified("a/d.txt", 5, sha(b"hello")) == b"hello"
    assert store.list() == ["a/b/c.bin", "a/d.txt"]
    assert store.list("a/b") == ["a/b/c.bin"]
    assert store.list("nothing/here") == []
    with store.open_range("a/d.txt", 1, 3) as part:
        assert part.read() == b"ell"
    with store.open_range("a/d.txt", 3, 100) as part:
        assert part.read() == b"lo"


def test_a_corrupt_object_is_detected(root_url: str) -> None:
    store = ArtifactStore(root_url)
    stored = store.put_bytes("c.pt", b"checkpoint bytes")
    store.put_bytes("c.pt", b"checkpoint bytez")  # same size, one byte differs
    with pytest.raises(ArtifactCorrupt, match="sha256"):
        store.read_verified("c.pt", stored.size, stored.sha256)
    store.put_bytes("c.pt", b"checkpoint bytes!")
    with pytest.raises(ArtifactCorrupt, match="bytes, expected"):
        store.read_verified("c.pt", stored.size, stored.sha256)


def test_child_delete_and_delete_prefix(root_url: str) -> None:
    store = ArtifactStore(root_url)
    job = store.child(job_prefix("acme", 7))
    job.put_bytes("checkpoints/step-1.pt", b"1")
    job.put_bytes("artifacts/model/w.bin", b"2")
    store.put_bytes("tenants/acme/jobs/70/keep.txt", b"3")  # a prefix that merely starts alike
    assert store.list("tenants/acme/jobs/7") == [
        "tenants/acme/jobs/7/artifacts/model/w.bin",
        "tenants/acme/jobs/7/checkpoints/step-1.pt",
    ]
    assert ArtifactStore(job.url).list() == job.list()  # the child's URL names the same place
    assert job.url_of("artifacts/model/w.bin") == store.url_of(
        "tenants/acme/jobs/7/artifacts/model/w.bin"
    )
    job.delete("checkpoints/step-1.pt")
    job.delete("checkpoints/step-1.pt")  # gone already: nothing happens
    assert store.delete_prefix("tenants/acme/jobs/7") == [
        "tenants/acme/jobs/7/artifacts/model/w.bin"
    ]
    assert store.list() == ["tenants/acme/jobs/70/keep.txt"]


def test_a_new_store_sees_what_another_process_wrote(root_url: str) -> None:
    store = ArtifactStore(root_url)
    assert store.list() == [] and not store.exists("from/child.txt")
    script = (
        "import sys; from workers.artifacts import ArtifactStore;"
        "ArtifactStore(sys.argv[1]).put_bytes('from/child.txt', b'hi')"
    )
    subprocess.run([sys.executable, "-c", script, root_url], check=True)
    assert store.exists("from/child.txt")  # the same instance: no stale listing
    assert ArtifactStore(root_url).list() == ["from/child.txt"]


def test_a_failed_upload_leaves_nothing(root_url: str) -> None:
    store = ArtifactStore(root_url)

    def chunks() -> Iterator[bytes]:
        yield b"half of it"
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        store.put_stream("x/y.bin", chunks())
    assert store.list() == [] and not store.exists("x/y.bin")
    if root_url.startswith("file://"):  # not even a temporary file is left behind
        assert [p for p in Path(root_url[7:]).rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("rel", ["", "/etc/passwd", "../outside", "a/../../b", "a\\b", "."])
def test_paths_outside_the_store_are_refused(tmp_path: Path, rel: str) -> None:
    store = ArtifactStore(str(tmp_path))
    with pytest.raises(ArtifactPathError):
        store.put_bytes(rel, b"x")
    with pytest.raises(ArtifactPathError):
        store.child(rel)


@pytest.mark.parametrize("slug", ["", "a/b", "..", "a\\b"])
def test_job_prefix_refuses_odd_slugs(slug: str) -> None:
    assert job_prefix("acme", 12) == "tenants/acme/jobs/12"
    with pytest.raises(ArtifactPathError):
        job_prefix(slug, 1)

"""A directory store never follows a link planted below its root (issue 34).

A job's prefix is bound read-write into its sandbox, so the program can put
symbolic links (and FIFOs) anywhere in it.  Code running as root (the agent's
collection) or as the web server (downloads, retention) must then neither
write, read, list nor delete through them::

    tmp/
        store/                                   the store root (itself may be a link)
            tenants/acme/jobs/7/                 the job's prefix, tenant-written
                artifacts -> tmp/outside         planted by the program
            tenants/globex/jobs/8/artifacts/     another tenant's objects
        outside/secret.txt                       a host file
        out/                                     the node-local ARTIFACT_DIR
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from workers import beneath
from workers.agent.collect import collect
from workers.agent.config import CollectLimits
from workers.artifacts import ArtifactStore, StoredObject
from workers.beneath import LinkRefused

PREFIX = "tenants/acme/jobs/7"
OTHER = "tenants/globex/jobs/8"


@dataclass(frozen=True)
class Layout:
    """The directories of one test (see the module docstring)."""

    root: Path
    outside: Path
    out: Path

    @property
    def prefix(self) -> Path:
        return self.root / PREFIX

    @property
    def other(self) -> Path:
        return self.root / OTHER

    def store(self) -> ArtifactStore:
        return ArtifactStore(f"file://{self.root}")

    def job_store(self) -> ArtifactStore:
        """The job's store as the agent builds it: rooted at the job's prefix."""
        return ArtifactStore(f"file://{self.prefix}")


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    root, outside, out = tmp_path / "store", tmp_path / "outside", tmp_path / "out"
    (root / PREFIX).mkdir(parents=True)
    (root / OTHER / "artifacts").mkdir(parents=True)
    (root / OTHER / "artifacts" / "keep.bin").write_bytes(b"globex's model")
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"SECRET_KEY=hunter2\n")
    out.mkdir()
    return Layout(root, outside, out)


def files_below(directory: Path) -> dict[str, bytes]:
    """Every regular file below ``directory`` (never through a link), with its bytes."""
    found = {}
    for current, _dirs, names in os.walk(directory):
        for name in names:
            path = Path(current) / name
            if path.is_file() and not path.is_symlink():
                found[str(path.relative_to(directory))] = path.read_bytes()
    return found


# --------------------------------------------------------------------------- uploads


def test_collect_through_a_linked_artifacts_dir_lands_nothing_outside(layout: Layout) -> None:
    (layout.prefix / "artifacts").symlink_to(layout.outside)
    (layout.out / "evil.sh").write_bytes(b"#!/bin/sh\n")
    (layout.out / "sub").mkdir()
    (layout.out / "sub" / "deep.txt").write_bytes(b"deep")

    collected = collect(layout.job_store(), layout.out, CollectLimits())

    assert collected.stored == ()
    assert files_below(layout.outside) == {"secret.txt": b"SECRET_KEY=hunter2\n"}
    assert [rel for rel, _why in collected.skipped] == ["evil.sh", "sub/deep.txt"]
    assert all("symbolic link" in why for _rel, why in collected.skipped)
    assert (layout.prefix / "artifacts").is_symlink()  # left as it is, never followed


def test_collect_through_a_linked_subdirectory_of_artifacts_is_skipped(layout: Layout) -> None:
    (layout.prefix / "artifacts").mkdir()
    (layout.prefix / "artifacts" / "sub").symlink_to(layout.outside)
    (layout.out / "sub").mkdir()
    (layout.out / "sub" / "planted.txt").write_bytes(b"planted")
    (layout.out / "fine.txt").write_bytes(b"fine")

    collected = collect(layout.job_store(), layout.out, CollectLimits())

    assert [path for path, _obj in collected.stored] == ["artifacts/fine.txt"]
    assert [rel for rel, _why in collected.skipped] == ["sub/planted.txt"]
    assert "planted.txt" not in files_below(layout.outside)


def test_put_through_a_linked_directory_is_refused(layout: Layout) -> None:
    (layout.prefix / "artifacts").symlink_to(layout.outside)
    store = layout.store()
    with pytest.raises(LinkRefused):
        store.put_bytes(f"{PREFIX}/artifacts/new.txt", b"x")
    with pytest.raises(LinkRefused):
        store.put_bytes(f"{PREFIX}/artifacts/deeper/new.txt", b"x")
    assert files_below(layout.outside) == {"secret.txt": b"SECRET_KEY=hunter2\n"}


def test_a_child_store_walks_from_the_trusted_root(layout: Layout) -> None:
    """A child store (a job's checkpoints) whose own root is a planted link refuses too."""
    (layout.prefix / "checkpoints").symlink_to(layout.outside)
    checkpoints = layout.store().child(f"{PREFIX}/checkpoints")
    with pytest.raises(LinkRefused):
        checkpoints.put_bytes("step-1.pt", b"x")
    with pytest.raises(LinkRefused):
        checkpoints.open_read("secret.txt")
    assert checkpoints.list() == []
    assert files_below(layout.outside) == {"secret.txt": b"SECRET_KEY=hunter2\n"}


def test_a_write_over_a_final_link_replaces_the_link_not_its_target(layout: Layout) -> None:
    (layout.prefix / "artifacts").mkdir()
    (layout.prefix / "artifacts" / "x").symlink_to(layout.outside / "secret.txt")
    layout.store().put_bytes(f"{PREFIX}/artifacts/x", b"mine")
    assert (layout.outside / "secret.txt").read_bytes() == b"SECRET_KEY=hunter2\n"
    assert not (layout.prefix / "artifacts" / "x").is_symlink()
    assert (layout.prefix / "artifacts" / "x").read_bytes() == b"mine"


# --------------------------------------------------------------------------- reads


def test_reading_a_linked_file_or_through_a_linked_directory_is_refused(layout: Layout) -> None:
    artifacts = layout.prefix / "artifacts"
    artifacts.mkdir()
    (artifacts / "x").symlink_to(layout.outside / "secret.txt")
    (artifacts / "d").symlink_to(layout.outside)
    store = layout.store()
    for rel in (f"{PREFIX}/artifacts/x", f"{PREFIX}/artifacts/d/secret.txt"):
        assert not store.exists(rel)
        with pytest.raises(LinkRefused):
            store.open_read(rel)
        with pytest.raises(LinkRefused):
            store.open_range(rel, 0, 6)
        with pytest.raises(LinkRefused):
            store.size(rel)
        with pytest.raises(LinkRefused):
            store.read_verified(rel, 19, "0" * 64)
        with pytest.raises(LinkRefused):
            store.get_file(rel, layout.out / "copy")
    assert not (layout.out / "copy").exists()


@pytest.mark.timeout(20)
def test_a_fifo_in_the_store_is_refused_without_blocking(layout: Layout) -> None:
    (layout.prefix / "artifacts").mkdir()
    os.mkfifo(layout.prefix / "artifacts" / "pipe")
    store = layout.store()
    assert not store.exists(f"{PREFIX}/artifacts/pipe")
    with pytest.raises(LinkRefused):
        store.open_read(f"{PREFIX}/artifacts/pipe")
    assert store.list(PREFIX) == []


def test_list_neither_follows_nor_returns_links(layout: Layout) -> None:
    artifacts = layout.prefix / "artifacts"
    artifacts.mkdir()
    (artifacts / "real.txt").write_bytes(b"real")
    (artifacts / "x").symlink_to(layout.outside / "secret.txt")
    (artifacts / "d").symlink_to(layout.outside)
    (artifacts / "loop").symlink_to(layout.root)  # the whole store again
    store = layout.store()
    assert store.list(PREFIX) == [f"{PREFIX}/artifacts/real.txt"]
    assert store.list(f"{PREFIX}/artifacts/d") == []
    assert store.list(f"{PREFIX}/artifacts/x") == []
    assert store.list() == [f"{PREFIX}/artifacts/real.txt", f"{OTHER}/artifacts/keep.bin"]


# --------------------------------------------------------------------------- deletes


def test_delete_through_a_linked_directory_leaves_the_target_intact(layout: Layout) -> None:
    (layout.prefix / "artifacts").symlink_to(layout.other / "artifacts")
    store = layout.store()
    with pytest.raises(LinkRefused):
        store.delete(f"{PREFIX}/artifacts/keep.bin")
    assert (layout.other / "artifacts" / "keep.bin").read_bytes() == b"globex's model"


def test_delete_prefix_removes_links_as_links(layout: Layout) -> None:
    """A prefix that is a link, or holds links to directories: the links go, never their targets."""
    (layout.prefix / "artifacts").symlink_to(layout.other / "artifacts")
    checkpoints = layout.prefix / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "step-1.pt").write_bytes(b"ckpt")
    (checkpoints / "d").symlink_to(layout.outside)
    (checkpoints / "x").symlink_to(layout.outside / "secret.txt")
    os.mkfifo(checkpoints / "pipe")
    store = layout.store()

    assert store.delete_prefix(f"{PREFIX}/artifacts") == []
    assert store.delete_prefix(f"{PREFIX}/checkpoints") == [f"{PREFIX}/checkpoints/step-1.pt"]

    assert not os.path.lexists(layout.prefix / "artifacts")
    assert not os.path.lexists(checkpoints)
    assert files_below(layout.other) == {"artifacts/keep.bin": b"globex's model"}
    assert files_below(layout.outside) == {"secret.txt": b"SECRET_KEY=hunter2\n"}


def test_delete_prefix_below_a_link_is_refused(layout: Layout) -> None:
    (layout.prefix / "artifacts").symlink_to(layout.other / "artifacts")
    with pytest.raises(LinkRefused):
        layout.store().delete_prefix(f"{PREFIX}/artifacts/keep.bin")
    assert files_below(layout.other) == {"artifacts/keep.bin": b"globex's model"}


def test_delete_of_a_final_link_removes_the_link_only(layout: Layout) -> None:
    (layout.prefix / "artifacts").mkdir()
    (layout.prefix / "artifacts" / "x").symlink_to(layout.outside / "secret.txt")
    layout.store().delete(f"{PREFIX}/artifacts/x")
    assert not os.path.lexists(layout.prefix / "artifacts" / "x")
    assert (layout.outside / "secret.txt").exists()


# --------------------------------------------------------------------------- what still works


def test_normal_objects_still_put_read_list_and_delete(layout: Layout) -> None:
    store = layout.store()
    obj = store.put_bytes(f"{PREFIX}/artifacts/a/b.txt", b"hello")
    assert obj == StoredObject(f"{PREFIX}/artifacts/a/b.txt", 5, obj.sha256)
    assert store.exists(f"{PREFIX}/artifacts/a/b.txt")
    assert store.size(f"{PREFIX}/artifacts/a/b.txt") == 5
    assert store.read_verified(f"{PREFIX}/artifacts/a/b.txt", 5, obj.sha256) == b"hello"
    with store.open_range(f"{PREFIX}/artifacts/a/b.txt", 1, 3) as part:
        assert part.read() == b"ell"
    job = store.child(PREFIX)
    assert job.list() == ["artifacts/a/b.txt"]
    job.get_file("artifacts/a/b.txt", layout.out / "copy.txt")
    assert (layout.out / "copy.txt").read_bytes() == b"hello"
    store.delete(f"{PREFIX}/artifacts/a/b.txt")
    assert not store.exists(f"{PREFIX}/artifacts/a/b.txt")
    store.put_bytes(f"{PREFIX}/artifacts/c.txt", b"c")
    assert store.delete_prefix(f"{PREFIX}/artifacts") == [f"{PREFIX}/artifacts/c.txt"]
    assert not (layout.prefix / "artifacts").exists()
    with pytest.raises(FileNotFoundError):
        store.open_read(f"{PREFIX}/artifacts/c.txt")


def test_a_root_that_is_itself_a_link_is_resolved_once(layout: Layout, tmp_path: Path) -> None:
    (tmp_path / "via").symlink_to(layout.root)
    store = ArtifactStore(f"file://{tmp_path / 'via'}")
    store.put_bytes(f"{PREFIX}/artifacts/ok.txt", b"ok")
    assert store.list(PREFIX) == [f"{PREFIX}/artifacts/ok.txt"]
    with store.open_read(f"{PREFIX}/artifacts/ok.txt") as stream:
        assert stream.read() == b"ok"
    assert (layout.prefix / "artifacts" / "ok.txt").read_bytes() == b"ok"


# --------------------------------------------------------------------------- the node's ARTIFACT_DIR


def test_collect_opens_its_sources_without_links(tmp_path: Path) -> None:
    """The agent reads ``ARTIFACT_DIR`` (tenant-written too) by descriptors, regular files only."""
    out = tmp_path / "out"
    (out / "real").mkdir(parents=True)
    (out / "real" / "f").write_bytes(b"f")
    (tmp_path / "secret").write_bytes(b"root's")
    (out / "l").symlink_to(tmp_path / "secret")
    (out / "d").symlink_to(out / "real")
    os.mkfifo(out / "p")
    with beneath.directory(str(out)) as top:
        assert list(beneath.regular_files(top)) == [("real/f", 1)]
        for parts in (["l"], ["d", "f"], ["p"]):
            with pytest.raises(LinkRefused):
                beneath.open_regular(top, parts)
        with os.fdopen(beneath.open_regular(top, ["real", "f"]), "rb") as source:
            assert source.read() == b"f"


def test_open_sized_and_delete_prefix_on_both_backends(root_url: str) -> None:
    """The size of the opened object, and the folder removal, on a directory and on S3."""
    store = ArtifactStore(root_url)
    store.put_bytes("p/a/one.bin", b"12345")
    store.put_bytes("p/two.bin", b"12")
    opened, size = store.open_sized("p/a/one.bin")
    with opened:
        assert (size, opened.read()) == (5, b"12345")
    assert store.child("p").list() == ["a/one.bin", "two.bin"]
    assert store.delete_prefix("p") == ["p/a/one.bin", "p/two.bin"]
    assert store.list() == []
    with pytest.raises(FileNotFoundError):
        store.open_sized("p/two.bin")

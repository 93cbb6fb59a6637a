"""Mirroring a torchrun job's node-local CHECKPOINT_DIR to and from its store prefix."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import pytest

from workers.agent.mirror import (
    NOT_SETTLED,
    CheckpointMirror,
    MirrorLimits,
    Pusher,
    pull,
    read_limits,
)
from workers.artifacts import ArtifactStore, StoredObject
from workers.clock import ManualClock

SETTLED = MirrorLimits(settle_s=0.0)


def job_store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(f"file://{tmp_path / 'store'}").child("tenants/t/jobs/1")


def node_dir(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name / "jobs" / "j" / "checkpoints"
    directory.mkdir(parents=True)
    return directory


def stored(store: ArtifactStore) -> dict[str, bytes]:
    out = {}
    for rel in store.list("checkpoints"):
        with store.open_read(rel) as fh:
            out[rel] = fh.read()
    return out


def aged(path: Path, seconds: float = 60.0) -> Path:
    """Make ``path`` look written ``seconds`` ago (settled)."""
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)
    return path


def test_round_trip_from_one_node_to_another(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    node_a = node_dir(tmp_path, "a")
    (node_a / "sub").mkdir()
    (node_a / "step-10.pt").write_bytes(b"weights-10")
    (node_a / "sub" / "meta.json").write_text("{}")
    pushed = Pusher(SETTLED).push(store, node_a, time.time())
    assert pushed.stored == ("step-10.pt", "sub/meta.json")
    node_b = tmp_path / "b" / "jobs" / "j" / "checkpoints"  # not made yet: pull makes it
    pulled = pull(store, node_b, MirrorLimits(), None)
    assert pulled.written == ("step-10.pt", "sub/meta.json") and pulled.skipped == ()
    assert (node_b / "step-10.pt").read_bytes() == b"weights-10"
    assert (node_b / "sub" / "meta.json").read_text() == "{}"
    assert not list(node_b.rglob("*.part"))


def test_pull_leaves_a_file_of_the_same_size_and_seeds_the_pusher(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    store.put_bytes("checkpoints/a.pt", b"AAAA")
    store.put_bytes("checkpoints/b.pt", b"BBBB")
    local = node_dir(tmp_path, "n")
    (local / "a.pt").write_bytes(b"xxxx")  # same size: taken as already there
    pulled = pull(store, local, MirrorLimits(), None)
    assert pulled.written == ("b.pt",)
    assert (local / "a.pt").read_bytes() == b"xxxx"
    pusher = Pusher(SETTLED, dict(pulled.seen))
    assert pusher.push(store, local, time.time()).stored == ()  # nothing new to upload


def test_settle_rule_waits_for_a_fresh_file_unless_final(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    local = node_dir(tmp_path, "n")
    (local / "fresh.pt").write_bytes(b"new")
    now = os.stat(local / "fresh.pt").st_mtime_ns / 1e9 + 1.0  # one second after its write
    pusher = Pusher(MirrorLimits(settle_s=2.0))
    first = pusher.push(store, local, now)
    assert first.stored == () and first.skipped == (("fresh.pt", NOT_SETTLED),)
    assert pusher.push(store, local, now + 2.0).stored == ("fresh.pt",)
    (local / "again.pt").write_bytes(b"x")
    assert Pusher(MirrorLimits(settle_s=2.0)).push(store, local, now, final=True).stored == (
        "again.pt",
        "fresh.pt",
    )


def test_a_changed_file_is_uploaded_again_and_an_unchanged_one_is_not(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    local = node_dir(tmp_path, "n")
    (local / "latest.pt").write_bytes(b"one")
    pusher = Pusher(SETTLED)
    assert pusher.push(store, local, time.time()).stored == ("latest.pt",)
    assert pusher.push(store, local, time.time()).stored == ()
    (local / "latest.pt").write_bytes(b"two, longer")
    assert pusher.push(store, local, time.time()).stored == ("latest.pt",)
    assert stored(store) == {"checkpoints/latest.pt": b"two, longer"}


def test_rotation_deletes_only_what_this_pusher_uploaded(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    node_a, node_b = node_dir(tmp_path, "a"), node_dir(tmp_path, "b")
    (node_a / "step-1.pt").write_bytes(b"a1")
    (node_b / "rank-1.pt").write_bytes(b"b1")
    pusher_a, pusher_b = Pusher(SETTLED), Pusher(SETTLED)
    pusher_a.push(store, node_a, time.time())
    pusher_b.push(store, node_b, time.time())
    (node_a / "step-1.pt").unlink()
    (node_a / "step-2.pt").write_bytes(b"a2")
    pushed = pusher_a.push(store, node_a, time.time())
    assert pushed.stored == ("step-2.pt",) and pushed.deleted == ("step-1.pt",)
    assert stored(store) == {"checkpoints/rank-1.pt": b"b1", "checkpoints/step-2.pt": b"a2"}


def test_a_missing_directory_deletes_nothing(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    local = node_dir(tmp_path, "n")
    (local / "keep.pt").write_bytes(b"k")
    pusher = Pusher(SETTLED)
    pusher.push(store, local, time.time())
    (local / "keep.pt").unlink()
    local.rmdir()
    pushed = pusher.push(store, local, time.time())
    assert pushed.deleted == () and pushed.skipped[0][0] == "."
    assert "checkpoints/keep.pt" in store.list("checkpoints")


def test_links_and_fifos_in_the_local_dir_are_neither_uploaded_nor_followed(
    tmp_path: Path,
) -> None:
    store = job_store(tmp_path)
    local = node_dir(tmp_path, "n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"agent's file")
    (local / "passwd").symlink_to("/etc/passwd")
    (local / "secret").symlink_to(outside / "secret")
    (local / "linked-dir").symlink_to(outside)
    os.mkfifo(local / "fifo")
    (local / "real.pt").write_bytes(b"ok")
    done: list[object] = []
    worker = threading.Thread(
        target=lambda: done.append(Pusher(SETTLED).push(store, local, time.time(), final=True))
    )
    worker.start()
    worker.join(10)
    assert done, "the push hung (a FIFO opened for reading?)"
    assert stored(store) == {"checkpoints/real.pt": b"ok"}


def test_pull_replaces_a_planted_link_and_never_writes_its_target(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    store.put_bytes("checkpoints/step.pt", b"checkpoint")
    store.put_bytes("checkpoints/sub/inner.pt", b"inner")
    local = node_dir(tmp_path, "n")
    victim = tmp_path / "victim"
    victim.write_bytes(b"host file!")  # the same size as the object: still not "already there"
    (local / "step.pt").symlink_to(victim)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (local / "sub").symlink_to(elsewhere)  # a link in place of a subfolder
    pulled = pull(store, local, MirrorLimits(), None)
    assert pulled.written == ("step.pt", "sub/inner.pt")
    assert victim.read_bytes() == b"host file!" and list(elsewhere.iterdir()) == []
    assert not (local / "step.pt").is_symlink() and not (local / "sub").is_symlink()
    assert (local / "step.pt").read_bytes() == b"checkpoint"
    assert (local / "sub" / "inner.pt").read_bytes() == b"inner"


def test_a_link_in_the_store_prefix_is_refused_and_skipped(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    local = node_dir(tmp_path, "n")
    (local / "sub").mkdir()
    (local / "sub" / "x.pt").write_bytes(b"x")
    (local / "y.pt").write_bytes(b"y")
    store.put_bytes("checkpoints/y.pt", b"old")  # makes the prefix's folders
    outside = tmp_path / "outside"
    outside.mkdir()
    prefix = tmp_path / "store" / "tenants" / "t" / "jobs" / "1" / "checkpoints"
    (prefix / "sub").symlink_to(outside)  # the program planted it in the store
    pushed = Pusher(SETTLED).push(store, local, time.time())
    assert pushed.stored == ("y.pt",)
    assert [rel for rel, _why in pushed.skipped] == ["sub/x.pt"]
    assert list(outside.iterdir()) == []


class GrowingPusher(Pusher):
    """A pusher whose files grow between being listed and being opened (a program writing)."""

    def __init__(self, limits: MirrorLimits, directory: Path) -> None:
        super().__init__(limits)
        self.directory = directory

    def _upload(self, store: ArtifactStore, rel: str, source: IO[bytes], *args: Any) -> str | None:
        with open(self.directory / rel, "ab") as out:  # after the open, before the fstat
            out.write(b"+" * 100)
        return super()._upload(store, rel, source, *args)


def test_the_byte_limit_holds_while_a_file_grows(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    local = node_dir(tmp_path, "n")
    (local / "a.pt").write_bytes(b"a" * 6)
    (local / "b.pt").write_bytes(b"b" * 6)
    pushed = Pusher(MirrorLimits(max_bytes=10, settle_s=0.0)).push(store, local, time.time())
    assert pushed.stored == ("a.pt",) and "byte limit" in pushed.skipped[0][1]
    grown = GrowingPusher(MirrorLimits(max_bytes=10, settle_s=0.0), local)
    again = grown.push(store, local, time.time())
    assert again.stored == () and all("byte limit" in why for _rel, why in again.skipped)
    assert stored(store) == {"checkpoints/a.pt": b"a" * 6}


class GrowingStore(ArtifactStore):
    """A store during whose upload the program appends to the file being read."""

    def __init__(self, url: str, local: Path) -> None:
        super().__init__(url)
        self.local = local

    def put_stream(self, rel: str, chunks: Iterable[bytes]) -> StoredObject:
        with open(self.local / rel.removeprefix("checkpoints/"), "ab") as out:
            out.write(b"+" * 100)
        return super().put_stream(rel, chunks)


def test_a_file_growing_during_its_upload_is_read_no_further_than_its_size(
    tmp_path: Path,
) -> None:
    local = node_dir(tmp_path, "n")
    (local / "a.pt").write_bytes(b"a" * 6)
    store = GrowingStore(f"file://{tmp_path / 'store'}", local)
    pushed = Pusher(MirrorLimits(max_bytes=10, settle_s=0.0)).push(store, local, time.time())
    assert pushed.stored == ("a.pt",)
    assert stored(store) == {"checkpoints/a.pt": b"a" * 6}


def test_file_count_limit(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    for name in ("a", "b", "c"):
        store.put_bytes(f"checkpoints/{name}.pt", b"x")
    pulled = pull(store, node_dir(tmp_path, "n"), MirrorLimits(max_files=2), None)
    assert pulled.written == ("a.pt", "b.pt")
    assert pulled.skipped == (("c.pt", "more than 2 files"),)


def test_pull_as_the_current_owner(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    store.put_bytes("checkpoints/deep/step.pt", b"s")
    local = tmp_path / "n" / "checkpoints"
    owner = (os.getuid(), os.getgid())
    assert pull(store, local, MirrorLimits(), owner).written == ("deep/step.pt",)
    info = os.stat(local / "deep" / "step.pt")
    assert (info.st_uid, info.st_gid) == owner


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_pull_chowns_files_and_made_folders_to_the_job(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    store.put_bytes("checkpoints/deep/step.pt", b"s")
    local = tmp_path / "n" / "checkpoints"
    pull(store, local, MirrorLimits(), (54321, 54322))
    for path in (local / "deep", local / "deep" / "step.pt"):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (54321, 54322)


def test_read_limits() -> None:
    assert read_limits({}) == MirrorLimits()
    limits = read_limits(
        {
            "MIRROR_MAX_FILES": "5",
            "MIRROR_MAX_BYTES": "100",
            "MIRROR_SETTLE_SECONDS": "0",
            "MIRROR_EVERY_SECONDS": "1.5",
        }
    )
    assert limits == MirrorLimits(max_files=5, max_bytes=100, settle_s=0.0, every_s=1.5)
    for name, raw in [
        ("MIRROR_MAX_FILES", "1.5"),
        ("MIRROR_MAX_BYTES", "0"),
        ("MIRROR_SETTLE_SECONDS", "-1"),
        ("MIRROR_EVERY_SECONDS", "nan"),
        ("MIRROR_EVERY_SECONDS", "soon"),
    ]:
        with pytest.raises(ValueError, match=name):
            read_limits({name: raw})


def wait_for(condition: object, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_checkpoint_mirror_pulls_then_final_push_uploads_an_unsettled_file(
    tmp_path: Path,
) -> None:
    store = job_store(tmp_path)
    store.put_bytes("checkpoints/old.pt", b"old")
    local = tmp_path / "n" / "checkpoints"
    clock = ManualClock(start=time.time())
    mirror = CheckpointMirror(MirrorLimits(settle_s=3600.0, every_s=3600.0), clock)
    mirror.begin("j", lambda: store, local, None)
    assert (local / "old.pt").read_bytes() == b"old"
    assert not mirror.busy("j")
    (local / "new.pt").write_bytes(b"fresh")  # far from settled: only the final push takes it
    mirror.finish("j")
    assert wait_for(lambda: not mirror.busy("j"))
    assert stored(store) == {"checkpoints/old.pt": b"old", "checkpoints/new.pt": b"fresh"}
    mirror.close()


def test_checkpoint_mirror_pushes_periodically_and_survives_a_broken_store(
    tmp_path: Path,
) -> None:
    store = job_store(tmp_path)
    local = tmp_path / "n" / "checkpoints"
    clock = ManualClock(start=time.time() + 60)  # every file already settled
    mirror = CheckpointMirror(MirrorLimits(every_s=0.01), clock)

    def broken() -> ArtifactStore:
        raise OSError("store unreachable")

    mirror.begin("bad", broken, tmp_path / "m" / "checkpoints", None)  # logged, not raised
    mirror.begin("j", lambda: store, local, None)
    (local / "p.pt").write_bytes(b"p")
    assert wait_for(lambda: "checkpoints/p.pt" in store.list("checkpoints"))
    mirror.finish("bad")
    assert wait_for(lambda: not mirror.busy("bad"))
    mirror.close(timeout=10)


class BlockingStore(ArtifactStore):
    """A store whose uploads wait until the test lets them go."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.release = threading.Event()

    def put_stream(self, rel: str, chunks: Iterable[bytes]) -> StoredObject:
        self.release.wait(10)
        return super().put_stream(rel, chunks)


def test_busy_holds_until_the_final_push_is_done(tmp_path: Path) -> None:
    store = BlockingStore(f"file://{tmp_path / 'store'}")
    local = tmp_path / "n" / "checkpoints"
    mirror = CheckpointMirror(MirrorLimits(every_s=3600.0), ManualClock(start=time.time()))
    mirror.begin("j", lambda: store, local, None)
    (local / "last.pt").write_bytes(b"last")
    mirror.finish("j")
    assert mirror.busy("j")  # the final push waits in the store
    time.sleep(0.05)
    assert mirror.busy("j") and store.list("checkpoints") == []
    store.release.set()
    assert wait_for(lambda: not mirror.busy("j"))
    assert store.list("checkpoints") == ["checkpoints/last.pt"]
    mirror.close()


def test_a_linked_checkpoint_dir_is_neither_walked_nor_emptied_in_the_store(
    tmp_path: Path,
) -> None:
    store = job_store(tmp_path)
    local = node_dir(tmp_path, "n")
    (local / "keep.pt").write_bytes(b"k")
    pusher = Pusher(SETTLED)
    pusher.push(store, local, time.time())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "host.pt").write_bytes(b"host")
    (local / "keep.pt").unlink()
    local.rmdir()
    local.symlink_to(elsewhere)  # the checkpoint directory itself swapped for a link
    pushed = pusher.push(store, local, time.time(), final=True)
    assert pushed.stored == () and pushed.deleted == ()
    assert stored(store) == {"checkpoints/keep.pt": b"k"}


def test_a_link_in_the_store_prefix_is_not_pulled(tmp_path: Path) -> None:
    store = job_store(tmp_path)
    store.put_bytes("checkpoints/real.pt", b"r")
    secret = tmp_path / "secret"
    secret.write_bytes(b"host secret")
    prefix = tmp_path / "store" / "tenants" / "t" / "jobs" / "1" / "checkpoints"
    (prefix / "stolen.pt").symlink_to(secret)
    (prefix / "linked").symlink_to(tmp_path)
    local = tmp_path / "n" / "checkpoints"
    assert pull(store, local, MirrorLimits(), None).written == ("real.pt",)
    assert sorted(p.name for p in local.rglob("*")) == ["real.pt"]


NOBODY = 65534


def pull_as_ourselves_and_as_nobody_owner(base: Path) -> None:
    """Pull into ``base/none`` (owner None) and ``base/self`` (our own uid and gid)."""
    store = ArtifactStore(f"file://{base / 'store'}").child("tenants/t/jobs/1")
    for name, owner in (("none", None), ("self", (os.getuid(), os.getgid()))):
        local = base / name / "checkpoints"
        assert pull(store, local, MirrorLimits(), owner).written == ("deep/step.pt",)
        assert (local / "deep" / "step.pt").read_bytes() == b"step"
        assert os.stat(local / "deep" / "step.pt").st_uid == os.getuid()


def as_nobody(work: Callable[[], None]) -> int:
    """Run ``work`` in a forked child that dropped root for uid/gid 65534; its exit status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            work()
            status = 0
        finally:
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_pull_works_without_root() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as name:
        base = Path(name)
        store = ArtifactStore(f"file://{base / 'store'}").child("tenants/t/jobs/1")
        store.put_bytes("checkpoints/deep/step.pt", b"step")
        for path in [base, *base.rglob("*")]:
            os.chmod(path, 0o777 if path.is_dir() else 0o644)
        if os.geteuid() != 0:
            pull_as_ourselves_and_as_nobody_owner(base)
            return
        assert as_nobody(lambda: pull_as_ourselves_and_as_nobody_owner(base)) == 0
        assert os.stat(base / "self" / "checkpoints" / "deep" / "step.pt").st_uid == NOBODY

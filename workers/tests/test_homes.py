"""A session's persistent home: the pure plan (workers.agent.home_plan), then sync and restore
through the real artifact store (a directory; the round trip on S3 too) against a home
full of hostile entries."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import IO

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.agent.home_plan import (
    Base,
    HomeFile,
    HomeLimits,
    Manifest,
    ManifestError,
    fit,
    manifest_bytes,
    parse_manifest,
    path_refusal,
    plan_restore,
    plan_sync,
    read_limits,
)
from workers.agent.homes import BLOBS, MANIFEST, PENDING, restore, sync
from workers.artifacts import ArtifactStore, StoredObject
from workers.clock import ManualClock

PREFIX = "homes/acme/7/"
MiB = 1 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def f(path: str, size: int, content: str = "") -> HomeFile:
    """A home file of ``size`` bytes whose digest stands for ``content`` (or its path)."""
    return HomeFile(path, size, sha((content or path).encode()))


def write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file below ``root`` (no link followed), by relative path."""
    out = {}
    for current, _dirs, names in os.walk(root):
        for name in names:
            path = Path(current, name)
            if path.is_file() and not path.is_symlink():
                out[str(path.relative_to(root))] = path.read_bytes()
    return out


def stored_manifest(store: ArtifactStore) -> Manifest:
    with store.open_read(PREFIX + MANIFEST) as stream:
        return parse_manifest(stream.read())


def blobs(store: ArtifactStore) -> set[str]:
    return {p.rpartition("/")[2] for p in store.list(PREFIX + BLOBS)}


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(f"file://{tmp_path / 'store'}")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "scratch" / "home"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside the home that no sync may upload."""
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_bytes(b"the agent's secret")
    return path


# -- the pure core ------------------------------------------------------------------------


def test_plan_uploads_new_content_once_and_reuses_what_the_store_holds() -> None:
    old = Manifest((f("a.ipynb", 10, "v1"), f("b.py", 5), f("gone.txt", 3)))
    local = [f("a.ipynb", 12, "v2"), f("b.py", 5), f("copy.py", 5, "b.py"), f("new.txt", 1)]
    plan = plan_sync(old, local, quota=100, max_files=10)
    assert [u.path for u in plan.uploads] == ["a.ipynb", "new.txt"]  # b.py's content is stored
    assert [m.path for m in plan.manifest.files] == ["a.ipynb", "b.py", "copy.py", "new.txt"]
    assert plan.unused == {sha(b"v1"), sha(b"gone.txt")}
    assert plan.left_out == ()
    first = plan_sync(None, local, quota=100, max_files=10)
    assert len(first.uploads) == 3 and first.unused == frozenset()  # copy.py shares b.py's blob


def test_plan_leaves_the_largest_files_out_at_the_quota_and_says_so() -> None:
    local = [f("big.bin", 60), f("notes.md", 10), f("data.csv", 30), f("b.ipynb", 10)]
    plan = plan_sync(None, local, quota=55, max_files=10)
    assert [m.path for m in plan.manifest.files] == ["b.ipynb", "data.csv", "notes.md"]
    assert plan.manifest.total == 50
    (path, why), *rest = plan.left_out
    assert path == "big.bin" and not rest
    assert "quota of 55 bytes" in why and "60 bytes" in why
    counted = plan_sync(None, local, quota=1000, max_files=2)
    assert [p for p, _ in counted.left_out] == ["data.csv", "big.bin"]
    assert all("more than 2 files" in why for _, why in counted.left_out)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=1000), max_size=30),
    quota=st.integers(min_value=0, max_value=5000),
    max_files=st.integers(min_value=0, max_value=30),
)
def test_fit_keeps_within_bounds_and_leaves_out_only_the_largest(
    sizes: list[int], quota: int, max_files: int
) -> None:
    files = [f(f"file{i}", size) for i, size in enumerate(sizes)]
    kept, left = fit(files, quota, max_files)
    assert sum(k.size for k in kept) <= quota and len(kept) <= max_files
    assert sorted([k.path for k in kept] + [p for p, _ in left]) == sorted(x.path for x in files)
    by_path = {x.path: x.size for x in files}
    if kept and left:
        assert max(k.size for k in kept) <= min(by_path[p] for p, _ in left)


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", "", "a\0b", "x" * 1025,
     "/".join(["d"] * 40), "caf\udce9"],
)  # fmt: skip
def test_bad_names_are_refused(path: str) -> None:
    assert path_refusal(path, HomeLimits()) is not None


def test_good_names_pass() -> None:
    for path in ("a", ".jupyter/lab/settings.json", "café/notes.ipynb", "a..b", "x" * 1024):
        assert path_refusal(path, HomeLimits()) is None


def test_restore_plan_refuses_hostile_entries_and_respects_a_smaller_quota() -> None:
    manifest = Manifest(
        (f("../escape", 1), f("/abs", 1), f("ok.txt", 4), f("ok.txt", 4, "dup"), f("a", 1),
         f("a/b", 1), f("big", 90), f("mid", 20))
    )  # fmt: skip
    kept, refused = plan_restore(manifest, 30, HomeLimits())
    assert [k.path for k in kept] == ["a/b", "mid", "ok.txt"]
    why = dict(refused)
    assert set(why) == {"../escape", "/abs", "ok.txt", "a", "big"}
    assert "twice" in why["ok.txt"] and "folder" in why["a"] and "quota" in why["big"]


def test_manifest_round_trip_and_damage() -> None:
    manifest = Manifest((HomeFile("a", 1, sha(b"a"), True), HomeFile("b/c", 0, sha(b""))))
    assert parse_manifest(manifest_bytes(manifest)) == manifest
    bad = [b"{", b"[]", b'{"version": 2, "files": []}', b'{"version": 1, "files": {}}',
           b'{"version": 1, "files": [{"path": "a", "size": -1, "sha256": "' + b"0" * 64
           + b'", "executable": false}]}',
           b'{"version": 1, "files": [{"path": "a", "size": 1, "sha256": "XYZ", '
           b'"executable": false}]}']  # fmt: skip
    for data in bad:
        with pytest.raises(ManifestError):
            parse_manifest(data)


def test_limits_from_the_environment() -> None:
    assert read_limits({}) == HomeLimits()
    assert read_limits({"SESSION_HOME_MAX_FILES": "50"}).max_files == 50
    with pytest.raises(ValueError, match="SESSION_HOME_MAX_DEPTH"):
        read_limits({"SESSION_HOME_MAX_DEPTH": "0"})
    with pytest.raises(ValueError, match="SESSION_HOME_MAX_FILES must be a whole number"):
        read_limits({"SESSION_HOME_MAX_FILES": "many"})


# -- sync and restore through the store ---------------------------------------------------

FILES = {
    "notebook.ipynb": b'{"cells": []}',
    ".jupyter/lab/user-settings/theme.json": b'{"theme": "dark"}',
    "src/train.py": b"print('hi')\n" * 1000,
    "src/copy_of_train.py": b"print('hi')\n" * 1000,
    "empty": b"",
    "café/données.csv": b"1,2,3\n",
    "big.bin": os.urandom(3 * MiB),  # more than one chunk
}


def test_round_trip_through_the_store(root_url: str, home: Path, tmp_path: Path) -> None:
    store = ArtifactStore(root_url)
    write(home, FILES)
    (home / "src" / "train.py").chmod(0o755)
    first = sync(store, PREFIX, home, 10 * MiB)
    assert first.manifest_written, first.message
    assert (first.files, first.bytes) == (len(FILES), sum(map(len, FILES.values())))
    assert len(blobs(store)) == len(FILES) - 1  # the copy shares its original's blob
    assert store.list(PREFIX + PENDING) == []

    dest = tmp_path / "next-session" / "home"
    dest.parent.mkdir()
    back = restore(store, PREFIX, dest, 10 * MiB)
    assert back.skipped == () and back.error is None, back.message
    assert tree(dest) == FILES
    assert stat.S_IMODE((dest / "src" / "train.py").stat().st_mode) == 0o700
    assert stat.S_IMODE((dest / "notebook.ipynb").stat().st_mode) == 0o600
    assert stat.S_IMODE(dest.stat().st_mode) == 0o700

    # The next session changes one file and deletes another: one upload, one blob gone.
    (dest / "notebook.ipynb").write_bytes(b'{"cells": [1]}')
    (dest / "big.bin").unlink()
    second = sync(store, PREFIX, dest, 10 * MiB)
    assert second.stored == ("notebook.ipynb",) and second.unchanged == len(FILES) - 2
    assert second.deleted == 2  # the old notebook's and big.bin's blobs
    assert blobs(store) == stored_manifest(store).digests
    again = tmp_path / "third"
    restore(store, PREFIX, again, 10 * MiB)
    assert tree(again) == tree(dest)


def test_first_session_starts_empty(store: ArtifactStore, tmp_path: Path) -> None:
    dest = tmp_path / "home"
    result = restore(store, PREFIX, dest, MiB)
    assert result.manifest_sha256 is None and result.restored == ()
    assert dest.is_dir() and list(dest.iterdir()) == []
    assert "empty home" in result.message


def test_a_link_to_etc_passwd_is_not_uploaded(
    store: ArtifactStore, home: Path, secret: Path
) -> None:
    write(home, {"mine.txt": b"mine"})
    (home / "passwd").symlink_to("/etc/passwd")
    (home / "secret.txt").symlink_to(secret)
    os.mkfifo(home / "pipe")  # opened, it would block the walk forever
    result = sync(store, PREFIX, home, MiB)
    assert [m.path for m in stored_manifest(store).files] == ["mine.txt"]
    skipped = dict(result.skipped)
    assert "symbolic link" in skipped["passwd"] and "symbolic link" in skipped["secret.txt"]
    assert "FIFO" in skipped["pipe"]
    assert sha(Path("/etc/passwd").read_bytes()) not in blobs(store)
    assert sha(secret.read_bytes()) not in blobs(store)
    assert blobs(store) == {sha(b"mine")}


def test_a_symlinked_directory_is_not_walked(
    store: ArtifactStore, home: Path, secret: Path
) -> None:
    write(home, {"real/a.txt": b"a"})
    (home / "etc").symlink_to("/etc")
    (home / "real" / "out").symlink_to(secret.parent)
    result = sync(store, PREFIX, home, 100 * MiB)
    assert [m.path for m in stored_manifest(store).files] == ["real/a.txt"]
    assert {"etc", "real/out"} <= dict(result.skipped).keys()
    assert blobs(store) == {sha(b"a")}


def test_a_file_swapped_for_a_link_during_the_sync_is_not_followed(
    tmp_path: Path, home: Path, secret: Path
) -> None:
    """The walk hashed ``notes.txt``; before its upload the tenant swaps it for a link to a
    file of the same size: the upload's no-follow open refuses it."""
    write(home, {"notes.txt": b"x" * len(secret.read_bytes()), "keep.txt": b"keep"})

    class Swapping(ArtifactStore):
        def put_bytes(self, rel: str, data: bytes) -> StoredObject:
            if rel.startswith(PREFIX + PENDING):  # between the walk and the uploads
                (home / "notes.txt").unlink()
                (home / "notes.txt").symlink_to(secret)
            return super().put_bytes(rel, data)

    store = Swapping(f"file://{tmp_path / 'store'}")
    result = sync(store, PREFIX, home, MiB)
    assert result.manifest_written
    assert [m.path for m in stored_manifest(store).files] == ["keep.txt"]
    assert "replaced while it was synced" in dict(result.left_out)["notes.txt"]
    assert sha(secret.read_bytes()) not in blobs(store)
    assert blobs(store) == {sha(b"keep")}  # nothing uploaded under the hashed digest


def test_quota_leaves_out_the_largest_files_and_says_which(
    store: ArtifactStore, home: Path
) -> None:
    write(home, {"a.ipynb": b"a" * 100, "b.ipynb": b"b" * 200, "data.bin": b"d" * 5000,
                 "model.pt": b"m" * 900})  # fmt: skip
    result = sync(store, PREFIX, home, 1500)
    assert [m.path for m in stored_manifest(store).files] == ["a.ipynb", "b.ipynb", "model.pt"]
    assert [path for path, _ in result.left_out] == ["data.bin"]
    assert "1 left out: data.bin (over the home's quota of 1.5 KiB" in result.message
    assert blobs(store) == {sha(b"a" * 100), sha(b"b" * 200), sha(b"m" * 900)}


def test_walk_limits_end_a_hostile_home(store: ArtifactStore, home: Path) -> None:
    deep = home / "/".join(f"d{i}" for i in range(6))
    deep.mkdir(parents=True)
    (deep / "deep.txt").write_bytes(b"deep")
    write(home, {f"many/{i:03}": b"%d" % i for i in range(50)})
    limits = HomeLimits(max_depth=3, max_entries=30)
    result = sync(store, PREFIX, home, MiB, limits=limits)
    kept = [m.path for m in stored_manifest(store).files]
    assert "d0/d1/d2/d3/d4/d5/deep.txt" not in kept
    assert "d0/d1/d2/d3" in dict(result.skipped)  # a folder 4 deep is not entered
    assert any("the walk stopped after 30 entries" in why for _, why in result.skipped)
    assert len(kept) < 30


def test_a_file_of_another_uid_is_skipped(store: ArtifactStore, home: Path) -> None:
    """A hard link to someone else's file looks like any file but its owner: given the
    session's uid, a sync stores only that uid's files."""
    write(home, {"mine.txt": b"mine", "theirs.txt": b"theirs"})
    session = (os.getuid() + 4242, os.getgid() + 4242)
    if os.geteuid() == 0:
        os.chown(home / "mine.txt", *session)
    result = sync(store, PREFIX, home, MiB, owner=session)
    expected = ["mine.txt"] if os.geteuid() == 0 else []
    assert [m.path for m in stored_manifest(store).files] == expected
    assert "not the session's own file" in dict(result.skipped)["theirs.txt"]


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another uid needs root")
def test_restore_hands_every_file_and_folder_to_the_session(
    store: ArtifactStore, home: Path, tmp_path: Path
) -> None:
    write(home, {"a/b/c.txt": b"c", "top.txt": b"t"})
    sync(store, PREFIX, home, MiB)
    session = (54321, 54321)
    dest = tmp_path / "dest"
    restore(store, PREFIX, dest, MiB, owner=session)
    for path in (dest, dest / "a", dest / "a" / "b", dest / "a" / "b" / "c.txt", dest / "top.txt"):
        assert (path.stat().st_uid, path.stat().st_gid) == session


def test_a_corrupt_stored_file_is_not_restored(
    store: ArtifactStore, home: Path, tmp_path: Path
) -> None:
    write(home, {"good.txt": b"good", "flipped.txt": b"original", "short.txt": b"longer"})
    sync(store, PREFIX, home, MiB)
    store.put_bytes(f"{PREFIX}{BLOBS}/{sha(b'original')}", b"originaL")  # same size
    store.put_bytes(f"{PREFIX}{BLOBS}/{sha(b'longer')}", b"long")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "flipped.txt").write_bytes(b"what was there")
    result = restore(store, PREFIX, dest, MiB)
    assert result.restored == ("good.txt",)
    why = dict(result.skipped)
    assert "corrupt" in why["flipped.txt"] and "corrupt" in why["short.txt"]
    assert tree(dest) == {"good.txt": b"good", "flipped.txt": b"what was there"}
    assert [p.name for p in dest.iterdir() if p.name.endswith(".part")] == []


def test_a_hostile_manifest_writes_nothing_outside_dest(
    store: ArtifactStore, tmp_path: Path
) -> None:
    digest = store.put_bytes(f"{PREFIX}{BLOBS}/{sha(b'evil')}", b"evil").sha256
    entries = [{"path": p, "size": 4, "sha256": digest, "executable": False}
               for p in ("../evil", "/tmp/evil", "a/../../evil", "fine.txt")]  # fmt: skip
    store.put_bytes(PREFIX + MANIFEST, json.dumps({"version": 1, "files": entries}).encode())
    dest = tmp_path / "box" / "dest"
    dest.parent.mkdir()
    result = restore(store, PREFIX, dest, MiB)
    assert result.restored == ("fine.txt",)
    assert len(result.skipped) == 3
    assert sorted(p.name for p in tmp_path.joinpath("box").iterdir()) == ["dest"]
    assert not Path("/tmp/evil").exists()


def test_restore_replaces_a_planted_link_instead_of_writing_through_it(
    store: ArtifactStore, home: Path, tmp_path: Path, secret: Path
) -> None:
    write(home, {"cfg/settings.json": b"{}", "notes.txt": b"n"})
    sync(store, PREFIX, home, MiB)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "cfg").symlink_to(secret.parent)  # a folder's place
    (dest / "notes.txt").symlink_to(secret)  # a file's place
    result = restore(store, PREFIX, dest, MiB)
    assert sorted(result.restored) == ["cfg/settings.json", "notes.txt"]
    assert secret.read_bytes() == b"the agent's secret"
    assert sorted(p.name for p in secret.parent.iterdir()) == ["secret.txt"]
    assert not (dest / "cfg").is_symlink() and (dest / "notes.txt").read_bytes() == b"n"


def test_restore_into_a_link_is_refused(store: ArtifactStore, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "dest").symlink_to(target)
    with pytest.raises(OSError):
        restore(store, PREFIX, tmp_path / "dest", MiB)


class Failing(ArtifactStore):
    """The real store, which fails (as a crash would) after ``allowed`` blob uploads."""

    def __init__(self, url: str, allowed: int, error: type[Exception]) -> None:
        super().__init__(url)
        self.allowed = allowed
        self.error = error

    def put_stream(self, rel: str, chunks: Iterable[bytes]) -> StoredObject:
        if f"/{BLOBS}/" in f"/{rel}":
            if self.allowed <= 0:
                raise self.error("the store went away")
            self.allowed -= 1
        return super().put_stream(rel, chunks)


def test_an_interrupted_sync_leaves_the_old_home_restorable(
    root_url: str, home: Path, tmp_path: Path
) -> None:
    store = ArtifactStore(root_url)
    before = {f"nb{i}.ipynb": b"version 1 of %d" % i for i in range(5)}
    write(home, before)
    assert sync(store, PREFIX, home, MiB).manifest_written
    old_manifest = store.open_read(PREFIX + MANIFEST).read()

    write(home, {f"nb{i}.ipynb": b"version 2 of %d!" % i for i in range(5)})
    (home / "nb4.ipynb").unlink()
    clock = ManualClock()
    crashing = Failing(store.url, allowed=2, error=RuntimeError)
    with pytest.raises(RuntimeError):
        sync(crashing, PREFIX, home, MiB, clock=clock)
    assert store.open_read(PREFIX + MANIFEST).read() == old_manifest
    dest = tmp_path / "after-crash"
    result = restore(store, PREFIX, dest, MiB)
    assert tree(dest) == before and result.skipped == ()

    refused = Failing(store.url, allowed=1, error=OSError)
    said = sync(refused, PREFIX, home, MiB, clock=clock)
    assert not said.manifest_written and "stored home is unchanged" in said.message
    assert store.open_read(PREFIX + MANIFEST).read() == old_manifest

    assert len(store.list(PREFIX + PENDING)) == 1  # the crash's record; the refused one's went

    # The crashed sync's uploads (version 2 of nb0 and nb1) are orphans once the home moves
    # on: kept while its pending record is live (it may be another session's sync, still
    # running), swept by the first sync after the record goes stale.
    write(home, {f"nb{i}.ipynb": b"version 3 of %d" % i for i in range(4)})
    after = sync(store, PREFIX, home, MiB, clock=clock)
    assert after.manifest_written and after.deleted == 5  # version 1's blobs
    orphans = blobs(store) - stored_manifest(store).digests
    assert orphans == {sha(b"version 2 of 0!"), sha(b"version 2 of 1!")}
    clock.advance(HomeLimits().stale_s + 1)
    assert sync(store, PREFIX, home, MiB, clock=clock).deleted == 2
    assert blobs(store) == stored_manifest(store).digests
    assert store.list(PREFIX + PENDING) == []
    final = tmp_path / "final"
    restore(store, PREFIX, final, MiB)
    assert tree(final) == tree(home)


def test_a_sync_keeps_the_blobs_of_another_live_sync(store: ArtifactStore, home: Path) -> None:
    """Two sessions of one user: one's sweep must not delete what the other is uploading."""
    write(home, {"a.txt": b"a"})
    other = sha(b"being uploaded by the other session")
    store.put_bytes(f"{PREFIX}{BLOBS}/{other}", b"being uploaded by the other session")
    clock = ManualClock()
    pending = json.dumps({"at": clock.now(), "digests": [other]}).encode()
    store.put_bytes(f"{PREFIX}{PENDING}/other.json", pending)
    sync(store, PREFIX, home, MiB, clock=clock)
    assert other in blobs(store)
    clock.advance(HomeLimits().stale_s + 1)
    sync(store, PREFIX, home, MiB, clock=clock)
    assert blobs(store) == {sha(b"a")}


def test_merge_keeps_stored_files_no_local_file_replaces() -> None:
    old = Manifest((f("a", 1, "old a"), f("b", 1), f("c/d", 1), f("e/f", 1), f("g", 1)))
    local = [f("a", 2, "new a"), f("c", 3), f("e/f/h", 1), f("z", 1)]
    plan = plan_sync(old, local, quota=100, max_files=10, merge=True)
    # a: the local one; c/d: its folder is a local file now; e/f: a local folder now
    assert [m.path for m in plan.manifest.files] == ["a", "b", "c", "e/f/h", "g", "z"]
    assert plan.manifest.files[0].sha256 == sha(b"new a")
    assert plan.unused == {sha(b"old a"), sha(b"c/d"), sha(b"e/f")}
    assert [m.path for m in plan_sync(old, local, 100, 10).manifest.files] == [
        "a",
        "c",
        "e/f/h",
        "z",
    ]


class Unreadable(ArtifactStore):
    """The real store whose manifest cannot be read (a store outage at the session's start)."""

    def open_sized(self, rel: str) -> tuple[IO[bytes], int]:
        if rel.endswith(MANIFEST):
            raise OSError("the store is away")
        return super().open_sized(rel)


def test_a_session_whose_restore_failed_does_not_drop_the_stored_home(
    store: ArtifactStore, home: Path, tmp_path: Path
) -> None:
    write(home, {"kept.ipynb": b"months of work", "old.txt": b"old"})
    sync(store, PREFIX, home, MiB)
    failed = restore(Unreadable(store.url), PREFIX, tmp_path / "session", MiB)
    assert failed.error is not None and "not restored" in failed.message
    assert failed.base.complete is False
    write(tmp_path / "session", {"new.ipynb": b"today", "old.txt": b"rewritten"})
    result = sync(store, PREFIX, tmp_path / "session", MiB, base=failed.base)
    assert result.merged and "merged with the stored home" in result.message
    dest = tmp_path / "next"
    restore(store, PREFIX, dest, MiB)
    assert tree(dest) == {"kept.ipynb": b"months of work", "old.txt": b"rewritten",
                          "new.ipynb": b"today"}  # fmt: skip
    assert result.base is not None and result.base.complete is False  # and it stays merging


def test_one_session_s_syncs_replace_while_another_s_merge(
    store: ArtifactStore, tmp_path: Path
) -> None:
    """Syncs of one session (every few minutes, then at stop) carry its deletions; a
    second session of the same user that synced meanwhile is not overwritten."""
    write(tmp_path / "seed", {"a.txt": b"a", "b.txt": b"b"})
    sync(store, PREFIX, tmp_path / "seed", MiB)
    one, two = tmp_path / "one", tmp_path / "two"
    base_one = restore(store, PREFIX, one, MiB).base
    base_two = restore(store, PREFIX, two, MiB).base
    (one / "a.txt").unlink()
    first = sync(store, PREFIX, one, MiB, base=base_one)
    assert not first.merged and [m.path for m in stored_manifest(store).files] == ["b.txt"]
    assert first.base is not None
    (one / "b.txt").unlink()
    write(one, {"c.txt": b"c"})
    second = sync(store, PREFIX, one, MiB, base=first.base)
    assert not second.merged and [m.path for m in stored_manifest(store).files] == ["c.txt"]

    write(two, {"d.txt": b"d"})
    other = sync(store, PREFIX, two, MiB, base=base_two)  # session one synced since
    assert other.merged
    assert [m.path for m in stored_manifest(store).files] == ["a.txt", "b.txt", "c.txt", "d.txt"]


def test_a_home_that_is_a_link_is_not_synced(
    store: ArtifactStore, home: Path, tmp_path: Path, secret: Path
) -> None:
    write(home, {"a.txt": b"a"})
    sync(store, PREFIX, home, MiB)
    before = store.open_read(PREFIX + MANIFEST).read()
    linked = tmp_path / "scratch" / "linked"
    linked.symlink_to(secret.parent)
    result = sync(store, PREFIX, linked, MiB)
    assert not result.manifest_written and "could not be opened" in result.message
    assert store.open_read(PREFIX + MANIFEST).read() == before


@pytest.mark.parametrize("quota", [-1, 1.5, True])
def test_a_bad_quota_is_refused_and_changes_nothing(
    store: ArtifactStore, home: Path, tmp_path: Path, quota: object
) -> None:
    write(home, {"a.txt": b"a"})
    with pytest.raises(ValueError, match="quota"):
        sync(store, PREFIX, home, quota)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="quota"):
        restore(store, PREFIX, tmp_path / "dest", quota)  # type: ignore[arg-type]
    assert store.list() == [] and not (tmp_path / "dest").exists()


def test_content_the_store_lost_is_uploaded_again(
    store: ArtifactStore, home: Path, tmp_path: Path
) -> None:
    write(home, {"a.txt": b"a", "b.txt": b"b"})
    sync(store, PREFIX, home, MiB)
    store.delete(f"{PREFIX}{BLOBS}/{sha(b'a')}")
    again = sync(store, PREFIX, home, MiB)
    assert again.stored == ("a.txt",) and again.unchanged == 1
    dest = tmp_path / "dest"
    assert restore(store, PREFIX, dest, MiB).skipped == ()
    assert tree(dest) == {"a.txt": b"a", "b.txt": b"b"}
    plan = plan_sync(Manifest((f("a", 1), f("b", 1))), [], 10, 10, merge=True, held=frozenset())
    assert plan.manifest.files == ()  # a merge keeps no file whose content is lost


def test_a_failed_restore_still_makes_the_home(tmp_path: Path, store: ArtifactStore) -> None:
    result = restore(Unreadable(store.url), PREFIX, tmp_path / "home", MiB)
    assert result.error is not None and (tmp_path / "home").is_dir()


def test_a_base_survives_its_text_and_junk_is_refused() -> None:
    for base in (Base(None), Base(sha(b"m"), complete=False)):
        assert Base.decode(base.encode()) == base
    for junk in ("", "[]", '{"manifest_sha256": "abc", "complete": true}',
                 '{"manifest_sha256": null, "complete": 1}'):  # fmt: skip
        with pytest.raises(ValueError, match="not a home's base"):
            Base.decode(junk)

"""The artifact store and the node's code cache: atomic objects, bundles unpacked once."""

from __future__ import annotations

import multiprocessing
import stat
import threading
from pathlib import Path

import pytest

from workers.agent import code_cache
from workers.agent.code_cache import CodeCache
from workers.artifacts import ArtifactPathError, ArtifactStore
from workers.bundle import BundleError, BundleLimits, sha256_file
from workers.tests.bundles import GOOD_FILES, tar_gz, zip_file


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(f"file://{tmp_path / 'store'}")


def _stored(store: ArtifactStore, archive: Path, rel: str = "") -> tuple[str, str]:
    code_id = sha256_file(archive)
    rel = rel or f"tenants/acme/bundles/{code_id}.tar.gz"
    store.put_file(rel, archive)
    return code_id, rel


# --- the artifact store ---------------------------------------------------------------


def test_store_round_trip_and_delete(tmp_path: Path, store: ArtifactStore) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"bundle bytes")
    store.put_file("a/b/c.bin", src)
    assert store.exists("a/b/c.bin")
    with store.open_read("a/b/c.bin") as stream:
        assert stream.read() == b"bundle bytes"
    store.get_file("a/b/c.bin", tmp_path / "copy.bin")
    assert (tmp_path / "copy.bin").read_bytes() == b"bundle bytes"
    assert [p.name for p in (tmp_path / "store" / "a" / "b").iterdir()] == ["c.bin"]  # no temp
    store.delete("a/b/c.bin")
    store.delete("a/b/c.bin")  # gone already: nothing happens
    assert not store.exists("a/b/c.bin")
    with pytest.raises(FileNotFoundError):
        store.get_file("a/b/c.bin", tmp_path / "again.bin")


def test_a_plain_path_is_a_store_too(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x")
    ArtifactStore(str(tmp_path / "plain")).put_file("x.bin", src)
    assert (tmp_path / "plain" / "x.bin").read_bytes() == b"x"


def test_a_failed_put_leaves_neither_object_nor_temporary(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path / "store"))
    with pytest.raises(FileNotFoundError):
        store.put_file("x/y.bin", tmp_path / "missing.bin")
    assert not store.exists("x/y.bin")
    assert list((tmp_path / "store" / "x").iterdir()) == []


@pytest.mark.parametrize("rel", ["", "/etc/passwd", "../outside", "a/../../b", "a\\b"])
def test_paths_outside_the_store_are_refused(store: ArtifactStore, rel: str) -> None:
    with pytest.raises(ArtifactPathError):
        store.exists(rel)


# --- the code cache -------------------------------------------------------------------


@pytest.mark.parametrize("build", [tar_gz, zip_file])
def test_ensure_unpacks_a_read_only_copy_once(
    tmp_path: Path, store: ArtifactStore, build: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    code_id, rel = _stored(store, build(tmp_path / "code.bin"))  # type: ignore[operator]
    cache = CodeCache(tmp_path / "cache", store)
    where = cache.ensure(code_id, rel)
    assert where == tmp_path / "cache" / code_id
    assert (where / "pkg" / "model.py").read_bytes() == GOOD_FILES["pkg/model.py"]
    assert stat.S_IMODE((where / "train.py").stat().st_mode) == 0o444
    assert stat.S_IMODE((where / "pkg").stat().st_mode) == 0o555

    def no_second_unpack(*args: object) -> None:
        raise AssertionError("unpacked twice")

    monkeypatch.setattr(code_cache, "extract", no_second_unpack)
    store.delete(rel)  # a second call needs neither the store nor an extraction
    assert cache.ensure(code_id, rel) == where
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")] == [
        code_id
    ]


def test_a_bundle_that_does_not_match_its_id_is_refused(
    tmp_path: Path, store: ArtifactStore
) -> None:
    code_id, _ = _stored(store, tar_gz(tmp_path / "one.tgz"))
    other = tar_gz(tmp_path / "two.tgz", {"other.py": b"x"})
    store.put_file("tenants/acme/bundles/swapped.tar.gz", other)
    cache = CodeCache(tmp_path / "cache", store)
    with pytest.raises(BundleError, match="does not match its id"):
        cache.ensure(code_id, "tenants/acme/bundles/swapped.tar.gz")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f".{code_id}.lock"]


def test_a_hostile_bundle_leaves_nothing_in_the_cache(tmp_path: Path, store: ArtifactStore) -> None:
    code_id, rel = _stored(store, tar_gz(tmp_path / "big.tgz", {"a.bin": bytes(5000)}))
    cache = CodeCache(tmp_path / "cache", store, BundleLimits(max_unpacked_bytes=1000))
    with pytest.raises(BundleError, match="unpacked"):
        cache.ensure(code_id, rel)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f".{code_id}.lock"]


def test_ids_that_are_not_sha256_are_refused(tmp_path: Path, store: ArtifactStore) -> None:
    with pytest.raises(BundleError, match="not a bundle id"):
        CodeCache(tmp_path / "cache", store).ensure("../../etc", "x.tar.gz")


def test_concurrent_threads_end_with_one_copy(tmp_path: Path, store: ArtifactStore) -> None:
    code_id, rel = _stored(store, tar_gz(tmp_path / "code.tgz"))
    cache = CodeCache(tmp_path / "cache", store)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.ensure(code_id, rel)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [tmp_path / "cache" / code_id] * 8
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [f".{code_id}.lock", code_id]


def _ensure_in_child(root: str, url: str, code_id: str, rel: str) -> None:
    CodeCache(Path(root), ArtifactStore(url)).ensure(code_id, rel)


def test_concurrent_processes_end_with_one_copy(tmp_path: Path, store: ArtifactStore) -> None:
    code_id, rel = _stored(store, tar_gz(tmp_path / "code.tgz"))
    root = tmp_path / "cache"
    spawn = multiprocessing.get_context("spawn")
    children = [
        spawn.Process(target=_ensure_in_child, args=(str(root), store.url, code_id, rel))
        for _ in range(4)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0] * 4
    assert sorted(p.name for p in root.iterdir()) == [f".{code_id}.lock", code_id]
    assert (root / code_id / "train.py").read_bytes() == GOOD_FILES["train.py"]

"""Code bundle archives: what is accepted, every refusal, and bombs stopped while unpacking."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import IO

import pytest

from workers import bundle
from workers.bundle import BundleError, BundleFile, BundleLimits, extract, inspect
from workers.tests.bundles import (
    GOOD_FILES,
    tar_bomb,
    tar_entry,
    tar_gz,
    zip_bomb,
    zip_file,
)

BOMB_TOTAL = 1 << 30  # 1 GiB of zeros, about 1 MB packed
BOMB_LIMITS = BundleLimits(max_unpacked_bytes=10 * bundle.MiB)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tar.gz and a zip bomb, built once for the module (each takes a few seconds)."""
    root = tmp_path_factory.mktemp("bombs")
    return {
        "tar.gz": tar_bomb(root / "bomb.tgz", BOMB_TOTAL),
        "zip": zip_bomb(root / "bomb.zip", BOMB_TOTAL),
    }


def _refusal(path: Path, limits: BundleLimits | None = None) -> str:
    with pytest.raises(BundleError) as caught:
        inspect(path, limits)
    return str(caught.value)


@pytest.mark.parametrize("build", [tar_gz, zip_file])
def test_a_good_bundle_is_described_by_its_bytes(tmp_path: Path, build: object) -> None:
    path = build(tmp_path / "code.bin")  # type: ignore[operator]
    info = inspect(path)
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info.size == path.stat().st_size
    assert info.kind == ("tar.gz" if build is tar_gz else "zip")
    assert info.files == tuple(BundleFile(name, len(data)) for name, data in GOOD_FILES.items())
    assert info.unpacked_bytes == sum(len(data) for data in GOOD_FILES.values())


def test_the_kind_comes_from_the_content_not_the_name(tmp_path: Path) -> None:
    assert inspect(tar_gz(tmp_path / "looks-like.zip")).kind == "tar.gz"
    assert inspect(zip_file(tmp_path / "looks-like.tar.gz")).kind == "zip"


def test_extract_writes_read_only_files_and_folders(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    info = extract(tar_gz(tmp_path / "code.tgz", extra=[tar_entry("empty", tarfile.DIRTYPE)]), dest)
    assert (dest / "pkg" / "model.py").read_bytes() == GOOD_FILES["pkg/model.py"]
    assert stat.S_IMODE((dest / "train.py").stat().st_mode) == 0o444
    for folder in (dest, dest / "pkg", dest / "empty"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o555
    assert [f.path for f in info.files] == list(GOOD_FILES)
    bundle.remove_tree(dest)
    assert not dest.exists()


def test_removing_a_read_only_tree_removes_its_links_and_never_what_they_name(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("not the tree's")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "to-dir").symlink_to(outside / "keep")
    (tree / "to-file").symlink_to(outside / "keep" / "file")
    for folder in (tree / "sub", tree):
        folder.chmod(0o555)
    bundle.remove_tree(tree)
    assert not tree.exists() and (outside / "keep" / "file").read_text() == "not the tree's"


@pytest.mark.parametrize(
    "content",
    # mtime=0: a test id made of the bytes must be the same in every process (pytest -n).
    [b"just some text, long enough", b"", gzip.compress(b"a gzip that holds no tar" * 40, mtime=0)],
    ids=["text", "empty", "gzip-not-tar"],
)
def test_what_is_not_a_tar_gz_or_zip_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "code.tar.gz"
    path.write_bytes(content)
    assert "not an archive (.tar.gz, .tgz or .zip)" in _refusal(path)


def test_a_bzip2_tar_is_not_a_bundle(tmp_path: Path) -> None:
    path = tmp_path / "code.tgz"
    with tarfile.open(path, "w:bz2") as tar:
        tar.add(tar_gz(tmp_path / "inner.tgz"), "inner.tgz")
    assert "not an archive" in _refusal(path)


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        (tar_entry("evil", tarfile.SYMTYPE, "/etc/passwd"), "symbolic link"),
        (tar_entry("evil", tarfile.LNKTYPE, "train.py"), "hard link"),
        (tar_entry("evil", tarfile.FIFOTYPE), "FIFO"),
        (tar_entry("evil", tarfile.CHRTYPE), "device"),
        (tar_entry("evil", tarfile.BLKTYPE), "device"),
    ],
)
def test_tar_links_and_special_files_are_refused(
    tmp_path: Path, entry: tarfile.TarInfo, words: str
) -> None:
    message = _refusal(tar_gz(tmp_path / "code.tgz", extra=[entry]))
    assert "'evil'" in message and words in message


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("/etc/cron.d/evil", "absolute path"),
        ("../evil.py", "outside the bundle"),
        ("pkg/../../evil.py", "outside the bundle"),
        ("pkg\\evil.py", "backslash"),
    ],
)
def test_tar_paths_that_leave_the_bundle_are_refused(tmp_path: Path, name: str, words: str) -> None:
    message = _refusal(tar_gz(tmp_path / "code.tgz", {"ok.py": b"1", name: b"2"}))
    assert repr(name) in message and words in message


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("../evil.py", "outside the bundle"),
        ("a/../../evil.py", "outside the bundle"),
        ("/abs.py", "absolute path"),
        ("..\\evil.py", "backslash"),
        ("C:/Windows/evil.py", "drive letter"),
    ],
)
def test_zip_paths_that_leave_the_bundle_are_refused(tmp_path: Path, name: str, words: str) -> None:
    message = _refusal(zip_file(tmp_path / "code.zip", {"ok.py": b"1", name: b"2"}))
    assert repr(name) in message and words in message


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        (stat.S_IFLNK | 0o777, "symbolic link"),
        (stat.S_IFIFO | 0o644, "device, FIFO or socket"),
        (stat.S_IFCHR | 0o644, "device, FIFO or socket"),
    ],
)
def test_zip_links_and_special_files_are_refused_by_their_mode_bits(
    tmp_path: Path, mode: int, words: str
) -> None:
    path = zip_file(tmp_path / "code.zip", {"ok.py": b"1", "evil": b"/etc/passwd"}, {"evil": mode})
    message = _refusal(path)
    assert "'evil'" in message and words in message


@pytest.mark.parametrize("build", [tar_gz, zip_file])
def test_duplicate_names_are_refused(tmp_path: Path, build: object) -> None:
    path = tmp_path / "code.bin"
    if build is tar_gz:
        tar_gz(path, extra=[tar_entry("./train.py", tarfile.REGTYPE)])
    else:
        zip_file(path)
        with pytest.warns(UserWarning), zipfile.ZipFile(path, "a") as archive:
            archive.writestr("train.py", b"again")
    assert "'train.py' appears more than once" in _refusal(path)


def test_a_file_used_as_a_folder_is_refused(tmp_path: Path) -> None:
    path = tar_gz(tmp_path / "code.tgz", {"pkg": b"file", "pkg/inner.py": b"x"})
    assert "inside 'pkg', which is a file" in _refusal(path)


@pytest.mark.parametrize("build", [tar_gz, zip_file])
def test_too_many_entries_are_refused(tmp_path: Path, build: object) -> None:
    files = {f"f{i}.py": b"x" for i in range(6)}
    path = build(tmp_path / "code.bin", files)  # type: ignore[operator]
    assert "more than 5 entries" in _refusal(path, BundleLimits(max_files=5))
    assert len(inspect(path, BundleLimits(max_files=6)).files) == 6


def test_an_archive_over_max_bytes_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tar_gz(tmp_path / "code.tgz", {"big.bin": os.urandom(4096)})
    message = _refusal(path, BundleLimits(max_bytes=1000))
    assert "over the limit of 1000 bytes" in message


@pytest.mark.parametrize("build", [tar_gz, zip_file])
def test_unpacked_size_over_the_limit_is_refused(tmp_path: Path, build: object) -> None:
    path = build(tmp_path / "code.bin", {"a.bin": bytes(600), "b.bin": bytes(600)})  # type: ignore[operator]
    message = _refusal(path, BundleLimits(max_unpacked_bytes=1000))
    assert "'b.bin'" in message and "1000 bytes unpacked" in message


def test_an_empty_archive_is_refused(tmp_path: Path) -> None:
    assert "no files" in _refusal(tar_gz(tmp_path / "code.tgz", {}))


def test_a_truncated_archive_is_refused(tmp_path: Path) -> None:
    data = tar_gz(tmp_path / "code.tgz", {"big.bin": os.urandom(100_000)}).read_bytes()
    (tmp_path / "cut.tgz").write_bytes(data[: len(data) // 2])
    assert "corrupt" in _refusal(tmp_path / "cut.tgz")


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_a_bomb_is_stopped_while_unpacking_in_inspect(
    bombs: dict[str, Path], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """inspect reads at most the limit plus one chunk of the gigabyte before it refuses."""
    path = bombs[kind]
    assert path.stat().st_size < 5 * bundle.MiB
    decompressed = 0
    real_copy = bundle._copy

    class Spy:
        def __init__(self, stream: IO[bytes]) -> None:
            self.stream = stream

        def read(self, size: int = -1) -> bytes:
            nonlocal decompressed
            data = self.stream.read(size)
            decompressed += len(data)
            return data

    def spying_copy(stream: IO[bytes], *args: object) -> int:
        return real_copy(Spy(stream), *args)  # type: ignore[arg-type]

    monkeypatch.setattr(bundle, "_copy", spying_copy)
    assert "'zeros.bin'" in _refusal(path, BOMB_LIMITS)
    assert decompressed <= BOMB_LIMITS.max_unpacked_bytes + bundle.CHUNK


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_a_bomb_is_stopped_while_extracting(
    bombs: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    dest = tmp_path / "out"
    with pytest.raises(BundleError, match=r"zeros\.bin"):
        extract(bombs[kind], dest, BOMB_LIMITS)
    written = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    assert 0 < written <= BOMB_LIMITS.max_unpacked_bytes + bundle.CHUNK


def test_a_zip_header_that_lies_about_sizes_does_not_fool_the_count(tmp_path: Path) -> None:
    """Sizes come from the decompressor: a zip claiming a 10-byte file is refused as corrupt."""
    path = zip_file(tmp_path / "code.zip", {"zeros.bin": bytes(100_000)})
    data = bytearray(path.read_bytes())
    # Rewrite the uncompressed size in the local and central headers to 10 bytes.
    for marker, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = data.index(marker) + offset
        data[at : at + 4] = (10).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert "corrupt" in _refusal(path)


def test_a_bomb_names_its_entry_even_with_few_files_allowed(bombs: dict[str, Path]) -> None:
    """tar reads ahead of the entry being counted; the entry's own count still trips first."""
    limits = BundleLimits(max_files=1, max_unpacked_bytes=10 * bundle.MiB)
    assert "'zeros.bin'" in _refusal(bombs["tar.gz"], limits)


def test_tar_headers_are_counted_too(tmp_path: Path) -> None:
    """A 20 MB pax header (tar's own bytes, not a file's) is stopped by the stream count."""
    path = tmp_path / "header-bomb.tgz"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("small.py")
        info.pax_headers = {"comment": "x" * (20 * bundle.MiB)}
        tar.addfile(info, io.BytesIO(b""))
    message = _refusal(path, BundleLimits(max_files=5, max_unpacked_bytes=bundle.MiB))
    assert "unpacks to more than" in message

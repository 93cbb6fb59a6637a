"""Packing a directory: ignore rules, determinism, archives taken as they are."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from portalctl.packing import included_files, pack_directory, read_archive


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def names_in(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(tar.getnames())


def test_gitignore_and_portalignore_leave_files_out_and_git_always_stays_out(
    tmp_path: Path,
) -> None:
    root = tree(
        tmp_path,
        {
            "train.py": "print(1)\n",
            "lib/model.py": "",
            "lib/__pycache__/model.cpython-311.pyc": "",
            "data/big.bin": "x",
            "runs/a.ckpt": "",
            "keep.ckpt": "",
            ".git/HEAD": "ref",
            ".gitignore": "__pycache__/\ndata/\n*.ckpt\n",
            ".portalignore": "!keep.ckpt\nnotes.md\n",
            "notes.md": "",
        },
    )
    assert included_files(root) == [
        ".gitignore",
        ".portalignore",
        "keep.ckpt",
        "lib/model.py",
        "train.py",
    ]


def test_a_symlink_is_left_out(tmp_path: Path) -> None:
    root = tree(tmp_path / "code", {"train.py": ""})
    (tmp_path / "secret").write_text("s")
    (root / "link").symlink_to(tmp_path / "secret")
    assert included_files(root) == ["train.py"]


def test_the_archive_is_deterministic_and_holds_the_included_files(tmp_path: Path) -> None:
    root = tree(tmp_path, {"train.py": "print(1)\n", "pkg/util.py": "X = 1\n"})
    first = pack_directory(root)
    (root / "train.py").touch()  # a new mtime changes nothing
    second = pack_directory(root)
    assert first.sha256 == second.sha256 and first.data == second.data
    assert names_in(first.data) == ["pkg/util.py", "train.py"]
    (root / "train.py").write_text("print(2)\n")
    assert pack_directory(root).sha256 != first.sha256


def test_an_archive_is_read_as_is_and_other_files_are_refused(tmp_path: Path) -> None:
    archive = tmp_path / "code.tgz"
    archive.write_bytes(b"not really gzip")
    packed = read_archive(archive)
    assert packed.data == b"not really gzip" and len(packed.sha256) == 64
    (tmp_path / "train.py").write_text("")
    with pytest.raises(ValueError, match=r"not a \.tar\.gz"):
        read_archive(tmp_path / "train.py")
    with pytest.raises(NotADirectoryError):
        pack_directory(tmp_path / "train.py")

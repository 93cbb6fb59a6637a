"""Builders of test archives: good ones, hostile ones, bombs (shared by core and app tests)."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, cast

GOOD_FILES = {"train.py": b"print('training')\n", "pkg/model.py": b"LAYERS = 3\n"}


def tar_gz(
    path: Path, files: dict[str, bytes] | None = None, extra: Iterable[tarfile.TarInfo] = ()
) -> Path:
    """A .tar.gz at ``path`` with regular ``files`` and then the raw ``extra`` entries."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (GOOD_FILES if files is None else files).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return path


def tar_entry(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    """A data-less tar entry of type ``kind`` (``tarfile.SYMTYPE``, ``FIFOTYPE``, ...)."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


def zip_file(
    path: Path,
    files: dict[str, bytes] | None = None,
    modes: dict[str, int] | None = None,
) -> Path:
    """A .zip at ``path``; ``modes`` sets an entry's Unix mode (its type bits) in external_attr."""
    modes = modes or {}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in (GOOD_FILES if files is None else files).items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # Unix: external_attr's high half is st_mode
            info.external_attr = modes.get(name, stat.S_IFREG | 0o644) << 16
            archive.writestr(info, data)
    return path


def _zeros(total: int, chunk: int = 1 << 20) -> Iterable[bytes]:
    block = bytes(chunk)
    left = total
    while left > 0:
        yield block[: min(chunk, left)]
        left -= chunk


class _Zeros:
    """``total`` zero bytes, read as a stream (so a bomb is built without holding it)."""

    def __init__(self, total: int) -> None:
        self.left = total

    def read(self, size: int = -1) -> bytes:
        n = self.left if size < 0 else min(size, self.left)
        self.left -= n
        return bytes(n)


def tar_bomb(path: Path, total: int) -> Path:
    """A .tar.gz holding one file of ``total`` zero bytes (1 GB packs to about 1 MB)."""
    with tarfile.open(path, "w:gz", compresslevel=6) as tar:
        info = tarfile.TarInfo("zeros.bin")
        info.size = total
        tar.addfile(info, cast(IO[bytes], _Zeros(total)))
    return path


def zip_bomb(path: Path, total: int) -> Path:
    """A .zip holding one file of ``total`` zero bytes."""
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("zeros.bin", "w", force_zip64=True) as out,
    ):
        for block in _zeros(total):
            out.write(block)
    return path

"""What a bundle declares it needs: its top-level ``uv.lock``, ``requirements.txt`` or
``pyproject.toml`` (the first of them it has).

::

    archive (already accepted by workers.bundle.inspect)
       │
       ├─ the first of BUNDLE_FILES among its top-level files, if any
       │     read as a stream, at most MAX_FILE_BYTES + 1 bytes (nothing unpacked)
       │
       └─ workers.environment.bundle_requirements ──► normalised requirements
                                                   └► or a refusal naming the file

The file is read as text and parsed; nothing in the archive is executed (a
``pyproject.toml``'s build backend is the agent's business, in the job's
sandbox).  A ``uv.lock`` becomes one exact pin per package of an index; a
package locked from git, a path or a URL refuses the upload.  The rule is the one the agent applies when it builds the
environment, so an upload accepted here builds the same requirements there.
"""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

from bundles.errors import BundleRefusedError
from workers.bundle import BundleInfo
from workers.environment import BUNDLE_FILES, MAX_FILE_BYTES, bundle_requirements
from workers.program import ProgramError


def declared_requirements(local: Path, info: BundleInfo) -> tuple[str, ...]:
    """The requirements the archive at ``local`` declares (``()`` when it has no such file).

    ``info`` is what ``inspect`` found in it: only a file listed there is read.
    A file the rule refuses refuses the upload, with a message that starts
    with the file's name.
    """
    paths = {f.path for f in info.files}
    name = next((candidate for candidate in BUNDLE_FILES if candidate in paths), None)
    if name is None:
        return ()
    data = _read_member(local, info, name, MAX_FILE_BYTES + 1)
    try:
        return bundle_requirements({name: data})
    except ProgramError as exc:
        raise BundleRefusedError(f"{name}: {exc.message}") from None


def _read_member(local: Path, info: BundleInfo, name: str, limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file ``name`` of the archive."""
    if info.kind == "zip":
        with zipfile.ZipFile(local) as archive:
            for entry in archive.infolist():
                if not entry.is_dir() and _clean(entry.filename) == name:
                    with archive.open(entry) as stream:
                        return stream.read(limit)
    else:
        with tarfile.open(local, mode="r|gz") as tar:
            for member in tar:
                if member.isreg() and _clean(member.name) == name:
                    data = tar.extractfile(member)
                    assert data is not None  # a regular file always has a stream
                    return data.read(limit)
    # inspect listed it, so the archive changed under us or names it twice
    raise BundleRefusedError(f"{name}: cannot be read from the archive.")


def _clean(entry: str) -> str:
    """An entry's name as ``inspect`` lists it (``./requirements.txt`` → ``requirements.txt``)."""
    return "/".join(part for part in entry.split("/") if part not in ("", "."))

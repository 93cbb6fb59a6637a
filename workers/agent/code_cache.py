"""The node's cache of unpacked code bundles: each bundle unpacked once, read-only.

A job's workers run the tenant's program from ``<root>/<code_id>/``.  Many
workers of many jobs on one node may ask for the same bundle at once, so:

    ensure(code_id, code_path)
      ├─ <root>/<code_id>/ exists ──────────────────────────> return it
      └─ take <root>/<code_id>.lock (fcntl, between threads and processes)
           ├─ exists now (another caller won) ──────────────> return it
           ├─ download the archive from the store into root
           ├─ its sha256 must be code_id, else refuse
           ├─ extract into a scratch directory in root (read-only files)
           └─ rename the scratch directory to <root>/<code_id>/ (atomic)

The rename is the commit point: a directory named after its id is always
complete; what a crashed attempt leaves has a hidden scratch name and is never used.
"""

from __future__ import annotations

import fcntl
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workers.artifacts import ArtifactStore
from workers.bundle import BundleError, BundleLimits, extract, remove_tree, sha256_file

_CODE_ID = re.compile(r"^[0-9a-f]{64}$")


class CodeCache:
    """Unpacked bundles under ``root``, fetched from ``store`` and checked against ``limits``."""

    def __init__(self, root: Path, store: ArtifactStore, limits: BundleLimits | None = None):
        self.root = root
        self.store = store
        self.limits = limits or BundleLimits()

    def ensure(self, code_id: str, code_path: str) -> Path:
        """The directory holding bundle ``code_id`` (stored at ``code_path``), unpacked once.

        Raises ``BundleError`` if the stored archive is not the bundle ``code_id``
        or breaks the bundle rules; nothing is left in the cache then.
        """
        if not _CODE_ID.match(code_id):
            raise BundleError(f"{code_id!r} is not a bundle id (a sha256 in hex).")
        final = self.root / code_id
        if final.is_dir():
            os.utime(final)  # last used now: the node's cleaning keeps bundles in use
            return final
        self.root.mkdir(parents=True, exist_ok=True)
        with _locked(self.root / f".{code_id}.lock"):
            if not final.is_dir():
                self._unpack(code_id, code_path, final)
        return final

    def _unpack(self, code_id: str, code_path: str, final: Path) -> None:
        attempt = uuid.uuid4().hex
        archive = self.root / f".{code_id}.{attempt}.archive"
        scratch = self.root / f".{code_id}.{attempt}.tree"
        try:
            self.store.get_file(code_path, archive)
            actual = sha256_file(archive)
            if actual != code_id:
                raise BundleError(
                    f"The bundle at {code_path!r} does not match its id {code_id} "
                    f"(its sha256 is {actual})."
                )
            extract(archive, scratch, self.limits)
            scratch.rename(final)  # same directory: no write permission on scratch needed
        finally:
            archive.unlink(missing_ok=True)
            remove_tree(scratch)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (one open file each: threads exclude too)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

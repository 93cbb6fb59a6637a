"""Collecting what a program left in ``ARTIFACT_DIR`` into the artifact store when it ends.

A torchrun program knows nothing of the store: it writes files into
``ARTIFACT_DIR`` on its node, and when the job's last process on that node
exits (cleanly, or crashed: a failed run's outputs help find out why; not when
it was stopped) the agent uploads them to ``<job prefix>/artifacts/<relative
path>`` and reports each one (``ArtifactStored``, kind ``user``).  The
directory was written by tenant code, so nothing in it is trusted: only
regular files are taken (symbolic links, devices and FIFOs are skipped, and
no link is ever followed: the directory is walked and each file opened by
descriptors with ``O_NOFOLLOW``, its type checked on the open descriptor),
names must pass ``workers.outputs.check_job_path``, and ``CollectLimits``
bound how many files and bytes one node uploads.  The job's prefix in a
directory store is tenant-written as well: an upload that meets a link there
is refused by the store and skipped, with why.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from workers import beneath
from workers.agent.config import CollectLimits
from workers.artifacts import ArtifactStore, StoredObject, at_most
from workers.beneath import LinkRefused
from workers.outputs import OutputError, check_job_path
from workers.protocol import ArtifactStored

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Collected:
    """What one collection uploaded (job-relative paths) and what it left out, with why."""

    stored: tuple[tuple[str, StoredObject], ...]
    skipped: tuple[tuple[str, str], ...]


def collect(store: ArtifactStore, directory: Path, limits: CollectLimits) -> Collected:
    """Upload the regular files of ``directory`` to ``artifacts/...`` of the job's ``store``.

    A file is opened without following a link, by descriptors from
    ``directory``, and checked on the open descriptor to be the regular file
    of the size that was listed; in the store a link on the way (the program
    replaced its ``artifacts`` folder) refuses the upload.  Either skips the
    file, with why.
    """
    stored: list[tuple[str, StoredObject]] = []
    skipped: list[tuple[str, str]] = []
    total = 0
    if not directory.is_dir():
        return Collected((), ())
    with beneath.directory(str(directory)) as top:
        for rel, size in beneath.regular_files(top):
            job_path = f"artifacts/{rel}"
            try:
                check_job_path(job_path)
            except OutputError as exc:
                skipped.append((rel, str(exc)))
                continue
            if len(stored) >= limits.max_files:
                skipped.append((rel, f"more than {limits.max_files} files"))
                continue
            if total + size > limits.max_bytes:
                skipped.append((rel, f"over the {limits.max_bytes}-byte limit"))
                continue
            try:
                stored.append((job_path, _upload(store, job_path, top, rel, size)))
            except LinkRefused as exc:
                skipped.append((rel, f"refused: {exc}"))
                continue
            except OSError as exc:  # the file went away or the store refused it: skip, go on
                skipped.append((rel, f"could not upload: {exc}"))
                continue
            total += size
    for rel, why in skipped:
        log.warning("artifact %s not collected: %s", rel, why)
    return Collected(tuple(stored), tuple(skipped))


def _upload(store: ArtifactStore, job_path: str, top: int, rel: str, size: int) -> StoredObject:
    """Store the file ``rel`` below ``top`` if it is still the regular file of ``size`` bytes."""
    with os.fdopen(beneath.open_regular(top, rel.split("/")), "rb") as source:
        if os.fstat(source.fileno()).st_size != size:
            raise OSError(f"{rel} changed while it was collected")
        return store.put_stream(job_path, at_most(source, size))


def reports(node: str, job: str, collected: Collected) -> list[ArtifactStored]:
    """One ``ArtifactStored`` per uploaded file; its event id is the agent's own (node, path, hash)."""
    out = []
    for job_path, obj in collected.stored:
        digest = hashlib.sha256(f"{node}\0{job_path}\0{obj.sha256}".encode()).hexdigest()[:32]
        out.append(
            ArtifactStored(
                node=node,
                job=job,
                event_id=f"collect-{digest}",
                kind="user",
                path=job_path,
                size=obj.size,
                sha256=obj.sha256,
                name=job_path.removeprefix("artifacts/"),
            )
        )
    return out
